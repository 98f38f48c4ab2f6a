#!/usr/bin/env bash
# A storm of drains (docs/benchmarks.md, "drain"): 19,000 subscribers of one channel on a node
# with a Redis broker, 2 publications/s for 20 s; a third of the way in herald-bench sends the
# node SIGTERM (it tells every client to reconnect after a random `after_ms` in [0, drain_ms))
# and starts it again on the same port; the table's `drain` row is the time from the signal until
# 95% / 100% of the clients were back and re-subscribed with `since`.
#   docs/bench/drain/run.sh [DRAIN_MS…]      (default: 5000 2000)
#   SUFFIX=-2 docs/bench/drain/run.sh …       (file names drain-19k-<ms>ms<SUFFIX>, for repeats)
# Needs redis-server; it starts one on 127.0.0.1:18633 (no persistence) and stops it after.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/bench/drain
port=18631
redis-server --port 18633 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --pidfile /tmp/herald-drain-redis.pid --logfile /tmp/herald-drain-redis.log
trap 'kill "$(cat /tmp/herald-drain-redis.pid)" 2>/dev/null || true' EXIT
# Only this rig's sockets count (the node's port): other tests on the machine keep thousands of
# their own in TIME_WAIT on 127.0.0.1, which take none of our source ports.
settle() {
  while [ "$(ss -tan state time-wait "( sport = :$port or dport = :$port )" | wc -l)" -ge 500 ]; do
    sleep 2
  done
}
drains=("$@")
[ ${#drains[@]} -gt 0 ] || drains=(5000 2000)
for ms in "${drains[@]}"; do
  settle
  name="drain-19k-${ms}ms${SUFFIX:-}"
  echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  HERALD_BROKER_URL=redis://127.0.0.1:18633 HERALD_DRAIN_MS="$ms" \
    target/release/herald-bench drain -n 19000 -r 2 -d 20 --source-base 127.0.9.7 \
    --server-cmd "target/release/herald serve --config docs/bench/bench.toml --port $port" \
    --ws "ws://127.0.0.1:$port/ws" --api "http://127.0.0.1:$port" \
    --json "$out/$name.json" | tee "$out/$name.txt"
done
