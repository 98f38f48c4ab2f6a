#!/usr/bin/env bash
# Before/after series on the fan-in on three nodes on one Redis (brokers.sh): the binary built
# before a change (OLD), after it (NEW) and Centrifugo (unless CENTRIFUGO=0), alternated ROUNDS
# times at RATE publications/s. Used for the Redis publish script change (no TIME call, age
# trim every 16th offset; names fanin-r2000-old/new) and the tail check's bulk position reads
# (TAG=tail: fanin-r2000-tail-old/new); BROKER=cluster runs it on the Redis Cluster (the tail
# check's reads grouped per master: TAG=mtail).
#   OLD=/tmp/herald-old NEW=/tmp/herald-new bash docs/bench/peers/three-nodes/script/series.sh
set -u
cd "$(dirname "$0")/../../../../.."
OUT=docs/bench/peers/three-nodes/script
RATE=${RATE:-2000}
BROKER=${BROKER:-redis}
P=fanin-r$RATE${TAG:+-$TAG}
for i in $(seq "${ROUNDS:-3}"); do
  OUT=$OUT ROUNDS=$i RATE=$RATE BROKERS=$BROKER SERVERS=herald HERALD=$OLD NAME=$P-old \
    bash docs/bench/peers/three-nodes/brokers.sh
  OUT=$OUT ROUNDS=$i RATE=$RATE BROKERS=$BROKER SERVERS=herald HERALD=$NEW NAME=$P-new \
    bash docs/bench/peers/three-nodes/brokers.sh
  if [ "${CENTRIFUGO:-1}" != 0 ]; then
    OUT=$OUT ROUNDS=$i RATE=$RATE BROKERS=$BROKER SERVERS=centrifugo NAME=$P \
      bash docs/bench/peers/three-nodes/brokers.sh
  fi
done
