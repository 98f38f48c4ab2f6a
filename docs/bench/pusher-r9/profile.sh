#!/bin/sh
# One broadcast run under perf (docs/bench/pusher-r9/section.md, "Profile"): the server started
# by hand, the rig attached with --server-pid; 3 s in (after the connect phase) one
# `perf record --call-graph dwarf` samples the server and the rig's two worker processes for 15 s
# of the 20 s publishing window.
# Usage: docs/bench/prio.sh docs/bench/pusher-r9/profile.sh herald|pusher SERVER BENCH OUTDIR PORT SOURCE
set -uf
proto=$1 SERVER=$2 B=$3 OUT=$4 PORT=${5:-18651} SRC=${6:-127.0.50.2}
mkdir -p "$OUT"
HERALD_API_KEY=benchkey $SERVER serve --config docs/bench/pusher.toml --port "$PORT" >/dev/null 2>&1 &
spid=$!
sleep 1
while ! curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 0.2; done
if [ "$proto" = pusher ]; then
    ARGS="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:$PORT/app/bench-key?protocol=7"
else
    ARGS="--ws ws://127.0.0.1:$PORT/ws"
fi
$B broadcast -n 2000 -r 10 -d 20 $ARGS --api http://127.0.0.1:$PORT --source-base $SRC --server-pid $spid > "$OUT/bench-$proto.txt" &
bpid=$!
sleep 3
workers=$(pgrep -P $bpid | paste -sd,)
echo "server $spid workers $workers" > "$OUT/pids-$proto.txt"
perf record -F 999 --call-graph dwarf,8192 -p "$spid,$workers" -o "$OUT/$proto.perf" -- sleep 15 2>"$OUT/perf-$proto.log"
wait $bpid
kill $spid
wait $spid
