#!/bin/sh
# Tracing's cost, off and on: alternates two servers (HEAD=the branch's herald, BASE=the build
# before tracing existed) in pairs on the same broadcast, then runs HEAD with [tracing] at two
# sample ratios against a local OTLP sink. Records `uptime` before each run.
# Usage: BENCH=target/release/herald-bench HEAD=... BASE=... PAIRS=3 OUT=docs/bench/tracing \
#   docs/bench/tracing/run.sh [off|on]
set -u
BENCH=${BENCH:-target/release/herald-bench}
OUT=${OUT:-docs/bench/tracing}
PAIRS=${PAIRS:-3}
export HERALD_API_KEY=benchkey
ARGS="broadcast -n 2000 -r 20 -d 20 --ws ws://127.0.0.1:18691/ws --api http://127.0.0.1:18691"
run() { # name server-binary [env...]
  name=$1 bin=$2; shift 2
  { echo "# $name: $bin $*"; echo "# load: $(uptime)"; } > "$OUT/$name.txt"
  env "$@" docs/bench/prio.sh "$BENCH" $ARGS \
    --server-cmd "$bin serve --config docs/bench/bench.toml --port 18691" >> "$OUT/$name.txt" 2>&1
  sleep 2
}
case "${1:-off}" in
off)
  i=1
  while [ "$i" -le "$PAIRS" ]; do
    run "off-head-$i" "$HEAD"
    run "off-base-$i" "$BASE"
    i=$((i + 1))
  done ;;
on)
  python3 "$(dirname "$0")/otlp_sink.py" 18699 > "$OUT/sink.txt" 2>&1 &
  sink=$!
  sleep 1
  for ratio in 0.01 1.0; do
    run "on-$ratio" "$HEAD" HERALD_TRACING__OTLP_ENDPOINT=http://127.0.0.1:18699 \
      HERALD_TRACING__SAMPLE_RATIO=$ratio
    run "on-$ratio-base" "$BASE"
  done
  kill "$sink" ;;
esac
