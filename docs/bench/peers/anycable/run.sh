#!/usr/bin/env bash
# Herald's Pusher endpoint (docs/bench/pusher.toml) beside AnyCable v1.6.16 in its Pusher mode
# (scripts/peers.sh start anycable), both driven as plain Pusher servers by herald-bench
# --pusher-app (signed trigger API), alternated, each fresh. README.md beside this has the results.
#   bcast: docs/bench/peers/kernel/run.sh with PEER=anycable (10,000 subscribers of one channel,
#          5 publications/s for 40 s; the server's utime and stime over 20 s of the window);
#   idle:  10,000 and 19,000 subscribed idle connections held 10 s: server RSS per connection.
# Needs target/release/herald, target/release/herald-bench and
# ANYCABLE_SRC=<checkout of v1.6.16> scripts/peers.sh build anycable.
set -u
cd "$(dirname "$0")/../../../.."
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers} HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/anycable}
B=target/release/herald-bench
PARTS=${PARTS:-bcast idle}
P="--pusher --pusher-app bench-app:bench-key:bench-secret --prefix bench"
run() { # name port servercmd scenario-args...
  local name=$1 port=$2 cmd=$3; shift 3
  { echo "# $name"; echo "# load: $(uptime)"; } > "$OUT/$name.txt"
  # shellcheck disable=SC2086
  timeout 300 docs/bench/prio.sh $B "$@" $P --ws "ws://127.0.0.1:$port/app/bench-key?protocol=7" \
    --api "http://127.0.0.1:$port" --json "$OUT/$name.json" --server-cmd "$cmd" >> "$OUT/$name.txt" 2>&1
  echo "# load after: $(uptime)" >> "$OUT/$name.txt"
  grep -E "^connect |^server  |^server RSS|^delivered|^events|^# load:" "$OUT/$name.txt"
  gzip -9 -n -f "$OUT/$name.json"
  sleep 5
}
H="target/release/herald serve --config docs/bench/pusher.toml --port"
A="scripts/peers.sh start anycable --port"
for part in $PARTS; do
  case $part in
    bcast) PEER=anycable OUT=$OUT ROUNDS=${ROUNDS:-"1 2"} docs/bench/peers/kernel/run.sh ;;
    idle)
      for n in 10000 19000; do
        k=$((n / 1000))k
        run idle$k-pusher-herald-1 18831 "$H 18831" idle -n $n -d 10 --source-base 127.0.154.2
        run idle$k-anycable-1 18832 "$A 18832" idle -n $n -d 10 --source-base 127.0.155.2
      done ;;
  esac
done
