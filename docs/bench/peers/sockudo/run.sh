#!/usr/bin/env bash
# Herald (its Pusher endpoint, docs/bench/pusher.toml) beside Sockudo 5.2.0 (scripts/peers.sh), both
# driven as plain Pusher servers by herald-bench --pusher-app (signed trigger API), alternated.
# Needs target/release/herald, target/release/herald-bench and scripts/peers.sh build sockudo.
cd "$(dirname "$0")/../../../.."
export PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers} HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/peers/sockudo}
B=target/release/herald-bench
common="--pusher --pusher-app bench-app:bench-key:bench-secret --prefix bench"
run() { # name port health servercmd scenario-args...
  name=$1 port=$2 health=$3 cmd=$4; shift 4
  { echo "# $name"; echo "# load: $(uptime)"; } > $OUT/$name.txt
  timeout 300 docs/bench/prio.sh $B "$@" $common --health-path $health \
    --ws "ws://127.0.0.1:$port/app/bench-key?protocol=7" --api http://127.0.0.1:$port \
    --json $OUT/$name.json --server-cmd "$cmd" >> $OUT/$name.txt 2>&1
  sleep 3
}
H="target/release/herald serve --config docs/bench/pusher.toml --port"
for i in 1 2; do
  run bcast10k-herald-$i 18811 /health "$H 18811" broadcast -n 10000 -r 5 -d 20 --source-base 127.0.141.2
  run bcast10k-sockudo-$i 18812 /up "scripts/peers.sh start sockudo --port 18812" broadcast -n 10000 -r 5 -d 20 --source-base 127.0.142.2
done
run idle10k-herald-1 18813 /health "$H 18813" idle -n 10000 -d 5 --source-base 127.0.143.2
run idle10k-sockudo-1 18814 /up "scripts/peers.sh start sockudo --port 18814" idle -n 10000 -d 5 --source-base 127.0.144.2
echo done > $OUT/DONE
