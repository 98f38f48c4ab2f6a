#!/bin/bash
# A/B: HEAD vs the two replay changes reverted; interleaved, same rig, same session.
# The pairs 4-5 of docs/reliability.md ran the same command with the order reversed (revert first).
# BIN_DIR: herald-head = release build of 3f56935; herald-revert = the same with the two replay
# edits (sorted leave in session/controls.rs, FixedState in hub/mod.rs) undone.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=${OUT:-/tmp/sim-cost}; mkdir -p "$OUT"
port=18901
for i in 1 2 3; do
 for v in head revert; do
  port=$((port+1))
  docs/bench/prio.sh target/release/herald-bench broadcast -n 10000 -r 5 -d 30 --source-base 127.0.71.2 \
    --ws ws://127.0.0.1:$port/ws --api http://127.0.0.1:$port \
    --server-cmd "${BIN_DIR:?directory with herald-head and herald-revert}/herald-$v serve --config docs/bench/bench.toml --port $port" > $OUT/bcast-$v-$i.txt 2>&1
  echo "$v $i: $(grep -E 'p99|delivered' $OUT/bcast-$v-$i.txt | head -3 | tr '\n' ' ')"
 done
done
for v in head revert; do
  port=$((port+1))
  docs/bench/prio.sh target/release/herald-bench idle -n 19000 -d 10 --source-base 127.0.41.1 \
    --ws ws://127.0.0.1:$port/ws --api http://127.0.0.1:$port \
    --server-cmd "${BIN_DIR:?directory with herald-head and herald-revert}/herald-$v serve --config docs/bench/bench.toml --port $port" > $OUT/idle-$v.txt 2>&1
  echo "idle $v: $(grep -iE 'per conn|KB' $OUT/idle-$v.txt | head -3 | tr '\n' ' ')"
done
