#!/bin/sh
# Round 10 (2-core machine): Pusher idle memory beside Herald's, base and new builds alternated;
# the reconnect storm with one accept queue and with the default eight (same binary, only
# HERALD_LIMITS__ACCEPT_QUEUES differs), in memory, then one run each on Redis and NATS.
# Binaries in $BIN: herald-base, herald-bench-base (78c7949), herald-new, herald-bench-new.
# Then the Pusher broadcast pair (2,000 subscribers, 10/s), base and new alternated.
# As run: PARTS="idle idle19 storm brokers", then PARTS=bcast, then
# PARTS=bcast BCAST_BUILDS=new BCAST_ROUNDS="3 4 5 6" (log series-bcast2.log), then
# PARTS=bcast50k (Herald's 2-core goal run, 50,000/s to 10,000, base and new; series-50k.log),
# then PARTS=bcast50k BCAST_ROUNDS="3 4" (series-50k-2.log).
# Usage: BIN=/tmp/bin [PARTS="idle idle19 storm brokers bcast"] docs/bench/round10/run.sh
set -uf
D=docs/bench/round10
BIN=${BIN:-/tmp/bin}
PARTS=${PARTS:-idle idle19 storm brokers bcast}
wait_ports() {
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
overflows() { nstat -az TcpExtListenOverflows | awk '/ListenOverflows/ {print $2}'; }
n=0
next_run() { # proto: the next port and source address, the client flags, quiet ports
    port=$((18656 + n % 4)) src=127.0.$((56 + n % 4)).2
    n=$((n + 1))
    if [ "$1" = pusher ]; then
        ARGS="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:$port/app/bench-key?protocol=7"
    else
        ARGS="--ws ws://127.0.0.1:$port/ws"
    fi
    wait_ports
}
idle_pair() { # build count suffix
    build=$1 count=$2 suffix=$3
    for proto in herald pusher; do
        next_run $proto
        echo "$(date -u +%H:%M:%S) idle $count $build $proto port $port source $src" >&2
        docs/bench/prio.sh $BIN/herald-bench-$build idle -n $count -d 10 $ARGS --api http://127.0.0.1:$port \
            --source-base $src --server-cmd "$BIN/herald-$build serve --config docs/bench/pusher.toml --port $port" \
            --json $D/idle$count-$build-$proto$suffix.json > $D/idle$count-$build-$proto$suffix.txt 2>&1
        grep -E "RSS|per connection" $D/idle$count-$build-$proto$suffix.txt | head -3 >&2
    done
}
storm() { # label queues [broker-url]
    label=$1 queues=$2 url=${3:-}
    port=$((18738 + n % 4)) src=127.0.$((60 + n % 8)).2
    n=$((n + 1))
    wait_ports
    before=$(overflows)
    echo "$(date -u +%H:%M:%S) storm $label accept_queues=$queues ${url:-memory}" >&2
    if [ -n "$url" ]; then export HERALD_BROKER_URL=$url; else unset HERALD_BROKER_URL; fi
    HERALD_LIMITS__ACCEPT_QUEUES=$queues docs/bench/prio.sh $BIN/herald-bench-new storm -n 19000 -r 2 -d 20 \
        --source-base $src --ws ws://127.0.0.1:$port/ws --api http://127.0.0.1:$port --json $D/$label.json \
        --server-cmd "$BIN/herald-new serve --config docs/bench/bench.toml --port $port" > $D/$label.txt 2>&1
    echo "rc=$? listen overflows +$(( $(overflows) - before ))" | tee -a $D/$label.txt >&2
    grep -E '^storm|^delivered|^reconnect' $D/$label.txt >&2
}
broadcast_pair() { # build suffix
    build=$1 suffix=$2
    for proto in herald pusher; do
        next_run $proto
        echo "$(date -u +%H:%M:%S) broadcast 2000x10 $build $proto port $port source $src" >&2
        docs/bench/prio.sh $BIN/herald-bench-$build broadcast -n 2000 -r 10 -d 20 $ARGS --api http://127.0.0.1:$port \
            --source-base $src --server-cmd "$BIN/herald-$build serve --config docs/bench/pusher.toml --port $port" \
            --json $D/bcast-$build-$proto$suffix.json > $D/bcast-$build-$proto$suffix.txt 2>&1
        grep -E "^delivery latency|^delivered|^server " $D/bcast-$build-$proto$suffix.txt >&2
    done
}
for part in $PARTS; do
    case $part in
        idle)
            for round in 1 2; do
                idle_pair base 5000 -$round
                idle_pair new 5000 -$round
            done ;;
        idle19) idle_pair new 19000 "" ;;
        bcast50k)
            for round in ${BCAST_ROUNDS:-1 2}; do
                for build in base new; do
                    next_run herald
                    echo "$(date -u +%H:%M:%S) broadcast 10000x5 $build" >&2
                    docs/bench/prio.sh $BIN/herald-bench-$build broadcast -n 10000 -r 5 -d 30 $ARGS \
                        --api http://127.0.0.1:$port --source-base $src \
                        --server-cmd "$BIN/herald-$build serve --config docs/bench/bench.toml --port $port" \
                        --json $D/bcast50k-$build-$round.json > $D/bcast50k-$build-$round.txt 2>&1
                    grep -E "^delivery latency|^delivered|^server " $D/bcast50k-$build-$round.txt >&2
                done
            done ;;
        bcast)
            for round in ${BCAST_ROUNDS:-1 2}; do
                for build in ${BCAST_BUILDS:-base new}; do
                    broadcast_pair $build -$round
                done
            done ;;
        storm)
            for round in 1 2 3; do
                storm storm-q1-$round 1
                storm storm-q8-$round 8
            done ;;
        brokers)
            redis-server --port 18740 --save '' --appendonly no > /dev/null 2>&1 &
            rpid=$!
            rm -rf /tmp/round10-js && mkdir -p /tmp/round10-js
            nats-server -a 127.0.0.1 -p 18741 -js -sd /tmp/round10-js > /dev/null 2>&1 &
            npid=$!
            sleep 1
            storm storm-q8-redis 8 redis://127.0.0.1:18740
            storm storm-q8-nats 8 nats://127.0.0.1:18741
            export HERALD_BROKER_URL=redis://127.0.0.1:18740
            idle_pair new 19000 -redis
            export HERALD_BROKER_URL=nats://127.0.0.1:18741
            idle_pair new 19000 -nats
            unset HERALD_BROKER_URL
            kill $rpid $npid; wait $rpid $npid 2>/dev/null ;;
    esac
done
