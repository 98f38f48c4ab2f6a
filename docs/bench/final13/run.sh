#!/bin/sh
# The end of the issue-13 session on the lent 16-core machine, each binary in turn per step:
# broadcast to 19,500 subscribers at 10/s and 105/s and over TLS at 1/s on all 16 cores, then
# the 2-core goal (10,000 subscribers, 5/s = 50,000 deliveries/s, 30 s) with the rig and the node
# pinned to cores 0 and 1. Usage: docs/bench/final13/run.sh OUTDIR BENCH TLSDIR NAME=HERALD [...]
set -u
out=$1 bench=$2 tls=$3; shift 3
mkdir -p "$out"
src=80
run() { # label herald-args... ; herald-bench args come from $args
  label=$1; shift
  src=$((src + 1))
  echo "== $label $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  $pin "$bench" broadcast $args --source-base 127.0.$src.2 --json "$out/$label.json" "$@" > "$out/$label.txt" 2>&1
  echo "rc=$? $(grep -E '^delivered|^delivery latency|^deliveries/s' "$out/$label.txt" | tr -s ' ' | tr '\n' '|')"
}
for step in r10 r105 tls; do
  for pair in "$@"; do
    name=${pair%%=*} herald=${pair#*=} pin=
    case $step in
      r10) args="-n 19500 -c 1 -w 8 -d 20 -r 10"; run "$name-16c-r10" --ws ws://127.0.0.1:18631/ws --api http://127.0.0.1:18631 --server-cmd "$herald serve --config docs/bench/bench.toml --port 18631" ;;
      r105) args="-n 19500 -c 1 -w 8 -d 20 -r 105"; run "$name-16c-r105" --ws ws://127.0.0.1:18631/ws --api http://127.0.0.1:18631 --server-cmd "$herald serve --config docs/bench/bench.toml --port 18631" ;;
      tls) args="-n 19500 -c 1 -w 8 -d 20 -r 1"; run "$name-16c-tls-r1" --tls-ca "$tls/ca.pem" --ws wss://127.0.0.1:18631/ws --api https://127.0.0.1:18631 \
        --server-cmd "$herald serve --config docs/bench/bench.toml --port 18631 --tls-cert $tls/server.pem --tls-key $tls/server.key" ;;
    esac
  done
done
for pair in "$@"; do
  name=${pair%%=*} herald=${pair#*=} pin="taskset -c 0,1" args="-n 10000 -c 1 -d 30 -r 5"
  run "$name-2c-50k" --ws ws://127.0.0.1:18631/ws --api http://127.0.0.1:18631 --server-cmd "$herald serve --config docs/bench/bench.toml --port 18631"
done
