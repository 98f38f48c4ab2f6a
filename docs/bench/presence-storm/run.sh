#!/usr/bin/env bash
# The presence join storm (docs/benchmarks.md, "Presence join storm"): one redis-server, three
# Herald nodes on it with docs/bench/presence-storm.toml, and herald-presence-storm's members
# spread over them; every process through docs/bench/prio.sh. One JSON line per run on stdout.
#   HERALD=target/release/herald STORM=target/release/herald-presence-storm \
#     N=20000 SHARDS=4 docs/bench/presence-storm/run.sh
set -u
cd "$(dirname "$0")/../../.."
HERALD=${HERALD:-target/release/herald}
STORM=${STORM:-target/release/herald-presence-storm}
N=${N:-20000}
SHARDS=${SHARDS:-4}
PORT=${PORT:-18840}
PRIO=docs/bench/prio.sh
LOGS=${LOGS:-${TMPDIR:-/tmp}/presence-storm}
mkdir -p "$LOGS"
$PRIO redis-server --port "$PORT" --save '' --appendonly no --logfile "$LOGS/redis.log" &
redis=$!
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
nodes=()
for i in 1 2 3; do
  HERALD_API_KEY=benchkey HERALD_NODE_NAME=storm$i HERALD_BROKER_URL=redis://127.0.0.1:$PORT \
    $PRIO "$HERALD" serve --config docs/bench/presence-storm.toml --port $((PORT + i)) \
    >"$LOGS/node$i.log" 2>&1 &
  nodes+=($!)
done
for i in 1 2 3; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((PORT + i))/health" >/dev/null && break; sleep 0.2; done
done
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
timeout 1200 $PRIO "$STORM" -n "$N" --shards "$SHARDS" --redis-url "redis://127.0.0.1:$PORT" \
  --ws "ws://127.0.0.1:$((PORT + 1))/ws" --ws "ws://127.0.0.1:$((PORT + 2))/ws" \
  --ws "ws://127.0.0.1:$((PORT + 3))/ws"
status=$?
echo "nodes (pid rss_kb cpu_s):" >&2
for p in "${nodes[@]}"; do
  pid=$(pgrep -P "$p" herald || echo "$p")
  echo "  $pid $(ps -o rss= -p "$pid") $(ps -o times= -p "$pid")" >&2
done
kill "${nodes[@]}" 2>/dev/null
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1
wait
exit $status
