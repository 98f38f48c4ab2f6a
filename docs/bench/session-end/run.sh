#!/bin/sh
# The 2026-11-25 afternoon session's end state (docs/benchmarks.md "Round 8"): broadcast twice and
# idle, alternating with BEFORE=<another herald release binary> when given (for a same-run pair).
set -uf
B=target/release/herald-bench
D=docs/bench/session-end
wait_ports() { while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done; }
for round in 1 2; do
  for which in before after; do
    if [ $which = before ]; then [ -n "${BEFORE:-}" ] || continue; H=$BEFORE; else H=target/release/herald; fi
    S="$H serve --config docs/bench/bench.toml --port 18731"
    wait_ports
    docs/bench/prio.sh $B broadcast -n 2000 -r 10 -d 20 --server-cmd "$S" --ws ws://127.0.0.1:18731/ws --api http://127.0.0.1:18731 --json $D/broadcast-$which-$round.json > $D/broadcast-$which-$round.txt
  done
done
for which in before after; do
  if [ $which = before ]; then [ -n "${BEFORE:-}" ] || continue; H=$BEFORE; else H=target/release/herald; fi
  wait_ports
  docs/bench/prio.sh $B idle -n 5000 -d 10 --server-cmd "$H serve --config docs/bench/bench.toml --port 18731" --ws ws://127.0.0.1:18731/ws --api http://127.0.0.1:18731 --json $D/idle-$which.json > $D/idle-$which.txt
done
