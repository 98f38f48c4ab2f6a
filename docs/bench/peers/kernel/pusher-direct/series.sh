#!/usr/bin/env bash
# Pusher connections with and without the fan-out's direct writes, alternated in one series:
# docs/bench/peers/kernel/run.sh's measurement (one node, 10,000 subscribers of one channel,
# 5 publications/s, server utime/stime read 18 s and 38 s into the publishing window) with the
# server binary as a parameter. BEFORE and AFTER are herald binaries (release); SOCKUDO=1 adds
# one Sockudo run per round; HERALD_OWN=1 adds a round of Herald's own protocol (/ws) per binary.
# Usage: BEFORE=/tmp/herald-before AFTER=target/release/herald ROUNDS="1 2" series.sh
set -u
cd "$(dirname "$0")/../../../../.."
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers} HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/kernel/pusher-direct}
ROUNDS=${ROUNDS:-"1 2"}
BEFORE=${BEFORE:-/tmp/herald-before} AFTER=${AFTER:-target/release/herald}
TCK=$(getconf CLK_TCK)
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
one() { # name port source-base ws-path bench-flags... -- server command...
  local name=$1 port=$2 src=$3 path=$4; shift 4
  local flags=(); while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
  echo "# load before: $(uptime)" > "$OUT/$name.txt"
  "$@" >/tmp/kernel-$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    curl -sf "http://127.0.0.1:$port/up" >/dev/null 2>&1 && break
    sleep 0.1
  done
  timeout 120 target/release/herald-bench broadcast -n 10000 -r 5 -d 40 --source-base "$src" \
    --ws "ws://127.0.0.1:$port$path" --api "http://127.0.0.1:$port" "${flags[@]}" \
    >> "$OUT/$name.txt" 2>&1 &
  local bench=$!
  sleep 18; read -r u0 s0 < <(ticks $pid)
  sleep 20; read -r u1 s1 < <(ticks $pid)
  wait $bench
  kill $pid; wait $pid 2>/dev/null
  { echo "# load: $(uptime)"
    echo "server CPU over 20 s of the window: user $(( (u1-u0)*1000/TCK )) ms, system $(( (s1-s0)*1000/TCK )) ms (CLK_TCK $TCK)"
  } >> "$OUT/$name.txt"
  echo "== $name"; grep -E "^delivered|^delivery latency|^server CPU|^# load:" "$OUT/$name.txt"
  sleep 3
}
P="--pusher --pusher-app bench-app:bench-key:bench-secret --prefix bench"
for i in $ROUNDS; do
  for which in before after; do
    bin=$BEFORE; [ $which = after ] && bin=$AFTER
    # shellcheck disable=SC2086
    one "pusher-$which-$i" 18903 127.0.183.2 "/app/bench-key?protocol=7" $P -- \
      "$bin" serve --config docs/bench/pusher.toml --port 18903
  done
  if [ "${SOCKUDO:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    one "pusher-sockudo-$i" 18904 127.0.184.2 "/app/bench-key?protocol=7" $P -- \
      scripts/peers.sh start sockudo --port 18904
  fi
done
if [ "${HERALD_OWN:-0}" = 1 ]; then
  for which in before after; do
    bin=$BEFORE; [ $which = after ] && bin=$AFTER
    one "herald-$which-${OWN_ROUND:-1}" 18901 127.0.181.2 /ws -- \
      "$bin" serve --config docs/bench/bench.toml --port 18901
  done
fi
