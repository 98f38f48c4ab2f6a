#!/bin/sh
# Round 13 (issue 13), 2-core machine: workloads of many small channels, where the fan-out writes
# to a channel's few subscribers itself (inline, no pieces), against builds before and after.
# BIN holds herald-bench and the builds named in BUILDS: herald (76cc3fa, before writes from the
# fan-out), herald-final3 (bd63165, round 12's end), herald-inline (the deliverer's own writes
# outside its cooperative budget), herald-slices (a large broadcast published in one slice per
# worker), herald-gather (a broadcast's direct writes gathered across channels and written in
# pieces). Run from the repository root, on a quiet machine.
set -uf
D=docs/bench/round13
BIN=${BIN:-/tmp/bin}
ROUNDS=${ROUNDS:-1 2}
BUILDS=${BUILDS:-herald herald-final3 herald-inline}
PARTS=${PARTS:-fanin}
n=0
settle() { # wait for the previous run's sockets to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
run() { # label scenario-args...
    label=$1; shift
    n=$((n + 1))
    settle
    port=$((18790 + n % 4)) src=127.0.$((80 + n % 4)).2
    echo "$(date -u +%H:%M:%S) $label: $*" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench "$@" --ws ws://127.0.0.1:$port/ws \
        --api http://127.0.0.1:$port --source-base $src \
        --server-cmd "$BIN/$build serve --config docs/bench/bench.toml --port $port" \
        --json $D/$label.json > $D/$label.txt 2>&1
    grep -E "^delivery latency|^server  |^machine|^rig|^delivered|^fanin|^api" $D/$label.txt >> $D/series.log
    gzip -9 -n -f $D/$label.json  # the raw workers' results: megabytes each, a tenth gzipped
}
case " $PARTS " in *" fanin-redis "*)
    # The same broadcast through Redis: the node's broker receive loop delivers the 10,000.
    redis-server --port 18780 --save '' --appendonly no > /dev/null 2>&1 &
    rpid=$!
    sleep 1
    export HERALD_BROKER_URL=redis://127.0.0.1:18780 ;; esac
for round in $ROUNDS; do
    for build in $BUILDS; do
        case " $PARTS " in *" fanin "*)
            # One POST /api/broadcast to 10,000 personal channels each second.
            run fanin10k-$build-$round fanin -n 10000 -r 1 -d 20 ;; esac
        case " $PARTS " in *" fanin-redis "*)
            run fanin10k-redis-$build-$round fanin -n 10000 -r 1 -d 20 ;; esac
        case " $PARTS " in *" goal "*)
            # Issue 13's 2-core goal run (one channel of 10,000, 5/s through /api/publish).
            run bcast50k-$build-$round broadcast -n 10000 -r 5 -d 30 ;; esac
        case " $PARTS " in *" rooms "*)
            # 10,000 subscribers in 1,000 channels of 10, 5,000 publications/s: 50,000 deliveries/s.
            run small1k-$build-$round broadcast -n 10000 -c 1000 -r 5000 -d 20 ;; esac
    done
done
case " $PARTS " in *" fanin-redis "*) kill $rpid; wait $rpid 2>/dev/null ;; esac
