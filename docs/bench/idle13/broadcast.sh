#!/usr/bin/env bash
# Broadcast CPU check for the idle-memory changes (they add an allocation per poll that finds
# nothing to read): 2,000 subscribers of one channel, 10 publications/s (20,000 deliveries/s),
# 20 s, plain then TLS, each binary in turn:
#   docs/bench/idle13/broadcast.sh ROUNDS LABEL=BINARY [LABEL=BINARY…]
# FIRST_ROUND=3 numbers the rounds from 3 (to add rounds to a series).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/bench/idle13
port=18642
certs=target/bench-tls
rounds=$1
shift
settle() {
  while [ "$(ss -tan state time-wait "( sport = :$port or dport = :$port )" | wc -l)" -ge 500 ]; do
    sleep 2
  done
}
first=${FIRST_ROUND:-1}
for round in $(seq "$first" $((first + rounds - 1))); do
  for mode in plain tls; do
    for pair in "$@"; do
      label=${pair%%=*}
      bin=${pair#*=}
      server="$bin serve --config docs/bench/bench.toml --port $port"
      if [ "$mode" = tls ]; then
        args=(--tls-ca "$certs/ca.pem" --ws "wss://127.0.0.1:$port/ws" --api "https://127.0.0.1:$port"
          --server-cmd "$server --tls-cert $certs/server.pem --tls-key $certs/server.key")
      else
        args=(--ws "ws://127.0.0.1:$port/ws" --api "http://127.0.0.1:$port" --server-cmd "$server")
      fi
      settle
      name="broadcast-2k-$mode-$label-$round"
      echo "== $name: $bin ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
      target/release/herald-bench broadcast -n 2000 -r 10 -d 20 --source-base 127.0.41.1 "${args[@]}" \
        --json "$out/$name.json" >"$out/$name.txt"
      grep -E "^delivered|^latency|^server  |machine CPU" "$out/$name.txt" || true
    done
  done
done
