#!/usr/bin/env bash
# Idle memory plain vs TLS, one series (docs/benchmarks.md, "Idle memory over TLS"):
#   docs/bench/tls/run.sh [SIZES…]      (default: 5000 19000)
# Release builds; a test CA and certificate from scripts/bench-tls-cert.sh. Port 18631 and source
# base 127.0.9.7 keep the run apart from other benchmarks on the machine. Between runs it waits
# for the TIME_WAIT sockets on that port to drain below 500 (the recorded series counted every
# TIME_WAIT socket on the machine instead, a stricter wait).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/bench/tls
port=18631
certs=target/bench-tls
[ -f "$certs/ca.pem" ] || scripts/bench-tls-cert.sh "$certs"
server="target/release/herald serve --config docs/bench/bench.toml --port $port"
# Only this rig's sockets count (the node's port): other tests on the machine keep thousands of
# their own in TIME_WAIT on 127.0.0.1, which take none of our source ports.
settle() {
  while [ "$(ss -tan state time-wait "( sport = :$port or dport = :$port )" | wc -l)" -ge 500 ]; do
    sleep 2
  done
}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(5000 19000)
for n in "${sizes[@]}"; do
  for mode in plain tls; do
    settle
    name="idle-$((n / 1000))k-$mode"
    if [ "$mode" = tls ]; then
      args=(--tls-ca "$certs/ca.pem" --ws "wss://127.0.0.1:$port/ws" --api "https://127.0.0.1:$port"
        --server-cmd "$server --tls-cert $certs/server.pem --tls-key $certs/server.key")
    else
      args=(--ws "ws://127.0.0.1:$port/ws" --api "http://127.0.0.1:$port" --server-cmd "$server")
    fi
    echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
    target/release/herald-bench idle -n "$n" -d 10 --source-base 127.0.9.7 "${args[@]}" \
      --json "$out/$name.json" | tee "$out/$name.txt"
  done
done
