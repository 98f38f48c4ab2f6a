#!/usr/bin/env bash
# Cargo's runner for each test binary in scripts/test.sh (CARGO_TARGET_<triple>_RUNNER): runs it
# under a time limit so one stuck test cannot hang CI. On a timeout it says which binary it
# stopped; libtest has already named the tests still running ("has been running for over 60
# seconds"). `timeout` signals its whole process group, so the binary's servers (herald nodes,
# Redis, NATS, PostgreSQL, Kafka) stop with it.
#   HERALD_TEST_BINARY_TIMEOUT_S  seconds one test binary may run (default 600)
set -uo pipefail
limit="${HERALD_TEST_BINARY_TIMEOUT_S:-600}"
timeout --kill-after=20 "$limit" "$@"
status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "== TIMEOUT: test binary $(basename "$1") ran past ${limit}s and was stopped;" \
    "the tests it was still running are the ones reported above as" \
    "'has been running for over 60 seconds'" >&2
fi
exit "$status"
