#!/usr/bin/env bash
# The Python, Go and Kotlin SDKs' test scripts (each: its own unit and real-node tests, then the
# cross-SDK conformance suite on one node and on three nodes on Redis), run side by side: most of
# their time is the suite waiting on timers, so together they take about as long as the slowest.
#   bash scripts/sdk-tests.sh [python] [go] [kotlin]     (default: all three)
# HERALD_BIN as for each script. Prints each one's output in turn, with its time; exits non-zero
# when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
sdks=("$@")
[ ${#sdks[@]} -gt 0 ] || sdks=(python go kotlin)
out=$(mktemp -d)
trap 'rm -rf "$out"; kill $(jobs -p) 2>/dev/null' EXIT
declare -A pid started
for sdk in "${sdks[@]}"; do
  [ -f "clients/$sdk/test.sh" ] || { echo "sdk-tests: no clients/$sdk/test.sh" >&2; exit 2; }
  started[$sdk]=$(date +%s)
  (bash "clients/$sdk/test.sh" >"$out/$sdk.log" 2>&1; echo $? >"$out/$sdk.status"; date +%s >"$out/$sdk.end") &
  pid[$sdk]=$!
done
failed=()
for sdk in "${sdks[@]}"; do
  wait "${pid[$sdk]}"
  status=$(cat "$out/$sdk.status" 2>/dev/null || echo 1)
  secs=$(($(cat "$out/$sdk.end" 2>/dev/null || date +%s) - ${started[$sdk]}))
  echo "== $sdk SDK: exit $status, $secs s"
  cat "$out/$sdk.log"
  [ "$status" = 0 ] || failed+=("$sdk")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "sdk-tests: FAILED: ${failed[*]}"
  exit 1
fi
echo "sdk-tests: all passed (${sdks[*]})"
