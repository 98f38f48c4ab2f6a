#!/usr/bin/env bash
# Broadcast plain vs TLS, one pair (docs/benchmarks.md, round 6): 2,000 subscribers of one channel,
# 10 publications/s for 20 s (20,000 deliveries/s); publications go through the API over the
# same transport (https:// for the TLS run).
#   docs/bench/tls/broadcast.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/bench/tls
port=18631
certs=target/bench-tls
[ -f "$certs/ca.pem" ] || scripts/bench-tls-cert.sh "$certs"
server="target/release/herald serve --config docs/bench/bench.toml --port $port"
settle() {
  while [ "$(ss -tan state time-wait "( sport = :$port or dport = :$port )" | wc -l)" -ge 500 ]; do
    sleep 2
  done
}
for mode in plain tls; do
  settle
  name="broadcast-2k-10-$mode"
  if [ "$mode" = tls ]; then
    args=(--tls-ca "$certs/ca.pem" --ws "wss://127.0.0.1:$port/ws" --api "https://127.0.0.1:$port"
      --server-cmd "$server --tls-cert $certs/server.pem --tls-key $certs/server.key")
  else
    args=(--ws "ws://127.0.0.1:$port/ws" --api "http://127.0.0.1:$port" --server-cmd "$server")
  fi
  echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  target/release/herald-bench broadcast -n 2000 -r 10 -d 20 --source-base 127.0.9.7 "${args[@]}" \
    --json "$out/$name.json" | tee "$out/$name.txt"
done
