#!/bin/sh
# The Pusher-protocol runs of docs/benchmarks.md, each beside the same run with Herald's protocol
# against the same server configuration. Run from the repository root after
#   cargo build --release -p herald-server -p herald-bench
# Optional: ONLY="idle-5k-pusher" to run a subset.
set -uf
T=${CARGO_TARGET_DIR:-target}/release
B=$T/herald-bench
H="$T/herald serve --config docs/bench/pusher.toml --port 8000"
D=docs/bench
P=docs/bench/prio.sh
PUSHER="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:8000/app/bench-key?protocol=7"

run() {
    name=$1; shift
    case " ${ONLY:-$name} " in *" $name "*) ;; *) return ;; esac
    echo "== $name: herald-bench $*" >&2
    $P $B "$@" --json $D/$name.json --report $D/$name.html --report $D/$name.svg > $D/$name.txt
}

run idle-5k-herald          idle -n 5000 -d 5 --server-cmd "$H"
run idle-5k-pusher          idle -n 5000 -d 5 $PUSHER --server-cmd "$H"
run broadcast-2k-20k-herald broadcast -n 2000 -r 10 -d 20 --server-cmd "$H"
run broadcast-2k-20k-pusher broadcast -n 2000 -r 10 -d 20 $PUSHER --server-cmd "$H"
