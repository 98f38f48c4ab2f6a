#!/bin/sh
# Round 14 (issue 13), 2-core machine: a broadcast to many personal channels through Redis, with
# each channel's publish script called once (herald-gather, e08fbe3) against up to 64 channels
# per call (herald-batch), and the history trimmed by age every 16th publication (herald-trim16,
# not kept); PART fanin checks the broadcast in memory. BIN holds herald-bench and the builds named in BUILDS. Redis's own
# per-command statistics are reset before each run and kept beside its results. Run from the
# repository root, on a quiet machine.
set -uf
D=docs/bench/round14
BIN=${BIN:-/tmp/bin}
ROUNDS=${ROUNDS:-1 2}
BUILDS=${BUILDS:-herald-gather herald-batch}
PARTS=${PARTS:-fanin-redis}
RPORT=18780
n=0
settle() { # wait for the previous run's sockets to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
run() { # label scenario-args...
    label=$1; shift
    n=$((n + 1))
    settle
    redis-cli -p $RPORT FLUSHALL > /dev/null
    redis-cli -p $RPORT CONFIG RESETSTAT > /dev/null
    port=$((18790 + n % 4)) src=127.0.$((80 + n % 4)).2
    echo "$(date -u +%H:%M:%S) $label: $*" >> $D/series.log
    docs/bench/prio.sh $BIN/herald-bench "$@" --ws ws://127.0.0.1:$port/ws \
        --api http://127.0.0.1:$port --source-base $src \
        --server-cmd "$BIN/$build serve --config docs/bench/bench.toml --port $port" \
        --json $D/$label.json > $D/$label.txt 2>&1
    grep -E "^delivery latency|^server  |^machine|^rig|^delivered|^publication reached|^publish API" $D/$label.txt >> $D/series.log
    if [ "${HERALD_BROKER_URL:-}" = "$REDIS_URL" ]; then
        redis-cli -p $RPORT INFO commandstats | tr -d '\r' | grep -E "evalsha|cmdstat_eval:" > $D/$label.redis.txt
        redis-cli -p $RPORT INFO cpu | tr -d '\r' | grep -E "used_cpu_(sys|user):" >> $D/$label.redis.txt
        sed 's/^/redis: /' $D/$label.redis.txt >> $D/series.log
    fi
    gzip -9 -n -f $D/$label.json  # the raw workers' results: megabytes each, a tenth gzipped
}
# A fresh Redis per series; each run starts from an empty one (FLUSHALL) with reset statistics.
# The nodes use it only in the Redis parts (HERALD_BROKER_URL set per run).
redis-server --port $RPORT --save '' --appendonly no > /dev/null 2>&1 &
rpid=$!
sleep 1
REDIS_URL=redis://127.0.0.1:$RPORT
case " $PARTS " in *" fanin-nats "*)
    # NATS JetStream for the NATS part (a broker without calls of several channels: its
    # broadcast publishes run concurrently, 64 to a call, 256 in flight).
    rm -rf /tmp/round14-js && mkdir -p /tmp/round14-js
    nats-server -a 127.0.0.1 -p 18741 -js -sd /tmp/round14-js > /dev/null 2>&1 &
    npid=$!
    sleep 1 ;; esac
for round in $ROUNDS; do
    for build in $BUILDS; do
        case " $PARTS " in *" fanin-redis "*)
            # One POST /api/broadcast to 10,000 personal channels each second, through Redis.
            HERALD_BROKER_URL=$REDIS_URL run fanin10k-redis-$build-$round fanin -n 10000 -r 1 -d 20 ;; esac
        case " $PARTS " in *" fanin "*)
            # The 10,000-channel broadcast in memory (no Redis involved).
            run fanin10k-$build-$round fanin -n 10000 -r 1 -d 20 ;; esac
        case " $PARTS " in *" fanin-nats "*)
            HERALD_BROKER_URL=nats://127.0.0.1:18741 run fanin10k-nats-$build-$round fanin -n 10000 -r 1 -d 20 ;; esac
        case " $PARTS " in *" fanin-redis-1k "*)
            # The same to 1,000 personal channels, 10 broadcasts a second.
            HERALD_BROKER_URL=$REDIS_URL run fanin1k-redis-$build-$round fanin -n 1000 -r 10 -d 20 ;; esac
    done
done
kill $rpid; wait $rpid 2>/dev/null
case " $PARTS " in *" fanin-nats "*) kill $npid; wait $npid 2>/dev/null ;; esac
