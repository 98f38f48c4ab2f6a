#!/bin/sh
# Round 11 (issue 13), 2-core machine. BIN holds herald-cur / herald-bench-cur (a83fe99, the start
# of the session) and herald-tix / herald-bench-tix (this round's build: TLS session tickets,
# herald-bench --tls-resume; herald-bench-tix is 1596f65's rig, series 2 (RIG=herald-bench-tix2)
# the final one, whose as_client no longer doubles each client's future). Run from the
# repository root, on a quiet machine.
# PARTS: profile (bcast50k under perf), shards (bcast50k with 1, 2, 4 rig workers),
#        tls-idle (idle over TLS at 19,000), tls-storm (storm over TLS, three builds alternated),
#        tls-storm2 (two of them again with the final rig).
# TLS parts need scripts/bench-tls-cert.sh first.
set -uf
D=docs/bench/round11
BIN=${BIN:-/tmp/bin}
PARTS=${PARTS:-profile shards tls-idle tls-storm}
n=0
next_run() {
    n=$((n + 1))
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
bcast() { # label [herald-bench flags]
    label=$1; shift
    next_run
    port=$((18670 + n % 4)) src=127.0.$((60 + n % 4)).2
    echo "$(date -u +%H:%M:%S) broadcast 10000x5 cur $label $*" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench-cur broadcast -n 10000 -r 5 -d 30 --ws ws://127.0.0.1:$port/ws \
        --api http://127.0.0.1:$port --source-base $src "$@" \
        --server-cmd "$BIN/herald-cur serve --config docs/bench/bench.toml --port $port" \
        --json $D/$label.json > $D/$label.txt 2>&1
    grep -E "^delivery latency|^server  |^machine|^rig|^delivered" $D/$label.txt >> $D/series.log
}
storm_tls() { # build label [herald-bench flags]
    build=$1 label=$2; shift 2
    next_run
    port=$((18744 + n % 4)) src=127.0.$((64 + n % 8)).2
    echo "$(date -u +%H:%M:%S) storm tls 19000 server=$build $label $*" >> $D/series.log
    docs/bench/prio.sh $BIN/${RIG:-herald-bench-tix} storm -n 19000 -r 2 -d 20 --source-base $src \
        --tls-ca target/bench-tls/ca.pem --ws wss://127.0.0.1:$port/ws --api https://127.0.0.1:$port "$@" \
        --json $D/$label.json \
        --server-cmd "$BIN/herald-$build serve --config docs/bench/bench.toml --port $port --tls-cert target/bench-tls/server.pem --tls-key target/bench-tls/server.key" \
        > $D/$label.txt 2>&1
    grep -E '^storm|^delivered|^server-side TLS|^rig CPU|^server  ' $D/$label.txt >> $D/series.log
}
idle_tls() { # build
    next_run
    echo "$(date -u +%H:%M:%S) idle 19000 TLS $1" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench-tix idle -n 19000 -d 10 --source-base 127.0.41.1 \
        --tls-ca target/bench-tls/ca.pem --ws wss://127.0.0.1:18642/ws --api https://127.0.0.1:18642 \
        --server-cmd "$BIN/herald-$1 serve --config docs/bench/bench.toml --port 18642 --tls-cert target/bench-tls/server.pem --tls-key target/bench-tls/server.key" \
        --json $D/idle19k-tls-$1.json > $D/idle19k-tls-$1.txt 2>&1
}
for part in $PARTS; do
    case $part in
        profile)
            # perf from the 12th second, 10 s (-g for the second run)
            (sleep 12; perf record -a -o /tmp/bcast50k.perf -- sleep 10) & bcast bcast50k-profiled; wait
            (sleep 12; perf record -a -g -o /tmp/bcast50k-g.perf -- sleep 10) & bcast bcast50k-profiled-g; wait ;;
        shards)
            for w in 4 2 1; do bcast bcast50k-w$w -w $w; done ;;
        tls-idle)
            idle_tls cur; idle_tls tix ;;
        tls-storm)
            for r in 1 2 3; do
                storm_tls cur storm-tls-cur-full-$r
                storm_tls tix storm-tls-tix-resume-$r --tls-resume
                storm_tls tix storm-tls-tix-full-$r
            done ;;
        tls-storm2)
            for r in 1 2; do
                RIG=herald-bench-tix2 storm_tls cur storm-tls-rig2-cur-full-$r
                RIG=herald-bench-tix2 storm_tls tix storm-tls-rig2-tix-resume-$r --tls-resume
            done ;;
    esac
done
