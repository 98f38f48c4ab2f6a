#!/bin/sh
# Round 9: Pusher beside Herald, broadcast, before and after the Pusher fan-out change, alternated
# in one series (docs/bench/pusher-r9/section.md). Run from the repository root with two builds:
#   before: commit 8ec0cb8 (server and rig), binaries ./herald-base and ./herald-bench-base
#   after:  commit 67517f2 (server and rig), binaries ./herald-new and ./herald-bench-new
# each from `cargo build --release -p herald-server -p herald-bench` (copy target/release/herald
# and target/release/herald-bench). In every run the server and the rig come from the same build,
# and both protocols of a build use the same rig binary.
# Usage: docs/bench/pusher-r9/run.sh [FIRST_PAIR [LAST_PAIR]]
set -uf
D=docs/bench/pusher-r9
first=${1:-1} last=${2:-3}
wait_ports() {
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
n=0
one() { # build protocol pair
    build=$1 proto=$2 pair=$3
    case $build in
        before) S=./herald-base B=./herald-bench-base ;;
        after) S=./herald-new B=./herald-bench-new ;;
    esac
    port=$((18651 + n % 9)) src=127.0.$((50 + n % 10)).2
    n=$((n + 1))
    if [ "$proto" = pusher ]; then
        ARGS="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:$port/app/bench-key?protocol=7"
    else
        ARGS="--ws ws://127.0.0.1:$port/ws"
    fi
    wait_ports
    echo "$(date -u +%H:%M:%S) $build $proto $pair port $port source $src" >&2
    docs/bench/prio.sh $B broadcast -n 2000 -r 10 -d 20 $ARGS --api http://127.0.0.1:$port \
        --source-base $src --server-cmd "$S serve --config docs/bench/pusher.toml --port $port" \
        --json $D/$build-$proto-$pair.json > $D/$build-$proto-$pair.txt
}
for pair in $(seq "$first" "$last"); do
    if [ $((pair % 2)) = 1 ]; then
        one before herald $pair; one before pusher $pair; one after herald $pair; one after pusher $pair
    else
        one after pusher $pair; one after herald $pair; one before pusher $pair; one before herald $pair
    fi
done
