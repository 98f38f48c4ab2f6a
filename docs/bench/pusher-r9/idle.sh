#!/bin/sh
# Idle memory at 5,000 subscribed connections, Pusher beside Herald, same binaries as run.sh.
# Usage: [BUILDS="after before"] docs/bench/pusher-r9/idle.sh
#   as run: BUILDS="after before"; then BUILDS="final before" SUFFIX=-2; then BUILDS=final SUFFIX=-3
set -uf
D=docs/bench/pusher-r9
BUILDS=${BUILDS:-after before}
SUFFIX=${SUFFIX:-}
wait_ports() {
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
n=0
for build in $BUILDS; do
    case $build in
        before) S=./herald-base B=./herald-bench-base ;;
        after) S=./herald-new B=./herald-bench-new ;;
        final) S=./herald-mem B=./herald-bench-new ;;
    esac
    for proto in herald pusher; do
        port=$((18656 + n % 4)) src=127.0.$((56 + n % 4)).2
        n=$((n + 1))
        if [ "$proto" = pusher ]; then
            ARGS="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:$port/app/bench-key?protocol=7"
        else
            ARGS="--ws ws://127.0.0.1:$port/ws"
        fi
        wait_ports
        echo "$(date -u +%H:%M:%S) idle $build $proto port $port source $src" >&2
        # Other benchmarks on the machine at the start (another engineer's rig), for the record.
        ps -eo args | grep "[h]erald-bench \(broadcast\|idle\|storm\|jitter\|drain\|rooms\|fanin\)" | grep -v pusher-r9 | sed "s/^/  other: /" | cut -c1-160 >&2
        docs/bench/prio.sh $B idle -n 5000 -d 10 $ARGS --api http://127.0.0.1:$port \
            --source-base $src --server-cmd "$S serve --config docs/bench/pusher.toml --port $port" \
            --json $D/idle-$build-$proto$SUFFIX.json > $D/idle-$build-$proto$SUFFIX.txt
    done
done
