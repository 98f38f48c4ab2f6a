#!/bin/sh
# The proxy benchmarks of docs/benchmarks.md ("proxy hooks"). Run from the repository root after
#   cargo build --release -p herald-server -p herald-bench
# 1. connect rate: `herald-bench idle` (its clients connect without a token) against a node whose
#    connect proxy is a backend answering after 5 ms, beside the same run without the proxy;
# 2. publish proxy: one client's publish round trip on a channel without and with the publish
#    proxy (backend answering at once, so the difference is the hook's own cost; and at 5 ms).
# Results: docs/bench/proxy-*.txt (and .json for the idle runs).
set -eu
T=${CARGO_TARGET_DIR:-target}/release
D=docs/bench
P=docs/bench/prio.sh
N=${N:-10000}
tmp=$(mktemp -d)
trap 'kill $(cat $tmp/pids 2>/dev/null) 2>/dev/null || true; rm -rf $tmp' EXIT

backend() { # delay_ms -> port (the backend keeps running until exit)
    $T/herald-proxy-bench backend --delay-ms "$1" > $tmp/backend-$1 &
    echo $! >> $tmp/pids
    while ! grep -q listening $tmp/backend-$1 2>/dev/null; do sleep 0.1; done
    cut -d' ' -f2 $tmp/backend-$1
}
slow=$(backend 5)
fast=$(backend 0)

config() { # connect_url publish_url -> config file
    f=$tmp/herald-$(date +%s%N).toml
    cat $D/bench.toml > $f
    printf '\n[proxy]\nconnect_url = "%s"\npublish_url = "%s"\ntimeout_ms = 3000\n' "$1" "$2" >> $f
    printf '\n[[namespaces]]\nname = "proxied"\nsubscribe = "anonymous"\npublish = true\npublish_proxy = true\nhistory_size = 1000\n' >> $f
    # The publish probe sends thousands of commands on one connection.
    printf '\n[limits]\ncommands_per_second = 1000000\ncommand_burst = 1000000\n' >> $f
    echo $f
}
with_proxy=$(config "http://127.0.0.1:$slow/connect" "http://127.0.0.1:$fast/publish")

echo "== idle, connect proxy answering in 5 ms" >&2
$P $T/herald-bench idle -n $N -d 5 --self-check --json $D/proxy-connect-5ms.json \
    --server-cmd "$T/herald serve --config $with_proxy --port 8000" > $D/proxy-connect-5ms.txt
echo "== idle, no proxy (same conditions)" >&2
$P $T/herald-bench idle -n $N -d 5 --self-check --json $D/proxy-connect-none.json \
    --server-cmd "$T/herald serve --config $D/bench.toml --port 8000" > $D/proxy-connect-none.txt

latency() { # config name
    HERALD_API_KEY=benchkey $T/herald serve --config "$1" --port 8000 > /dev/null 2>&1 &
    pid=$!
    echo $pid >> $tmp/pids
    while ! curl -sf http://127.0.0.1:8000/health > /dev/null; do sleep 0.1; done
    {
        for round in 1 2; do
            $P $T/herald-proxy-bench publish-latency --channel plain -n 5000
            $P $T/herald-proxy-bench publish-latency --channel proxied:x -n 5000
        done
    } > $D/$2.txt
    kill $pid; wait $pid 2>/dev/null || true
}
echo "== publish round trip, publish proxy answering at once" >&2
latency "$with_proxy" proxy-publish-0ms
echo "== publish round trip, publish proxy answering in 5 ms" >&2
latency "$(config "http://127.0.0.1:$slow/connect" "http://127.0.0.1:$slow/publish")" proxy-publish-5ms
