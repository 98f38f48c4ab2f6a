#!/usr/bin/env bash
# Idle memory per subscribed connection, plain and TLS, several server binaries alternated in one
# series (docs/bench/journal/2026-11-25-round-9.md):
#   docs/bench/idle13/run.sh SIZE ROUNDS LABEL=BINARY [LABEL=BINARY…]
# e.g. docs/bench/idle13/run.sh 19000 2 base=herald-base new=target/release/herald
# For each round, each size's plain then TLS run, each binary in turn (so that a before and an
# after run next to each other). Release builds; test CA and certificate from
# scripts/bench-tls-cert.sh. Port 18641 and source base 127.0.40.1 keep the runs apart from
# other benchmarks on the machine. Between runs it waits for this port's TIME_WAIT sockets to
# drain below 500.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/bench/idle13
port=18641
certs=target/bench-tls
[ -f "$certs/ca.pem" ] || scripts/bench-tls-cert.sh "$certs"
n=$1
rounds=$2
shift 2
settle() {
  while [ "$(ss -tan state time-wait "( sport = :$port or dport = :$port )" | wc -l)" -ge 500 ]; do
    sleep 2
  done
}
for round in $(seq 1 "$rounds"); do
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
      name="idle-$((n / 1000))k-$mode-$label-$round"
      echo "== $name: $bin ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
      target/release/herald-bench idle -n "$n" -d 10 --source-base 127.0.40.1 "${args[@]}" \
        --json "$out/$name.json" >"$out/$name.txt"
      grep -E "^connect |RSS|stopped by" "$out/$name.txt"
    done
  done
done
