#!/bin/sh
# Idle memory at 5,000 subscribed connections, Herald beside Pusher, on the build with both the
# idle-memory and the Pusher changes merged (target/release), two alternated rounds.
set -u
D=docs/bench/pusher-r9/merged
for round in 1 2; do
  for proto in herald pusher; do
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
    if [ $proto = pusher ]; then ARGS="--pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:18659/app/bench-key?protocol=7"; else ARGS="--ws ws://127.0.0.1:18659/ws"; fi
    target/release/herald-bench idle -n 5000 -d 10 $ARGS --api http://127.0.0.1:18659 --source-base 127.0.$((70 + round)).2 \
      --json $D/idle-$proto-$round.json --server-cmd "target/release/herald serve --config docs/bench/pusher.toml --port 18659" > $D/idle-$proto-$round.txt 2>&1
    echo "$proto $round: $(grep -E '^server RSS / connection|^machine' $D/idle-$proto-$round.txt | tr -s ' ' | tr '\n' '|')"
  done
done
