#!/usr/bin/env bash
# Herald (its own protocol, docs/bench/bench.toml) beside Socket.IO 4.8.4 (one Node process behind
# scripts/peers/socketio-server.mjs, herald-bench --socketio), alternated, each server fresh
# (started by the rig with --server-cmd). docs/bench/peers/socketio/README.md has the results.
#   idle:  10,000 and 19,000 subscribed idle connections held 10 s: server RSS per connection;
#   ping:  100 Socket.IO connections held 60 s: Engine.IO pings every 25 s, answered (the server
#          closes a connection whose pong is 20 s late, so 60 s sees that they are accepted);
#   bcast: docs/bench/peers/kernel/run.sh with PEER=socketio (10,000 subscribers of one channel,
#          5 publications/s for 40 s, the server's utime and stime over 20 s of the window);
#          RATE=1 PARTS=bcast: 1 publication/s (10,000 deliveries/s), files *-r1-N.
# ROUNDS (default "1 2") sets the bcast pairs, each Herald then Socket.IO.
# Needs target/release/herald, target/release/herald-bench and scripts/peers.sh build socketio.
set -u
cd "$(dirname "$0")/../../../.."
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers} HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/socketio}
B=target/release/herald-bench
PARTS=${PARTS:-idle ping bcast}
SIO="/socket.io/?EIO=4&transport=websocket"
run() { # name port servercmd ws-path extra-flags scenario-args...
  local name=$1 port=$2 cmd=$3 path=$4 flags=$5; shift 5
  { echo "# $name"; echo "# load: $(uptime)"; } > "$OUT/$name.txt"
  # shellcheck disable=SC2086
  timeout 300 docs/bench/prio.sh $B "$@" $flags --ws "ws://127.0.0.1:$port$path" \
    --api "http://127.0.0.1:$port" --json "$OUT/$name.json" --server-cmd "$cmd" >> "$OUT/$name.txt" 2>&1
  echo "# load after: $(uptime)" >> "$OUT/$name.txt"
  grep -E "^connect |^server  |^server RSS|^delivered|^events|^# load:" "$OUT/$name.txt"
  gzip -9 -n -f "$OUT/$name.json"
  sleep 5
}
H="target/release/herald serve --config docs/bench/bench.toml --port"
S="scripts/peers.sh start socketio --port"
for part in $PARTS; do
  case $part in
    idle)
      for n in 10000 19000; do
        k=$((n / 1000))k
        run idle$k-herald-1 18821 "$H 18821" /ws "" idle -n $n -d 10 --source-base 127.0.151.2
        run idle$k-socketio-1 18822 "$S 18822" "$SIO" --socketio idle -n $n -d 10 --source-base 127.0.152.2
      done ;;
    ping)
      run ping100-socketio 18823 "$S 18823" "$SIO" --socketio idle -n 100 -d 60 --source-base 127.0.153.2 ;;
    bcast)
      PEER=socketio OUT=$OUT ROUNDS=${ROUNDS:-"1 2"} docs/bench/peers/kernel/run.sh ;;
  esac
done
