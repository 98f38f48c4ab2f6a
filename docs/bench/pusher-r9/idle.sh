#!/bin/sh
# Idle memory at 5,000 subscribed connections, Pusher beside Herald, the after build (and the
# before build's pair beside it), same binaries as run.sh. Run from the repository root.
set -uf
D=docs/bench/pusher-r9
wait_ports() {
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
n=0
for build in after before; do
    case $build in
        before) S=./herald-base B=./herald-bench-base ;;
        after) S=./herald-new B=./herald-bench-new ;;
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
        docs/bench/prio.sh $B idle -n 5000 -d 10 $ARGS --api http://127.0.0.1:$port \
            --source-base $src --server-cmd "$S serve --config docs/bench/pusher.toml --port $port" \
            --json $D/idle-$build-$proto.json > $D/idle-$build-$proto.txt
    done
done
