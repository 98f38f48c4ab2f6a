#!/bin/sh
# Pusher protocol beside Herald's, broadcast only, three pairs alternated (docs/benchmarks.md
# "Round 7: Pusher beside Herald after the census"). Run from the repository root after
#   cargo build --release -p herald-server -p herald-bench
set -uf
T=${CARGO_TARGET_DIR:-target}/release
B=$T/herald-bench
H="$T/herald serve --config docs/bench/pusher.toml --port 8000"
D=docs/bench/pusher-r7
PUSHER="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:8000/app/bench-key?protocol=7"
wait_ports() {
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
}
for pair in 1 2 3; do
    wait_ports
    docs/bench/prio.sh $B broadcast -n 2000 -r 10 -d 20 --server-cmd "$H" --json $D/herald-$pair.json > $D/herald-$pair.txt
    wait_ports
    docs/bench/prio.sh $B broadcast -n 2000 -r 10 -d 20 $PUSHER --server-cmd "$H" --json $D/pusher-$pair.json > $D/pusher-$pair.txt
done
