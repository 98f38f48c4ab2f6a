#!/bin/sh
# Issue 13's fan-out goals on a 16-core machine: 19,500 subscribers of one channel, publications
# at 1, 10, 30 and 100 per second (100/s = 1.95 M deliveries/s), plain and TLS at 1/s; every
# server binary given runs each step in turn (a same-run before/after).
# Usage: docs/bench/cores16/run.sh OUTDIR BENCH TLSDIR NAME=HERALD [NAME=HERALD ...]
#   (TLSDIR from scripts/bench-tls-cert.sh; RATES overrides "1 10 30 100")
set -u
out=$1 bench=$2 tls=$3; shift 3
mkdir -p "$out"
n=${N:-19500} w=${WORKERS:-8} d=${DURATION:-20}
src=10
wait_ports() { command -v ss >/dev/null || return 0; while [ "$(ss -tan state time-wait | wc -l)" -gt 2000 ]; do sleep 1; done; }
step() { # name herald label extra-args...
  name=$1 herald=$2 label=$3; shift 3
  src=$((src + 1))
  wait_ports
  echo "== $name $label $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  "$bench" broadcast -n "$n" -c 1 -w "$w" -d "$d" --source-base 127.0.$src.2 \
    --json "$out/$name-$label.json" "$@" > "$out/$name-$label.txt" 2>&1
  echo "rc=$? $(grep -E '^delivery latency|^deliveries/s|^delivered|^server  ' "$out/$name-$label.txt" | tr -s ' ' | tr '\n' ' ')"
}
for rate in ${RATES:-1 10 30 100}; do
  for pair in "$@"; do
    name=${pair%%=*} herald=${pair#*=}
    step "$name" "$herald" "r$rate" -r "$rate" --ws ws://127.0.0.1:18631/ws --api http://127.0.0.1:18631 \
      --server-cmd "$herald serve --config docs/bench/bench.toml --port 18631"
  done
done
for pair in "$@"; do
  name=${pair%%=*} herald=${pair#*=}
  step "$name" "$herald" "tls-r1" -r 1 --tls-ca "$tls/ca.pem" --ws wss://127.0.0.1:18631/ws --api https://127.0.0.1:18631 \
    --server-cmd "$herald serve --config docs/bench/bench.toml --port 18631 --tls-cert $tls/server.pem --tls-key $tls/server.key"
done
