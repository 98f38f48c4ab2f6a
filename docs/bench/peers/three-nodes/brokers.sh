#!/usr/bin/env bash
# Herald's chat-like fan-in on three nodes through each broker: one redis-server, a Redis Cluster
# of three masters (no replicas) and one nats-server -js, alternated in one series, each broker
# fresh per run. 10,000 channels × 5 subscribers (50,000 connections, 16,667 per node),
# publications round-robin over the channels and the three APIs, RATE per second for 20 s.
# herald-bench samples the broker's processes over the same window as the nodes (`--broker-pid`:
# the "broker CPU" line, nodes and broker together per 1,000 deliveries/s); the brokers' CPU time
# over the whole run (connect included) is appended to each .txt too, and on the single Redis its
# INFO commandstats (calls and time per command).
# SERVERS="herald centrifugo" runs Centrifugo beside Herald on the same broker, fresh per run:
# its Redis engine on the single Redis and on the Cluster (`cluster_address`), its NATS broker on
# NATS, which keeps no history (Centrifugo: "NATS broker does not support history, recovery or
# cache"), so there Centrifugo carries less than Herald, whose history lives in JetStream.
# HERALD_CONFIG picks Herald's configuration (default docs/bench/bench.toml, history of 1000);
# docs/bench/bench-nohistory.toml keeps none, like Centrifugo on NATS, for an equal-work pair
# (Herald still numbers publications, so herald-bench checks its offsets as usual).
# Needs target/release/herald, target/release/herald-bench, redis-server, nats-server, and for
# Centrifugo scripts/peers.sh build centrifugo.
set -u
cd "$(dirname "$0")/../../../.."
export HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/three-nodes}
B=target/release/herald-bench
HERALD=${HERALD:-target/release/herald}
ROUNDS=${ROUNDS:-1}
RATE=${RATE:-2000}
BROKERS=${BROKERS:-"redis cluster nats"}
SERVERS=${SERVERS:-herald}
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers}
NAME=${NAME:-fanin10k-3n-r$RATE}
CPORTS="18861 18862 18863" NPORT=18864 RPORT=18860
WORK=$(mktemp -d /tmp/herald-3n-brokers.XXXXXX)
cpu_s() { local t=0 p; for p in "$@"; do t=$((t + $(ps -o cputimes= -p "$p"))); done; echo $t; }
up() { # broker → prints the URL; sets PIDS
  PIDS=()
  case $1 in
    redis)
      redis-server --port $RPORT --save '' --appendonly no > "$WORK/redis.log" 2>&1 &
      PIDS=($!); sleep 0.5; echo "redis://127.0.0.1:$RPORT" ;;
    cluster)
      local p
      for p in $CPORTS; do
        mkdir -p "$WORK/$p"
        (cd "$WORK/$p" && exec redis-server --port $p --cluster-enabled yes \
          --cluster-config-file nodes.conf --save '' --appendonly no > log 2>&1) &
        PIDS+=($!)
      done
      sleep 1
      yes yes | redis-cli --cluster create $(for p in $CPORTS; do printf '127.0.0.1:%s ' $p; done) \
        --cluster-replicas 0 > /dev/null 2>&1
      for _ in $(seq 60); do redis-cli -p 18861 CLUSTER INFO | grep -q cluster_state:ok && break; sleep 0.5; done
      sleep 2
      echo "redis+cluster://127.0.0.1:18861,127.0.0.1:18862,127.0.0.1:18863" ;;
    nats)
      rm -rf "$WORK/js"
      nats-server -a 127.0.0.1 -p $NPORT -js -sd "$WORK/js" > "$WORK/nats.log" 2>&1 &
      PIDS=($!); sleep 1; echo "nats://127.0.0.1:$NPORT" ;;
  esac
}
H="$HERALD serve --config ${HERALD_CONFIG:-docs/bench/bench.toml} --port"
C="scripts/peers.sh start centrifugo --port"
for i in $ROUNDS; do
  for broker in $BROKERS; do
  for server in $SERVERS; do
    up "$broker" > "$WORK/url"
    url=$(cat "$WORK/url")
    name="$NAME-$broker-$server-$i"
    c0=$(cpu_s "${PIDS[@]}")
    { echo "# $name ($url)"; echo "# load: $(uptime)"; } > "$OUT/$name.txt"
    args=()
    if [ "$server" = herald ]; then
      for p in 18851 18852 18853; do args+=(--ws "ws://127.0.0.1:$p/ws" --api "http://127.0.0.1:$p"); done
      args+=(--source-base 127.0.163.2 --server-cmd "$H 18851" --server-cmd "$H 18852" --server-cmd "$H 18853")
    else
      for p in 18851 18852 18853; do
        args+=(--ws "ws://127.0.0.1:$p/connection/websocket" --api "http://127.0.0.1:$p")
      done
      args+=(--centrifugo --source-base 127.0.164.2 --server-cmd "$C 18851" --server-cmd "$C 18852" --server-cmd "$C 18853")
    fi
    case $broker in
      redis) export PEERS_CENTRIFUGO_REDIS=$url ;;
      cluster) export PEERS_CENTRIFUGO_REDIS_CLUSTER=127.0.0.1:18861,127.0.0.1:18862,127.0.0.1:18863 ;;
      nats) export PEERS_CENTRIFUGO_NATS=$url; [ "$server" = centrifugo ] && args+=(--no-history) ;;
    esac
    for pid in "${PIDS[@]}"; do args+=(--broker-pid "$pid"); done
    HERALD_BROKER_URL=$url timeout 300 docs/bench/prio.sh $B broadcast -n 50000 -c 10000 -r "$RATE" -d 20 \
      "${args[@]}" --json "$OUT/$name.json" >> "$OUT/$name.txt" 2>&1
    unset PEERS_CENTRIFUGO_REDIS PEERS_CENTRIFUGO_REDIS_CLUSTER PEERS_CENTRIFUGO_NATS
    echo "$broker CPU over the run (all its processes): $(( $(cpu_s "${PIDS[@]}") - c0 )) s" >> "$OUT/$name.txt"
    # Where Redis's time went, command by command (calls, µs per call), over the whole run.
    if [ "$broker" = redis ]; then
      redis-cli -p $RPORT INFO commandstats | tr -d '\r' | grep '^cmdstat_' \
        | sed 's/^/redis commandstats: /' >> "$OUT/$name.txt"
    fi
    gzip -f "$OUT/$name.json"
    kill "${PIDS[@]}" 2>/dev/null; wait "${PIDS[@]}" 2>/dev/null
    rm -rf "${WORK:?}"/1886* "$WORK/js"
    sleep 3
  done
  done
done
rm -rf "$WORK"
