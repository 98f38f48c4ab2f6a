#!/usr/bin/env bash
# Broker load of the Redis broker, measured with `herald-bench rooms`: for 1, 2 and 4 Herald nodes
# sharing one Redis, rooms of 12 members spread over S of the nodes, how many broker messages the
# nodes receive per publication (from each node's herald_broker_messages_received_total), against
# the ideal (the nodes hosting the room) and against the P × N a pattern-subscription design costs.
#
# Usage: crates/broker-redis/bench/rooms.sh [out_dir]
#   HERALD_BIN / HERALD_BENCH_BIN: binaries to use (default: build release ones)
#   ROOMS_CONNECTIONS (600), ROOMS_RATE (100 publications/s), ROOMS_DURATION (10 s)
# Needs redis-server (apt-get install redis-server). Prints a Markdown table; raw JSON in out_dir.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:-$root/target/redis-rooms}"
mkdir -p "$out"
connections="${ROOMS_CONNECTIONS:-600}"
rate="${ROOMS_RATE:-100}"
duration="${ROOMS_DURATION:-10}"
key=benchkey

if [[ -z "${HERALD_BIN:-}" || -z "${HERALD_BENCH_BIN:-}" ]]; then
  (cd "$root" && cargo build --release -p herald-server -p herald-bench >&2)
  target="${CARGO_TARGET_DIR:-$root/target}"
  HERALD_BIN="${HERALD_BIN:-$target/release/herald}"
  HERALD_BENCH_BIN="${HERALD_BENCH_BIN:-$target/release/herald-bench}"
fi
command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install redis-server" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; pids=(); }
trap cleanup EXIT

echo "| nodes N | room spread S | publications P | broker messages received | per publication | ideal (nodes hosting the room) | pattern design P × N | saved vs pattern |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for run in "1 1" "2 1" "2 2" "4 1" "4 2" "4 4"; do
  read -r n spread <<<"$run"
  rport=$(free_port)
  rdir=$(mktemp -d)
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$rdir" --logfile redis.log &
  pids+=($!)
  until redis-cli -p "$rport" ping >/dev/null 2>&1; do sleep 0.05; done
  ws=(); api=()
  for i in $(seq 0 $((n - 1))); do
    port=$(free_port)
    HERALD_BROKER_URL="redis://127.0.0.1:$rport" HERALD_NODE_NAME="n$i" HERALD_API_KEY=$key RUST_LOG=warn \
      "$HERALD_BIN" serve --dev --port "$port" >"$out/node-$n-$spread-$i.log" 2>&1 &
    pids+=($!)
    ws+=(--ws "ws://127.0.0.1:$port/ws"); api+=(--api "http://127.0.0.1:$port")
    until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do sleep 0.05; done
  done
  "$HERALD_BENCH_BIN" rooms "${ws[@]}" "${api[@]}" --api-key $key -n "$connections" --room-size 12 \
    --room-spread "$spread" -r "$rate" -d "$duration" --drain 2 \
    --broker-metric herald_broker_messages_received_total \
    --json "$out/rooms-n$n-s$spread.json" >"$out/rooms-n$n-s$spread.txt" 2>"$out/rooms-n$n-s$spread.err"
  numpat=$(redis-cli -p "$rport" pubsub numpat)
  [[ "$numpat" == 0 ]] || { echo "PUBSUB NUMPAT is $numpat" >&2; exit 1; }
  awk -v n="$n" -v s="$spread" '
    /^publish / { for (i = 1; i <= NF; i++) if ($(i) == "ok,") p = $(i - 1) }
    /^broker messages/ { recv += $6; ideal += $9 }
    END {
      printf "| %d | %d | %d | %d | %.2f | %.2f | %d | %.0f %% |\n", n, s, p, recv, recv / p, ideal / p, p * n, 100 * (1 - recv / (p * n))
    }' "$out/rooms-n$n-s$spread.txt"
  cleanup
  rm -rf "$rdir"
done
