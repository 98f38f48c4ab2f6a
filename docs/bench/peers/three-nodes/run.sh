#!/usr/bin/env bash
# Three nodes on one Redis, Herald beside Centrifugo (its Redis engine) or Socket.IO (three Node processes, its Redis adapter: SERVERS="herald socketio"): 10,000 subscribers of one
# channel spread over the three nodes, publications round-robin over the nodes' APIs, 5/s
# (50,000 deliveries/s), alternated, each server and Redis fresh. Node CPU is summed over the
# three processes by herald-bench; Redis's own CPU time over the whole run (connect included) is
# appended to each run's .txt.
# Needs HERALD (a release herald), target/release/herald-bench, scripts/peers.sh build centrifugo.
set -u
cd "$(dirname "$0")/../../../.."
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers} HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/three-nodes}
B=target/release/herald-bench
HERALD=${HERALD:-target/release/herald}
ROUNDS=${ROUNDS:-"1 2"}
# Publications per second to the one channel: 5 (50,000 deliveries/s) or 10 (100,000/s, runs
# named …-r10-…).
RATE=${RATE:-5}
[ "$RATE" = 5 ] && SUF="" || SUF="-r$RATE"
# The chat-like fan-in: N=50000 CHANNELS=10000 (5 subscribers each) RATE=2000 NAME=fanin10k-3n-r2000
N=${N:-10000} CHANNELS=${CHANNELS:-1}
NAME=${NAME:-bcast10k-3n$SUF}
# The reconnect storm: SCENARIO=storm N=19000 RATE=2 NAME=storm19k-3n
SCENARIO=${SCENARIO:-broadcast}
RPORT=18850
redis_up() {
  redis-server --port $RPORT --save '' --appendonly no --daemonize yes \
    --pidfile /tmp/herald-3n-redis.pid --logfile /tmp/herald-3n-redis.log
  for _ in $(seq 50); do redis-cli -p $RPORT ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "redis did not start" >&2; exit 1
}
redis_down() { redis-cli -p $RPORT shutdown nosave >/dev/null 2>&1; sleep 1; }
run() { # name source-base ws-path servers...
  name=$1 src=$2 path=$3; shift 3
  local args=() p
  for p in 18851 18852 18853; do
    args+=(--ws "ws://127.0.0.1:$p$path" --api "http://127.0.0.1:$p")
  done
  redis_up
  local rpid r0; rpid=$(cat /tmp/herald-3n-redis.pid); r0=$(ps -o cputimes= -p "$rpid")
  { echo "# $name"; echo "# load: $(uptime)"; } > "$OUT/$name.txt"
  timeout 300 docs/bench/prio.sh $B "$SCENARIO" --broker-pid "$rpid" -n "$N" -c "$CHANNELS" -r "$RATE" -d 20 --source-base "$src" \
    "${args[@]}" "$@" --json "$OUT/$name.json" >> "$OUT/$name.txt" 2>&1
  echo "redis CPU over the run: $(( $(ps -o cputimes= -p "$rpid") - r0 )) s" >> "$OUT/$name.txt"
  gzip -f "$OUT/$name.json"
  redis_down
  sleep 3
}
H="$HERALD serve --config docs/bench/bench.toml --port"
C="scripts/peers.sh start centrifugo --port"
S="scripts/peers.sh start socketio --port"
SIO_PATH='/socket.io/?EIO=4&transport=websocket'
# SERVERS="herald" (or "centrifugo") runs one of the two, e.g. for a rate search.
SERVERS=${SERVERS:-"herald centrifugo"}
for i in $ROUNDS; do
  case " $SERVERS " in *" herald "*)
  HERALD_BROKER_URL=redis://127.0.0.1:$RPORT run "$NAME-herald-$i" 127.0.161.2 /ws \
    --server-cmd "$H 18851" --server-cmd "$H 18852" --server-cmd "$H 18853" ;;
  esac
  # SERVERS="herald socketio": three Node processes joined by Socket.IO's Redis adapter.
  case " $SERVERS " in *" socketio "*)
  PEERS_SOCKETIO_REDIS=redis://127.0.0.1:$RPORT run "$NAME-socketio-$i" 127.0.165.2 \
    "$SIO_PATH" --socketio \
    --server-cmd "$S 18851" --server-cmd "$S 18852" --server-cmd "$S 18853" ;;
  esac
  case " $SERVERS " in *" centrifugo "*)
  PEERS_CENTRIFUGO_REDIS=redis://127.0.0.1:$RPORT run "$NAME-centrifugo-$i" 127.0.162.2 \
    /connection/websocket --centrifugo \
    --server-cmd "$C 18851" --server-cmd "$C 18852" --server-cmd "$C 18853" ;;
  esac
done
