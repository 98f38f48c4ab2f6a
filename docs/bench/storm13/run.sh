#!/bin/sh
# Issue 13's reconnect storm (19,000 clients of one channel dropped at once, back with `since`)
# in memory and on NATS JetStream, each server binary given in turn (a same-run before/after).
# CPUS=0,1 pins the rig, the node and nats-server to those cores (a 2-core slice of a larger
# machine, quiet). Usage: docs/bench/storm13/run.sh OUTDIR BENCH NATS-SERVER NAME=HERALD [...]
set -u
out=$1 bench=$2 nats=$3; shift 3
mkdir -p "$out"
pin() { if [ -n "${CPUS:-}" ]; then taskset -c "$CPUS" "$@"; else "$@"; fi; }
src=60
for round in ${ROUNDS:-1}; do
  for broker in memory nats; do
    for pair in "$@"; do
      name=${pair%%=*} herald=${pair#*=}
      src=$((src + 1))
      if command -v ss >/dev/null; then while [ "$(ss -tan state time-wait | wc -l)" -gt 2000 ]; do sleep 1; done; fi
      url=
      if [ $broker = nats ]; then
        rm -rf /tmp/storm13-js && mkdir -p /tmp/storm13-js
        ${CPUS:+taskset -c $CPUS} "$nats" -a 127.0.0.1 -p 18739 -js -sd /tmp/storm13-js > /dev/null 2>&1 &
        natspid=$!; sleep 1; url=nats://127.0.0.1:18739
      fi
      label=$name-$broker-$round
      echo "== $label $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
      if [ -n "$url" ]; then export HERALD_BROKER_URL=$url; else unset HERALD_BROKER_URL; fi
      pin "$bench" storm -n 19000 -r 2 -d 20 --source-base 127.0.$src.2 \
        --ws ws://127.0.0.1:18738/ws --api http://127.0.0.1:18738 --json "$out/$label.json" \
        --server-cmd "$herald serve --config docs/bench/bench.toml --port 18738" > "$out/$label.txt" 2>&1
      echo "rc=$? $(grep -E '^storm|^delivered|^reconnect →' "$out/$label.txt" | tr -s ' ' | tr '\n' '|')"
      echo "  $(grep -oE '"herald_(broker_)?history_reads_[a-z]*_?total": [0-9]+' "$out/$label.json" | sort -u | tr '\n' ' ')"
      if [ $broker = nats ]; then kill $natspid; wait $natspid 2>/dev/null; fi
    done
  done
done
