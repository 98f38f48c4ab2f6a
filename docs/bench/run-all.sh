#!/bin/sh
# Reruns every benchmark in docs/benchmarks.md. Each scenario is one herald-bench command; this
# script only adds the output file names. Run from the repository root after
#   cargo build --release -p herald-server -p herald-bench
# Results: docs/bench/<name>.txt (table), .json (parameters + raw results), .html and .svg (charts).
# Optional: ONLY="idle-10k storm-19k" to run a subset. Needs redis-server for the rooms run.
set -u
T=${CARGO_TARGET_DIR:-target}/release
B=$T/herald-bench
H="$T/herald serve --config docs/bench/bench.toml"
D=docs/bench
P=docs/bench/prio.sh

run() {
    name=$1; shift
    case " ${ONLY:-$name} " in *" $name "*) ;; *) return ;; esac
    echo "== $name: herald-bench $*" >&2
    $P $B "$@" --json $D/$name.json --report $D/$name.html --report $D/$name.svg > $D/$name.txt
}

run idle-10k      idle -n 10000 -d 10 --server-cmd "$H --port 8000"
run idle-19k      idle -n 19000 -d 10 --self-check --server-cmd "$H --port 8000"
run broadcast-50k broadcast -n 10000 -r 5 -d 30 --self-check --server-cmd "$H --port 8000"
run broadcast-150k broadcast -n 10000 -r 15 -d 30 --server-cmd "$H --port 8000"
run broadcast-300k broadcast -n 10000 -r 30 -d 30 --server-cmd "$H --port 8000"
run broadcast-1k-50k broadcast -n 1000 -r 50 -d 30 --server-cmd "$H --port 8000"
run jitter-10k    jitter -n 10000 -r 5 -d 60 --server-cmd "$H --port 8000"
run storm-19k     storm -n 19000 -r 2 -d 20 --self-check --server-cmd "$H --port 8000"
run storm-19k-spread2s storm -n 19000 -r 2 -d 20 --reconnect-jitter-ms 2000 --server-cmd "$H --port 8000"
run fanin-10k     fanin -n 10000 -r 1 -d 10 --server-cmd "$H --port 8000"
# --dev turns presence join/leave on in the default namespace: the cost of that at connect time.
run idle-dev-3k   idle -n 3000 -d 5 --server-cmd "$T/herald serve --dev --port 8000"
run idle-3k       idle -n 3000 -d 5 --server-cmd "$H --port 8000"
# rooms: three nodes sharing one Redis; each room of 12 spans two of the three nodes.
case " ${ONLY:-rooms-redis} " in *" rooms-redis "*)
    redis-server --port 6390 --save "" --appendonly no --daemonize yes --pidfile /tmp/herald-bench-redis.pid --logfile /dev/null
    sleep 0.5
    HERALD_BROKER_URL=redis://127.0.0.1:6390 run rooms-redis rooms -n 12000 -r 200 -d 20 --room-spread 2 \
        --ws ws://127.0.0.1:8001/ws --ws ws://127.0.0.1:8002/ws --ws ws://127.0.0.1:8003/ws \
        --api http://127.0.0.1:8001 --api http://127.0.0.1:8002 --api http://127.0.0.1:8003 \
        --server-cmd "$H --port 8001" --server-cmd "$H --port 8002" --server-cmd "$H --port 8003"
    kill "$(cat /tmp/herald-bench-redis.pid)"
    ;;
esac
# The same on NATS (JetStream for history).
case " ${ONLY:-rooms-nats} " in *" rooms-nats "*)
    nats-server -p 4333 -js -sd /tmp/herald-bench-nats > /dev/null 2>&1 &
    NATS_PID=$!
    sleep 1
    HERALD_BROKER_URL=nats://127.0.0.1:4333 run rooms-nats rooms -n 12000 -r 200 -d 20 --room-spread 2 \
        --ws ws://127.0.0.1:8001/ws --ws ws://127.0.0.1:8002/ws --ws ws://127.0.0.1:8003/ws \
        --api http://127.0.0.1:8001 --api http://127.0.0.1:8002 --api http://127.0.0.1:8003 \
        --server-cmd "$H --port 8001" --server-cmd "$H --port 8002" --server-cmd "$H --port 8003"
    kill "$NATS_PID"
    rm -rf /tmp/herald-bench-nats
    ;;
esac
