#!/bin/sh
# SSE beside WebSocket, and WebSocket with and without compression (docs/benchmarks.md,
# "SSE beside WebSocket" and "WebSocket compression"). Each pair runs back to back against a
# fresh server on the same build; compare only within a pair (the machine is shared).
# Run from the repository root after
#   cargo build --release -p herald-server -p herald-bench
# ONLY="idle-5k-ws idle-5k-sse" for a subset; SUFFIX=-2 to keep a repeat beside the first run;
# HERALD=path/to/herald to measure another build of the server (a before/after series).
# Port 18431 and source addresses 127.0.9.x keep clear of other benchmarks on the same machine.
set -u
T=${CARGO_TARGET_DIR:-target}/release
B=$T/herald-bench
H="${HERALD:-$T/herald} serve --config docs/bench/transports/bench-compression.toml --port 18431"
D=docs/bench/transports
P=docs/bench/prio.sh
N="--ws ws://127.0.0.1:18431/ws --api http://127.0.0.1:18431 --source-base 127.0.9.2"
export HERALD_API_KEY=benchkey

run() {
    name=$1; shift
    case " ${ONLY:-$name} " in *" $name "*) ;; *) return ;; esac
    # Every run binds thousands of loopback ports: let the last run's TIME-WAIT ones (to or from
    # this port; other tenants' do not take these addresses) go first.
    while [ "$(ss -tan state time-wait '( sport = :18431 or dport = :18431 )' | wc -l)" -gt 500 ]; do
        sleep 5
    done
    echo "== $name: herald-bench $*" >&2
    $P $B "$@" $N --json $D/$name${SUFFIX:-}.json --server-cmd "$H" > $D/$name${SUFFIX:-}.txt
}

run idle-5k-ws        idle -n 5000 -d 10
run idle-5k-sse       idle -n 5000 -d 10 --transport sse
run broadcast-2k-ws   broadcast -n 2000 -r 10 -d 20
run broadcast-2k-sse  broadcast -n 2000 -r 10 -d 20 --transport sse
run idle-5k-ws-plain  idle -n 5000 -d 10
run idle-5k-ws-deflate idle -n 5000 -d 10 --compression
run broadcast-2k-1k-plain   broadcast -n 2000 -r 10 -d 20 --payload 1024
run broadcast-2k-1k-deflate broadcast -n 2000 -r 10 -d 20 --payload 1024 --compression
# Worst case for compression: every publication goes to one connection (2,000 channels of one
# subscriber), so nothing is shared and every frame is compressed for its connection alone.
run broadcast-2kch-1k-plain   broadcast -n 2000 -c 2000 -r 2000 -d 20 --payload 1024
run broadcast-2kch-1k-deflate broadcast -n 2000 -c 2000 -r 2000 -d 20 --payload 1024 --compression
