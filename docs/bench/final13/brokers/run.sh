#!/bin/sh
# Idle memory (19,000) and the storm (19,000) with Redis and NATS JetStream as the broker, one run
# each, on this 2-core machine with target/release (issue 13: the figures must hold with brokers).
set -u
D=docs/bench/final13/brokers
mkdir -p /tmp/final13-js
redis-server --port 18741 --save '' --appendonly no > /dev/null 2>&1 &
rpid=$!
nats-server -a 127.0.0.1 -p 18742 -js -sd /tmp/final13-js > /dev/null 2>&1 &
npid=$!
sleep 1
src=90
for broker in redis nats; do
  case $broker in redis) url=redis://127.0.0.1:18741 ;; nats) url=nats://127.0.0.1:18742 ;; esac
  for scenario in idle storm; do
    while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
    src=$((src + 1))
    case $scenario in idle) args="-n 19000 -d 10" ;; storm) args="-n 19000 -r 2 -d 20" ;; esac
    HERALD_BROKER_URL=$url docs/bench/prio.sh target/release/herald-bench $scenario $args --source-base 127.0.$src.2 \
      --ws ws://127.0.0.1:18740/ws --api http://127.0.0.1:18740 --json $D/$scenario-$broker.json \
      --server-cmd "target/release/herald serve --config docs/bench/bench.toml --port 18740" > $D/$scenario-$broker.txt 2>&1
    echo "$scenario $broker: $(grep -E '^server RSS / connection|^storm|^delivered|^machine' $D/$scenario-$broker.txt | tr -s ' ' | tr '\n' '|')"
  done
done
kill $rpid $npid
