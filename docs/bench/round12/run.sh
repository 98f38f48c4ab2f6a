#!/bin/sh
# Round 12 (issue 13), 2-core machine: the 2-core broadcast goal's run (10,000 subscribers, 5/s,
# 30 s) against Herald and against herald-fanout-floor (the least a server can do for the rig:
# one write(2) per subscriber from plain threads, see its module docs), alternated.
# BIN holds herald, herald-bench and herald-fanout-floor (release builds). Run from the
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
        profile-floor)
            profiled bcast50k-floor2-profiled "$BIN/herald-fanout-floor --port PORT --writers 2" ;;
    esac
done
