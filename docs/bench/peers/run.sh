#!/bin/sh
# Herald beside Centrifugo on one machine, alternated run by run (docs/bench/peers/README.md):
#   bcast: one node, 10,000 subscribers of one channel, 5 publications/s for 30 s (50,000
#          deliveries/s), the 2-core broadcast goal's run of docs/benchmarks.md;
#   idle:  19,000 subscribed idle connections held 10 s: server RSS per connection;
#   selfcheck: the broadcast run against Centrifugo with --self-check (2 and 4 rig workers);
#   idlepool: idle again, Centrifugo with PEERS_CENTRIFUGO_WRITE_BUFFER_POOL=1.
# HERALD is a release build of the server, BENCH a release herald-bench with --centrifugo, and
# Centrifugo comes from `scripts/peers.sh build centrifugo`. ROUNDS pairs are run in the order
# Herald, Centrifugo. Run from the repository root; every run goes through docs/bench/prio.sh.
set -uf
D=docs/bench/peers
HERALD=${HERALD:-target/release/herald}
BENCH=${BENCH:-target/release/herald-bench}
ROUNDS=${ROUNDS:-1 2}
PARTS=${PARTS:-bcast idle}
n=0
settle() { # wait for the previous run's sockets (our ports, our source addresses) to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | grep -cE ':1896[0-3] |127\.0\.12[0-7]\.')" -gt 500 ]; do
        sleep 2
    done
}
log() { echo "$(date -u +%H:%M:%S) $*" >> $D/series.log; }
others() { # the busiest processes over the last 2 s (the machine is shared)
    top -b -n 2 -d 2 -w 200 | awk '/^top -/{n++} n==2' | sed -n '1p;8,13p' | tr -s ' ' |
        paste -sd ';' >> $D/series.log
}
keep() { # label patterns: the run's summary lines into the log, its raw JSON gzipped
    grep -E "$2" $D/$1.txt >> $D/series.log
    gzip -9 -n -f $D/$1.json
}
run() { # label server scenario-args...
    label=$1 server=$2
    shift 2
    n=$((n + 1))
    settle
    port=$((18960 + n % 4)) src=127.0.$((120 + n % 8)).2
    log "$label: $* ($server, port $port)"
    others
    case $server in
        herald)
            docs/bench/prio.sh $BENCH "$@" --source-base $src \
                --ws ws://127.0.0.1:$port/ws --api http://127.0.0.1:$port \
                --server-cmd "$HERALD serve --config docs/bench/bench.toml --port $port" \
                --json $D/$label.json > $D/$label.txt 2>&1 ;;
        centrifugo)
            docs/bench/prio.sh $BENCH "$@" --source-base $src --centrifugo \
                --ws ws://127.0.0.1:$port/connection/websocket --api http://127.0.0.1:$port \
                --server-cmd "scripts/peers.sh start centrifugo --port $port" \
                --json $D/$label.json > $D/$label.txt 2>&1 ;;
    esac
}
for part in $PARTS; do
    for r in $ROUNDS; do
        for server in herald centrifugo; do
            case $part in
                bcast|idle) ;;
                *) continue ;;
            esac
            case $part in
                bcast)
                    run bcast10k-$server-$r $server broadcast -n 10000 -r 5 -d 30
                    keep bcast10k-$server-$r '^delivery latency|^server  |^machine|^rig|^delivered|^publish  |stopped' ;;
                idle)
                    run idle19k-$server-$r $server idle -n 19000 -d 10
                    keep idle19k-$server-$r '^server RSS|^server  |^connect  |^machine|stopped' ;;
            esac
        done
    done
    case $part in
        idlepool) # Centrifugo with its write buffer pool (scripts/peers.sh), beside Herald
            for r in $ROUNDS; do
                run idle19k-herald-p$r herald idle -n 19000 -d 10
                keep idle19k-herald-p$r '^server RSS|^server  |^connect  |^machine|stopped'
                PEERS_CENTRIFUGO_WRITE_BUFFER_POOL=1 run idle19k-centrifugo-pool-$r centrifugo idle -n 19000 -d 10
                keep idle19k-centrifugo-pool-$r '^server RSS|^server  |^connect  |^machine|stopped'
            done ;;
        selfcheck)
            run bcast10k-centrifugo-selfcheck centrifugo broadcast -n 10000 -r 5 -d 30 --self-check
            keep bcast10k-centrifugo-selfcheck '^delivery latency|^delivered|self-check|^ ' ;;
    esac
done
