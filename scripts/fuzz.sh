#!/usr/bin/env bash
# The fuzz harnesses, each for a bounded time: property-based (proptest) on the stable toolchain,
# random and edited inputs with the seeds written in each harness. `cargo test` runs every harness
# with 256 cases (the short pass CI makes); this runs them with up to PROPTEST_CASES cases each,
# stopping each after SECONDS_PER_TARGET seconds (default 60). A failure prints the minimal input
# and proptest records its seed under the crate's `proptest-regressions/` (commit that file: the
# case is then replayed first on every run).
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
per_target="${1:-60}"
export PROPTEST_CASES="${PROPTEST_CASES:-100000000}"

targets=(
  "herald-protocol --test fuzz"                       # client protocol parser
  "herald-core --lib auth::tests::fuzz"               # JWT parsing and verification
  "herald-broker-redis --lib codec::tests::fuzz"      # Redis pub/sub message codec
  "herald-broker-nats --lib codec::tests::fuzz"       # NATS message and stream codec
  "herald-server --lib uni::event_id::tests::fuzz"    # SSE Last-Event-ID
  "herald-server --test fuzz_api"                     # HTTP API bodies, real binary
  "herald-server --test fuzz_pusher"                  # Pusher client frames, real binary
  "herald-core --lib proxy::tests::fuzz"              # proxy hook answers
)

cargo test --workspace --no-run --quiet || exit 1
failed=0
for t in "${targets[@]}"; do
  echo "== fuzz $t (${per_target}s)"
  # shellcheck disable=SC2086
  timeout "$per_target" cargo test --quiet -p $t -- --test-threads=2
  rc=$?
  case $rc in
    0) echo "   all cases passed" ;;
    124) echo "   no failure in ${per_target}s" ;;
    *) echo "   FAILED (exit $rc)"; failed=1 ;;
  esac
done
exit "$failed"
