#!/bin/sh
# Round 12 (issue 13), 2-core machine: the 2-core broadcast goal's run (10,000 subscribers, 5/s,
# 30 s) against Herald and against herald-fanout-floor (the least a server can do for the rig:
# one write(2) per subscriber from plain threads, see its module docs), alternated.
# BIN holds herald, herald-bench and herald-fanout-floor (release builds), and herald-timer
# (the node with the connection's timer and drain signal kept across waits; PARTS=timer), and
# herald-direct (the fan-out writing to sockets itself; PARTS=direct), and herald-final (the
# round's end: direct writes, the timer kept, the drain signal as before; PARTS=final), and
# herald-final2 (the same with the fan-out's pieces outside tokio's cooperative budget;
# PARTS=final2), and herald-final3 (final2 with push and push_for_fanout sharing one queueing
# step; PARTS=final3, one pair as a check). Run from the
# repository root, on a quiet machine.
set -uf
D=docs/bench/round12
BIN=${BIN:-/tmp/bin}
ROUNDS=${ROUNDS:-1 2}
PARTS=${PARTS:-series}
n=0
settle() { # wait for the previous run's sockets to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
bcast() { # label server-command-with-PORT
    label=$1 cmd=$2
    n=$((n + 1))
    settle
    port=$((18690 + n % 4)) src=127.0.$((70 + n % 4)).2
    cmd=$(echo "$cmd" | sed "s/PORT/$port/")
    echo "$(date -u +%H:%M:%S) broadcast 10000x5 $label: $cmd" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench broadcast -n 10000 -r 5 -d 30 --ws ws://127.0.0.1:$port/ws \
        --api http://127.0.0.1:$port --source-base $src --server-cmd "$cmd" \
        --json $D/$label.json > $D/$label.txt 2>&1
    grep -E "^delivery latency|^server  |^machine|^rig|^delivered" $D/$label.txt >> $D/series.log
}
profiled() { # label server-command-with-PORT: perf record -a, 10 s from the 12th second
    settle
    (sleep 12; perf record -a -o /tmp/$1.perf -- sleep 10 2>/dev/null) & bcast "$@"; wait
    { echo "# perf record -a (cpu-clock, 10 s) during $1; perf report --sort comm,dso"
      perf report -i /tmp/$1.perf --sort comm,dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
      echo; echo "# the same, --sort comm,sym, first 40"
      perf report -i /tmp/$1.perf --sort comm,sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
    } > $D/profile-$1.txt
}
idle() { # build [label-suffix]
    settle
    echo "$(date -u +%H:%M:%S) idle 19000 $1 ${HERALD_BROKER_URL:-memory}" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench idle -n 19000 -d 10 --source-base 127.0.41.1 \
        --ws ws://127.0.0.1:18642/ws --api http://127.0.0.1:18642 \
        --server-cmd "$BIN/$1 serve --config docs/bench/bench.toml --port 18642" \
        --json $D/idle19k-$1${2:-}.json > $D/idle19k-$1${2:-}.txt 2>&1
    grep -E '^server RSS|^connect  ' $D/idle19k-$1${2:-}.txt >> $D/series.log
}
storm() { # build [label-suffix]
    settle
    echo "$(date -u +%H:%M:%S) storm 19000 $1 ${HERALD_BROKER_URL:-memory}" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench storm -n 19000 -r 2 -d 20 --source-base 127.0.50.2 \
        --ws ws://127.0.0.1:18744/ws --api http://127.0.0.1:18744 \
        --server-cmd "$BIN/$1 serve --config docs/bench/bench.toml --port 18744" \
        --json $D/storm19k-$1${2:-}.json > $D/storm19k-$1${2:-}.txt 2>&1
    grep -E '^storm|^delivered' $D/storm19k-$1${2:-}.txt >> $D/series.log
}
serve() { # build: the server command for bcast
    echo "$BIN/$1 serve --config docs/bench/bench.toml --port PORT"
}
ab() { # base-label new-label new-build: three pairs, Herald at the round's start then new-build
    for r in 1 2 3; do
        bcast bcast50k-$1-$r "$(serve herald)"
        bcast bcast50k-$2-$r "$(serve $3)"
    done
}
for part in $PARTS; do
    case $part in
        series)
            for r in $ROUNDS; do
                bcast bcast50k-herald-$r "$BIN/herald serve --config docs/bench/bench.toml --port PORT"
                bcast bcast50k-floor2-$r "$BIN/herald-fanout-floor --port PORT --writers 2"
                bcast bcast50k-floor1-$r "$BIN/herald-fanout-floor --port PORT --writers 1"
            done ;;
        profile)
            profiled bcast50k-herald-profiled "$BIN/herald serve --config docs/bench/bench.toml --port PORT"
            profiled bcast50k-floor2-profiled "$BIN/herald-fanout-floor --port PORT --writers 2" ;;
        timer)
            ab base timer herald-timer
            profiled bcast50k-base-profiled "$BIN/herald serve --config docs/bench/bench.toml --port PORT"
            profiled bcast50k-timer-profiled "$BIN/herald-timer serve --config docs/bench/bench.toml --port PORT"
            idle herald; idle herald-timer
            storm herald; storm herald-timer ;;
        direct)
            for r in 1 2 3; do
                bcast bcast50k-dbase-$r "$BIN/herald serve --config docs/bench/bench.toml --port PORT"
                bcast bcast50k-dtimer-$r "$BIN/herald-timer serve --config docs/bench/bench.toml --port PORT"
                bcast bcast50k-direct-$r "$BIN/herald-direct serve --config docs/bench/bench.toml --port PORT"
            done
            profiled bcast50k-direct-profiled "$BIN/herald-direct serve --config docs/bench/bench.toml --port PORT"
            idle herald-direct
            storm herald-direct
            settle
            echo "$(date -u +%H:%M:%S) jitter 10000x5 herald-direct" >> $D/series.log
            docs/bench/prio.sh $BIN/herald-bench jitter -n 10000 -r 5 -d 60 --source-base 127.0.52.2 \
                --ws ws://127.0.0.1:18750/ws --api http://127.0.0.1:18750 \
                --server-cmd "$BIN/herald-direct serve --config docs/bench/bench.toml --port 18750" \
                --json $D/jitter10k-herald-direct.json > $D/jitter10k-herald-direct.txt 2>&1
            grep -E '^delivered|^recovery|^delivery latency' $D/jitter10k-herald-direct.txt >> $D/series.log ;;
        final)
            ab fbase final herald-final
            idle herald-final
            storm herald-final ;;
        final2)
            ab f2base final2 herald-final2
            profiled bcast50k-final2-profiled "$BIN/herald-final2 serve --config docs/bench/bench.toml --port PORT"
            idle herald-final2
            storm herald-final2 ;;
        final3)
            bcast bcast50k-f3base-1 "$(serve herald-final2)"
            bcast bcast50k-final3-1 "$(serve herald-final3)" ;;
        brokers)
            # The final build's idle memory and storm on Redis and on NATS JetStream, and idle
            # memory over TLS (needs scripts/bench-tls-cert.sh).
            redis-server --port 18740 --save '' --appendonly no > /dev/null 2>&1 &
            rpid=$!
            rm -rf /tmp/round12-js && mkdir -p /tmp/round12-js
            nats-server -a 127.0.0.1 -p 18741 -js -sd /tmp/round12-js > /dev/null 2>&1 &
            npid=$!
            sleep 1
            export HERALD_BROKER_URL=redis://127.0.0.1:18740
            idle herald-final2 -redis; storm herald-final2 -redis
            export HERALD_BROKER_URL=nats://127.0.0.1:18741
            idle herald-final2 -nats; storm herald-final2 -nats
            unset HERALD_BROKER_URL
            kill $rpid $npid; wait $rpid $npid 2>/dev/null
            settle
            echo "$(date -u +%H:%M:%S) idle 19000 TLS herald-final2" >> $D/series.log
            docs/bench/prio.sh $BIN/herald-bench idle -n 19000 -d 10 --source-base 127.0.43.1 \
                --tls-ca target/bench-tls/ca.pem --ws wss://127.0.0.1:18643/ws --api https://127.0.0.1:18643 \
                --server-cmd "$BIN/herald-final2 serve --config docs/bench/bench.toml --port 18643 --tls-cert target/bench-tls/server.pem --tls-key target/bench-tls/server.key" \
                --json $D/idle19k-tls-herald-final2.json > $D/idle19k-tls-herald-final2.txt 2>&1
            grep -E '^server RSS|^connect  ' $D/idle19k-tls-herald-final2.txt >> $D/series.log ;;
        profile-floor)
            profiled bcast50k-floor2-profiled "$BIN/herald-fanout-floor --port PORT --writers 2" ;;
    esac
done
