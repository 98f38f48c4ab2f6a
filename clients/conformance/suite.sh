#!/usr/bin/env bash
# The whole conformance suite for one SDK's adapter, in both setups at once: one node (in memory)
# and three nodes on one Redis (driver --nodes 3; every reconnect lands on another node). The runs
# mostly wait on timers, so running them side by side halves the time without crowding the CPU.
#   bash clients/conformance/suite.sh "<adapter command>" [driver options, e.g. --herald PATH]
# The adapter command runs in clients/conformance/. Needs node 18+ and, for the three-node run,
# redis-server. Prints each run's output in turn; exits non-zero when either run fails.
set -euo pipefail
cd "$(dirname "$0")"
adapter=${1:?usage: suite.sh "<adapter command>" [driver options]}
shift
command -v redis-server >/dev/null || { echo "suite.sh: redis-server is needed for the three-node run (apt-get install redis-server)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
node driver/driver.mjs --adapter "$adapter" --nodes 1 "$@" >"$out/one" 2>&1 &
one=$!
node driver/driver.mjs --adapter "$adapter" --nodes 3 "$@" >"$out/three" 2>&1 &
three=$!
status=0
wait "$one" || status=1
wait "$three" || status=1
echo "== one node"
cat "$out/one"
echo "== three nodes on Redis"
cat "$out/three"
echo "conformance, both setups: $(($(date +%s) - start)) s"
exit "$status"
