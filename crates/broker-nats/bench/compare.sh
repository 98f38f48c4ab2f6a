#!/usr/bin/env bash
# NATS beside Redis, in one run: the same Herald nodes, bench parameters and machine, only the
# broker differs. For every case the two brokers run back to back (order alternating per case).
#
#   rooms      rooms of 12 spread over S of N nodes: broker messages each node receives per
#              publication (herald_broker_messages_received_total) vs. the ideal, and latency
#   broadcast  one channel, subscribers spread over 2 nodes: latency at a fixed publication rate
#   hot        one channel, 3 nodes, rising publication rates through one node's API: whether
#              publishing one channel keeps up (NATS numbers a channel's stores one JetStream round
#              trip at a time; publications queued meanwhile are stored together)
#
# Usage: crates/broker-nats/bench/compare.sh [out_dir]    (run it under docs/bench/prio.sh)
#   HERALD_BIN / HERALD_BENCH_BIN: binaries (default: build release ones)
#   ROOMS_CONNECTIONS (600), ROOMS_RATE (100/s), DURATION (15 s), BROADCAST_CONNECTIONS (2000),
#   BROADCAST_RATE (20/s), HOT_RATES ("1000 2000 4000")
# Needs nats-server (≥ 2.9, JetStream) and redis-server. Prints Markdown tables; raw JSON in out_dir.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:-$root/target/nats-compare}"
mkdir -p "$out"
connections="${ROOMS_CONNECTIONS:-600}"
rate="${ROOMS_RATE:-100}"
duration="${DURATION:-15}"
bc_connections="${BROADCAST_CONNECTIONS:-2000}"
bc_rate="${BROADCAST_RATE:-20}"
hot_rates="${HOT_RATES:-1000 2000 4000}"
key=benchkey

if [[ -z "${HERALD_BIN:-}" || -z "${HERALD_BENCH_BIN:-}" ]]; then
  (cd "$root" && cargo build --release -p herald-server -p herald-bench >&2)
  target="${CARGO_TARGET_DIR:-$root/target}"
  HERALD_BIN="${HERALD_BIN:-$target/release/herald}"
  HERALD_BENCH_BIN="${HERALD_BENCH_BIN:-$target/release/herald-bench}"
fi
for b in nats-server redis-server; do
  command -v $b >/dev/null || { echo "$b missing: apt-get install $b" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap cleanup EXIT

# start_broker redis|nats → sets $url
start_broker() {
  local port dir
  port=$(free_port); dir=$(mktemp -d)
  if [[ $1 == redis ]]; then
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --logfile redis.log &
    pids+=($!)
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
    url="redis://127.0.0.1:$port"
  else
    local mport; mport=$(free_port)
    nats-server -js -a 127.0.0.1 -p "$port" -m "$mport" -sd "$dir" >"$dir/nats.log" 2>&1 &
    pids+=($!)
    until curl -fs "http://127.0.0.1:$mport/healthz" >/dev/null 2>&1; do sleep 0.05; done
    url="nats://127.0.0.1:$port"
  fi
}

# start_nodes N tag → sets ws/api arrays and server pid args
start_nodes() {
  ws=(); api=(); spids=()
  for i in $(seq 0 $(($1 - 1))); do
    local port; port=$(free_port)
    HERALD_BROKER_URL="$url" HERALD_NODE_NAME="n$i" HERALD_API_KEY=$key RUST_LOG=warn \
      "$HERALD_BIN" serve --dev --port "$port" >"$out/node-$2-$i.log" 2>&1 &
    pids+=($!); spids+=(--server-pid $!)
    ws+=(--ws "ws://127.0.0.1:$port/ws"); api+=(--api "http://127.0.0.1:$port")
    until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do sleep 0.05; done
  done
}

# figures file → "p50 p99 delivered% publish_errors"
figures() {
  awk '
    /^delivery latency/ { for (i = 1; i <= NF; i++) { if ($i ~ /^p50=/) p50 = substr($i, 5); if ($i ~ /^p99=/) p99 = substr($i, 5) } }
    /^delivered/ { d = $2 }
    /^publish / { for (i = 1; i <= NF; i++) if ($(i) == "errors") e = $(i - 1) }
    END { printf "%s %s %s %s", p50, p99, d, e }' "$1"
}

case_order() { if (( $1 % 2 )); then echo "nats redis"; else echo "redis nats"; fi; }

echo "### rooms: $connections connections (rooms of 12), $rate publications/s for $duration s"
echo
echo "| nodes N | spread S | broker | publications P | broker messages received | per publication | ideal | delivered | p50 | p99 |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
k=0
for run in "2 1" "2 2" "4 1" "4 2" "4 4"; do
  read -r n spread <<<"$run"
  k=$((k + 1))
  for broker in $(case_order $k); do
    start_broker "$broker"
    start_nodes "$n" "rooms-n$n-s$spread-$broker"
    f="$out/rooms-n$n-s$spread-$broker"
    "$HERALD_BENCH_BIN" rooms "${ws[@]}" "${api[@]}" "${spids[@]}" --api-key $key -n "$connections" \
      --room-size 12 --room-spread "$spread" -r "$rate" -d "$duration" --drain 2 \
      --broker-metric herald_broker_messages_received_total --prefix "r$k" \
      --json "$f.json" >"$f.txt" 2>"$f.err"
    read -r p50 p99 delivered errors <<<"$(figures "$f.txt")"
    awk -v n="$n" -v s="$spread" -v b="$broker" -v d="$delivered" -v p50="$p50" -v p99="$p99" '
      /^publish / { for (i = 1; i <= NF; i++) if ($(i) == "ok,") p = $(i - 1) }
      /^broker messages/ { recv += $6; ideal += $9 }
      END { printf "| %d | %d | %s | %d | %d | %.2f | %.2f | %s | %s ms | %s ms |\n", n, s, b, p, recv, recv / p, ideal / p, d, p50, p99 }' "$f.txt"
    cleanup
  done
done

echo
echo "### broadcast: $bc_connections subscribers of one channel on 2 nodes, $bc_rate publications/s for $duration s"
echo
echo "| broker | deliveries/s | delivered | p50 | p99 | publish errors |"
echo "| --- | --- | --- | --- | --- | --- |"
for broker in $(case_order 1); do
  start_broker "$broker"
  start_nodes 2 "broadcast-$broker"
  f="$out/broadcast-$broker"
  "$HERALD_BENCH_BIN" broadcast "${ws[@]}" "${api[@]}" "${spids[@]}" --api-key $key -n "$bc_connections" -c 1 \
    -r "$bc_rate" -d "$duration" --drain 2 --prefix b \
    --json "$f.json" >"$f.txt" 2>"$f.err"
  read -r p50 p99 delivered errors <<<"$(figures "$f.txt")"
  dps=$(awk '/^deliveries\/s/ { print $2 }' "$f.txt")
  echo "| $broker | $dps | $delivered | $p50 ms | $p99 ms | $errors |"
  cleanup
done

echo
echo "### hot channel: 30 subscribers of one channel on 3 nodes, published through the channel's home node, $duration s per rate"
echo
echo "| rate /s | broker | delivered | p50 | p99 | publish errors |"
echo "| --- | --- | --- | --- | --- | --- |"
k=0
for r in $hot_rates; do
  k=$((k + 1))
  for broker in $(case_order $k); do
    start_broker "$broker"
    start_nodes 3 "hot-$r-$broker"
    f="$out/hot-$r-$broker"
    "$HERALD_BENCH_BIN" broadcast "${ws[@]}" "${api[@]}" "${spids[@]}" --api-key $key -n 30 -c 1 \
      -r "$r" -d "$duration" --drain 2 --publish-connections 32 --prefix h \
      --json "$f.json" >"$f.txt" 2>"$f.err"
    read -r p50 p99 delivered errors <<<"$(figures "$f.txt")"
    echo "| $r | $broker | $delivered | $p50 ms | $p99 ms | $errors |"
    cleanup
  done
done
