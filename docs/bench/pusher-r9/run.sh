#!/bin/sh
# Round 9: Pusher beside Herald, broadcast, builds alternated in one series
# (docs/bench/pusher-r9/section.md). Run from the repository root with the builds' binaries:
#   before: commit 8ec0cb8 (server and rig): ./herald-base, ./herald-bench-base
#   after:  commit 67517f2 (server and rig): ./herald-new,  ./herald-bench-new
#   final:  commit 1f64b55 server ./herald-mem with the rig of 67517f2 ./herald-bench-new (the
#           rig did not change after 67517f2)
# each from `cargo build --release -p herald-server -p herald-bench` at that commit (copy
# target/release/herald and target/release/herald-bench). In every run server and rig come from
# the same row above, and both protocols of a build use the same rig binary.
# Usage: [BUILDS="before after"] docs/bench/pusher-r9/run.sh [FIRST_PAIR [LAST_PAIR]]
#   as run: pairs 1-3 and 4 with BUILDS="before after" (the default), pairs 5-8 and 9-10 with
#   BUILDS="before final" (docs/bench/pusher-r9/series-*.log).
# Odd pairs run the builds in order (Herald, then Pusher), even pairs in reverse (Pusher first).
set -uf
D=docs/bench/pusher-r9
first=${1:-1} last=${2:-3}
BUILDS=${BUILDS:-before after}
wait_ports() {
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
n=0
one() { # build protocol pair
    build=$1 proto=$2 pair=$3
    case $build in
        before) S=./herald-base B=./herald-bench-base ;;
        after) S=./herald-new B=./herald-bench-new ;;
        final) S=./herald-mem B=./herald-bench-new ;;
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
    # Other benchmarks on the machine at the start (another engineer's rig), for the record.
    ps -eo args | grep "[h]erald-bench \(broadcast\|idle\|storm\|jitter\|drain\|rooms\|fanin\)" | grep -v pusher-r9 | sed "s/^/  other: /" | cut -c1-160 >&2
    docs/bench/prio.sh $B broadcast -n 2000 -r 10 -d 20 $ARGS --api http://127.0.0.1:$port \
        --source-base $src --server-cmd "$S serve --config docs/bench/pusher.toml --port $port" \
        --json $D/$build-$proto-$pair.json > $D/$build-$proto-$pair.txt
}
for pair in $(seq "$first" "$last"); do
    order=$BUILDS
    [ $((pair % 2)) = 1 ] || order=$(echo "$BUILDS" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
    for build in $order; do
        if [ $((pair % 2)) = 1 ]; then
            one $build herald $pair; one $build pusher $pair
        else
            one $build pusher $pair; one $build herald $pair
        fi
    done
done
