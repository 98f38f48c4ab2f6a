#!/bin/sh
# Round 15: a broadcast to 10,000 personal channels through NATS JetStream (fanin -n 10000 -r 1
# -d 20), with the node spreading its stores over HX_CONNS = 1, 2 or 4 NATS connections
# (herald-hx: 0a38eed with connections-experiment.patch applied, release build, in /tmp/bin;
# not kept). A fresh nats-server -js per run. Run from anywhere, on a quiet machine.
set -u
cd "$(dirname "$0")/../../../.."
D=docs/bench/round15/nats
for round in 1 2; do for c in 1 2 4; do
rm -rf /tmp/round15-nats-js && mkdir -p /tmp/round15-nats-js
nats-server -a 127.0.0.1 -p 18741 -js -sd /tmp/round15-nats-js > /dev/null 2>&1 &
npid=$!
sleep 1
while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done
HX_CONNS=$c HERALD_BROKER_URL=nats://127.0.0.1:18741 docs/bench/prio.sh /tmp/bin/herald-bench fanin -n 10000 -r 1 -d 20 \
  --ws ws://127.0.0.1:18795/ws --api http://127.0.0.1:18795 --source-base 127.0.$((85+c)).2 \
  --server-cmd "/tmp/bin/herald-hx serve --config docs/bench/bench.toml --port 18795" > $D/hx-$c-$round.txt 2>&1
echo "conns=$c round=$round $(grep -E '^publication reached' $D/hx-$c-$round.txt)"
echo "   $(grep -E '^machine' $D/hx-$c-$round.txt)"
kill $npid; wait $npid
done; done
