#!/usr/bin/env bash
# Before/after series for the Redis publish script change (no TIME call; age trim every 16th
# offset): the fan-in on three nodes on one Redis (brokers.sh), alternating the binary built
# before the change (OLD), after it (NEW) and Centrifugo, ROUNDS times.
#   OLD=/tmp/herald-old NEW=/tmp/herald-new bash docs/bench/peers/three-nodes/script/series.sh
set -u
cd "$(dirname "$0")/../../../../.."
OUT=docs/bench/peers/three-nodes/script
for i in $(seq "${ROUNDS:-3}"); do
  OUT=$OUT ROUNDS=$i BROKERS=redis SERVERS=herald HERALD=$OLD NAME=fanin-r2000-old \
    bash docs/bench/peers/three-nodes/brokers.sh
  OUT=$OUT ROUNDS=$i BROKERS=redis SERVERS=herald HERALD=$NEW NAME=fanin-r2000-new \
    bash docs/bench/peers/three-nodes/brokers.sh
  OUT=$OUT ROUNDS=$i BROKERS=redis SERVERS=centrifugo NAME=fanin-r2000 \
    bash docs/bench/peers/three-nodes/brokers.sh
done
