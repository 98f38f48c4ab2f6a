#!/bin/sh
# Round 16 (issue 36 item 4), 2-core machine: one POST /api/broadcast to 10,000 personal channels
# each second, through each broker: in memory, one redis-server, a Redis Cluster of three masters
# (no replicas) and one nats-server -js, alternated in one series. BIN holds herald-bench and the
# builds named in BUILDS. `uptime` is logged before each run (other tenants load the machine:
# compare ratios within one series only). Run from the repository root.
set -uf
D=docs/bench/round16
BIN=${BIN:-/tmp/bin}
ROUNDS=${ROUNDS:-1 2}
BUILDS=${BUILDS:-herald}
BROKERS=${BROKERS:-memory redis cluster nats}
# The brokers for the build named BASE (default: all of BROKERS), e.g. only the Redis ones when
# the builds differ only there.
BASE=${BASE:-}
BASE_BROKERS=${BASE_BROKERS:-$BROKERS}
N=${N:-10000}
RPORT=18780 CPORTS="18801 18802 18803" NPORT=18741
n=0
settle() { # wait for the previous run's sockets to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
reset_redis() { # FLUSHALL and RESETSTAT on every server of the run's broker
    for p in "$@"; do
        redis-cli -p "$p" FLUSHALL > /dev/null
        redis-cli -p "$p" CONFIG RESETSTAT > /dev/null
    done
}
redis_stats() { # label ports...: each server's EVALSHA statistics and CPU after the run
    label=$1; shift
    for p in "$@"; do
        echo "# redis :$p"
        redis-cli -p "$p" INFO commandstats | tr -d '\r' | grep -E "evalsha|cmdstat_eval:"
        redis-cli -p "$p" INFO cpu | tr -d '\r' | grep -E "used_cpu_(sys|user):"
    done > $D/$label.redis.txt
    sed 's/^/redis: /' $D/$label.redis.txt >> $D/series.log
}
run() { # label broker-url scenario-args...
    label=$1 url=$2; shift 2
    n=$((n + 1))
    settle
    case $url in
        redis://*) reset_redis $RPORT ;;
        redis+cluster://*) reset_redis $CPORTS ;;
    esac
    port=$((18790 + n % 4)) src=127.0.$((80 + n % 4)).2
    echo "$(date -u +%H:%M:%S) $label: $* ($(uptime | sed 's/.*load/load/'))" >> $D/series.log
    HERALD_BROKER_URL=$url docs/bench/prio.sh $BIN/herald-bench "$@" --ws ws://127.0.0.1:$port/ws \
        --api http://127.0.0.1:$port --source-base $src \
        --server-cmd "$BIN/$build serve --config docs/bench/bench.toml --port $port" \
        --json $D/$label.json > $D/$label.txt 2>&1
    grep -E "^delivery latency|^machine|^delivered|^publication reached|^publish API|^stopped by" $D/$label.txt >> $D/series.log
    case $url in
        redis://*) redis_stats $label $RPORT ;;
        redis+cluster://*) redis_stats $label $CPORTS ;;
    esac
    gzip -9 -n -f $D/$label.json
}
# Fresh servers per series, without persistence, at the rig's and node's raised priority (prio.sh):
# on a machine loaded by other tenants a broker at normal priority gets too little CPU (a first
# try of this series, with them at normal priority under a load average of 18-20, spent 2 ms
# per publish script call in Redis and took 15 s to reach everyone).
P=docs/bench/prio.sh
$P redis-server --port $RPORT --save '' --appendonly no > /dev/null 2>&1 &
rpid=$!
CDIR=$(mktemp -d /tmp/round16-cluster.XXXXXX)
cpids=""
for p in $CPORTS; do
    mkdir -p $CDIR/$p
    (cd $CDIR/$p && exec $OLDPWD/$P redis-server --port $p --cluster-enabled yes --cluster-config-file nodes.conf \
        --save '' --appendonly no > /dev/null 2>&1) &
    cpids="$cpids $!"
done
rm -rf /tmp/round16-js && mkdir -p /tmp/round16-js
$P nats-server -a 127.0.0.1 -p $NPORT -js -sd /tmp/round16-js > /dev/null 2>&1 &
npid=$!
sleep 1
yes yes | redis-cli --cluster create $(for p in $CPORTS; do printf '127.0.0.1:%s ' $p; done) \
    --cluster-replicas 0 > /dev/null
until redis-cli -p 18801 CLUSTER INFO | grep -q cluster_state:ok; do sleep 1; done
sleep 2
CLUSTER_URL=redis+cluster://$(echo $CPORTS | sed 's/\([0-9]*\)/127.0.0.1:\1/g; s/ /,/g')
for round in $ROUNDS; do
    for build in $BUILDS; do
        brokers=$BROKERS
        [ "$build" = "$BASE" ] && brokers=$BASE_BROKERS
        for broker in $brokers; do
            case $broker in
                memory) url=memory ;;
                redis) url=redis://127.0.0.1:$RPORT ;;
                cluster) url=$CLUSTER_URL ;;
                nats) url=nats://127.0.0.1:$NPORT ;;
            esac
            run fanin$((N / 1000))k-$broker-$build-$round $url fanin -n $N -r 1 -d 20
        done
    done
done
for p in $RPORT $CPORTS; do redis-cli -p $p SHUTDOWN NOSAVE > /dev/null 2>&1; done
kill $rpid $cpids $npid 2>/dev/null
wait 2>/dev/null
rm -rf $CDIR
