#!/bin/sh
# Round 15 (issue 13), 2-core machine: every goal of the issue this machine can measure, run again
# with the build at the head of the branch (herald-head, 0a38eed: rounds 12-14's changes all in),
# so that the figures in docs/benchmarks.md's summary are measured on the code as it stands, not
# carried over from the round that last touched their path. BIN holds herald-head,
# herald-bench-head and herald-fanout-floor-head (release builds of 0a38eed), and herald-onesend
# for PARTS=onesend (0a38eed with onesend/one-send.patch, not kept); the TLS part needs
# scripts/bench-tls-cert.sh. SUFFIX names a repeat of the storm (storm19k-2: SUFFIX=-2). Run
# from the repository root, on a quiet machine.
set -uf
D=docs/bench/round15
BIN=${BIN:-/tmp/bin}
BENCH=$BIN/herald-bench-head
PARTS=${PARTS:-idle storm drain bcast}
n=0
settle() { # wait for the previous run's sockets to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
log() { echo "$(date -u +%H:%M:%S) $*" >> $D/series.log; }
keep() { # label patterns: the run's summary lines into the log, its raw JSON gzipped
    grep -E "$2" $D/$1.txt >> $D/series.log
    gzip -9 -n -f $D/$1.json
}
serve() { echo "$BIN/herald-head serve --config docs/bench/bench.toml --port $1"; }
idle() { # label [extra args]
    label=$1; shift
    settle; log "idle 19000 $label ${HERALD_BROKER_URL:-memory}"
    docs/bench/prio.sh $BENCH idle -n 19000 -d 10 --source-base 127.0.41.1 "$@" \
        --json $D/$label.json > $D/$label.txt 2>&1
    keep $label '^server RSS|^connect  |^stopped'
}
storm() { # label
    settle; log "storm 19000 $1 ${HERALD_BROKER_URL:-memory}"
    docs/bench/prio.sh $BENCH storm -n 19000 -r 2 -d 20 --source-base 127.0.50.2 \
        --ws ws://127.0.0.1:18744/ws --api http://127.0.0.1:18744 --server-cmd "$(serve 18744)" \
        --json $D/$1.json > $D/$1.txt 2>&1
    keep $1 '^storm|^delivered'
}
bcast() { # label server-command-with-PORT: the 2-core goal's run, 50,000 deliveries/s
    label=$1 cmd=$2
    n=$((n + 1))
    settle
    port=$((18690 + n % 4)) src=127.0.$((70 + n % 4)).2
    cmd=$(echo "$cmd" | sed "s/PORT/$port/")
    log "broadcast 10000x5 $label: $cmd"
    docs/bench/prio.sh $BENCH broadcast -n 10000 -r 5 -d 30 --ws ws://127.0.0.1:$port/ws \
        --api http://127.0.0.1:$port --source-base $src --server-cmd "$cmd" \
        --json $D/$label.json > $D/$label.txt 2>&1
    keep $label '^delivery latency|^server  |^machine|^rig|^delivered'
}
profiled() { # label server-command-with-PORT
    settle
    (sleep 12; perf record -a -o /tmp/$1.perf -- sleep 10 2>/dev/null) & bcast "$@"; wait
    { echo "# perf record -a (cpu-clock, 10 s) during $1; perf report --sort comm,dso"
      perf report -i /tmp/$1.perf --sort comm,dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
      echo; echo "# the same, --sort comm,sym, first 60"
      perf report -i /tmp/$1.perf --sort comm,sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60
    } > $D/profile-$1.txt
}
for part in $PARTS; do
    case $part in
        idle)
            idle idle19k --ws ws://127.0.0.1:18642/ws --api http://127.0.0.1:18642 \
                --server-cmd "$(serve 18642)"
            idle idle19k-tls --tls-ca target/bench-tls/ca.pem \
                --ws wss://127.0.0.1:18643/ws --api https://127.0.0.1:18643 \
                --server-cmd "$(serve 18643) --tls-cert target/bench-tls/server.pem --tls-key target/bench-tls/server.key" ;;
        storm)
            storm storm19k${SUFFIX:-} ;;
        brokers)
            # Idle memory and the storm on Redis and on NATS JetStream, each server fresh.
            redis-server --port 18740 --save '' --appendonly no > /dev/null 2>&1 &
            rpid=$!
            rm -rf /tmp/round15-js && mkdir -p /tmp/round15-js
            nats-server -a 127.0.0.1 -p 18741 -js -sd /tmp/round15-js > /dev/null 2>&1 &
            npid=$!
            sleep 1
            export HERALD_BROKER_URL=redis://127.0.0.1:18740
            idle idle19k-redis --ws ws://127.0.0.1:18642/ws --api http://127.0.0.1:18642 \
                --server-cmd "$(serve 18642)"
            redis-cli -p 18740 FLUSHALL > /dev/null
            storm storm19k-redis
            export HERALD_BROKER_URL=nats://127.0.0.1:18741
            idle idle19k-nats --ws ws://127.0.0.1:18642/ws --api http://127.0.0.1:18642 \
                --server-cmd "$(serve 18642)"
            storm storm19k-nats
            unset HERALD_BROKER_URL
            kill $rpid $npid; wait $rpid $npid 2>/dev/null ;;
        drain)
            # A storm of drains: SIGTERM a third of the way in, clients told to come back within
            # 2 s, the node started again on the same port (docs/bench/drain/run.sh's method).
            redis-server --port 18633 --bind 127.0.0.1 --save '' --appendonly no > /dev/null 2>&1 &
            rpid=$!
            sleep 1
            settle; log "drain 19000 2000ms redis"
            HERALD_BROKER_URL=redis://127.0.0.1:18633 HERALD_DRAIN_MS=2000 docs/bench/prio.sh $BENCH \
                drain -n 19000 -r 2 -d 20 --source-base 127.0.9.7 --server-cmd "$(serve 18631)" \
                --ws ws://127.0.0.1:18631/ws --api http://127.0.0.1:18631 \
                --json $D/drain19k-2000ms.json > $D/drain19k-2000ms.txt 2>&1
            keep drain19k-2000ms '^drain|^delivered|^stopped'
            kill $rpid; wait $rpid 2>/dev/null ;;
        profile)
            # The same runs under `perf record -a` (cpu-clock, 10 s from the 12th second).
            profiled bcast50k-herald-profiled "$(serve PORT)"
            profiled bcast50k-floor2-profiled "$BIN/herald-fanout-floor-head --port PORT --writers 2" ;;
        onesend)
            # The head against herald-onesend (the head with a WebSocket write of up to 16 KiB
            # joined into one send(2) instead of a writev(2)), alternated, then profiled.
            for r in ${ROUNDS:-1 2 3}; do
                bcast bcast50k-head-$r "$(serve PORT)"
                bcast bcast50k-onesend-$r "$BIN/herald-onesend serve --config docs/bench/bench.toml --port PORT"
            done
            profiled bcast50k-onesend-profiled "$BIN/herald-onesend serve --config docs/bench/bench.toml --port PORT" ;;
        bcast)
            # Herald against the floor (a server that does nothing but write), alternated.
            for r in 1 2 3; do
                bcast bcast50k-herald-$r "$(serve PORT)"
                bcast bcast50k-floor2-$r "$BIN/herald-fanout-floor-head --port PORT --writers 2"
            done ;;
    esac
done
