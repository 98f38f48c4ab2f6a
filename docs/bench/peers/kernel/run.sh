#!/usr/bin/env bash
# Where a delivery's CPU goes: user space against the kernel. One node, 10,000 subscribers of one
# channel, 5 publications/s (50,000 deliveries/s), Herald and Centrifugo alternated, each fresh.
# The server's utime and stime (/proc/PID/stat) are read 15 s and 35 s into the 40 s publishing
# window, so the connect phase is left out; deliveries in that window ≈ 20 s × 50,000.
# Needs target/release/herald, target/release/herald-bench, scripts/peers.sh build centrifugo.
set -u
cd "$(dirname "$0")/../../../.."
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers} HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/kernel}
ROUNDS=${ROUNDS:-"1 2"}
# Publications/s to the one channel (RATE=1: 10,000 deliveries/s); a RATE other than 5 suffixes the
# file names with -r$RATE.
RATE=${RATE:-5}
SFX=$([ "$RATE" = 5 ] || echo "-r$RATE")
TCK=$(getconf CLK_TCK)
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
one() { # name port source-base ws-path bench-flags... -- server command...
  local name=$1 port=$2 src=$3 path=$4; shift 4
  local flags=(); while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
  "$@" >/tmp/kernel-$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    curl -sf "http://127.0.0.1:$port/up" >/dev/null 2>&1 && break
    sleep 0.1
  done
  timeout 120 target/release/herald-bench broadcast -n 10000 -r "$RATE" -d 40 --source-base "$src" \
    --ws "ws://127.0.0.1:$port$path" --api "http://127.0.0.1:$port" "${flags[@]}" \
    > "$OUT/$name.txt" 2>&1 &
  local bench=$!
  # The 40 s window starts once all are subscribed (about 1-3 s after the start).
  sleep 18; read -r u0 s0 < <(ticks $pid)
  sleep 20; read -r u1 s1 < <(ticks $pid)
  wait $bench
  kill $pid; wait $pid 2>/dev/null
  { echo "# load: $(uptime)"
    echo "server CPU over 20 s of the window: user $(( (u1-u0)*1000/TCK )) ms, system $(( (s1-s0)*1000/TCK )) ms (CLK_TCK $TCK)"
  } >> "$OUT/$name.txt"
  grep -E "^delivered|^delivery latency|^server CPU|^machine" "$OUT/$name.txt"
  sleep 3
}
# PEER=centrifugo (Herald's own protocol beside Centrifugo's) or PEER=sockudo (both as Pusher
# servers: Herald's Pusher endpoint with docs/bench/pusher.toml, the signed trigger API), or
# PEER=socketio (Herald's own protocol beside Socket.IO 4.8.4 behind scripts/peers/socketio-server.mjs,
# herald-bench --socketio; scripts/peers.sh build socketio; the runs' --json beside their .txt),
# or PEER=anycable (both as plain Pusher servers, as for Sockudo: AnyCable v1.6.16's Pusher mode).
PEER=${PEER:-centrifugo}
P="--pusher --pusher-app bench-app:bench-key:bench-secret --prefix bench"
for i in $ROUNDS; do
  if [ "$PEER" = socketio ]; then
    one "herald$SFX-$i" 18905 127.0.186.2 /ws --json "$OUT/herald$SFX-$i.json" -- \
      target/release/herald serve --config docs/bench/bench.toml --port 18905
    one "socketio$SFX-$i" 18906 127.0.187.2 "/socket.io/?EIO=4&transport=websocket" --socketio \
      --json "$OUT/socketio$SFX-$i.json" -- scripts/peers.sh start socketio --port 18906
  elif [ "$PEER" = anycable ]; then
    # Both as plain Pusher servers, as for Sockudo: AnyCable v1.6.16 in its Pusher mode.
    # shellcheck disable=SC2086
    one "pusher-herald$SFX-$i" 18907 127.0.188.2 "/app/bench-key?protocol=7" $P \
      --json "$OUT/pusher-herald$SFX-$i.json" -- \
      target/release/herald serve --config docs/bench/pusher.toml --port 18907
    # shellcheck disable=SC2086
    one "anycable$SFX-$i" 18908 127.0.189.2 "/app/bench-key?protocol=7" $P \
      --json "$OUT/anycable$SFX-$i.json" -- scripts/peers.sh start anycable --port 18908
  elif [ "$PEER" = sockudo ]; then
    # shellcheck disable=SC2086
    one "pusher-herald-$i" 18903 127.0.183.2 "/app/bench-key?protocol=7" $P -- \
      target/release/herald serve --config docs/bench/pusher.toml --port 18903
    # Sockudo answers /up, not /health: wait on its port instead.
    # shellcheck disable=SC2086
    one "pusher-sockudo-$i" 18904 127.0.184.2 "/app/bench-key?protocol=7" $P -- \
      scripts/peers.sh start sockudo --port 18904
  else
    one "herald-$i" 18901 127.0.181.2 /ws -- \
      target/release/herald serve --config docs/bench/bench.toml --port 18901
    one "centrifugo-$i" 18902 127.0.182.2 /connection/websocket --centrifugo -- \
      scripts/peers.sh start centrifugo --port 18902
  fi
done
