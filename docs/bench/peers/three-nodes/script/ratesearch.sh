#!/usr/bin/env bash
# The fan-in's highest rate with p99 ≤ 100 ms on one broker (brokers.sh, one run per step): each
# RATE in STEPS for each server in SERVERS, alternated per step, each server and broker fresh.
# Files search-r<RATE>-<broker>-<server>-1.{txt,json.gz} beside this script.
#   BROKER=cluster STEPS="1000 1500 2000" bash docs/bench/peers/three-nodes/script/ratesearch.sh
set -u
cd "$(dirname "$0")/../../../../.."
OUT=docs/bench/peers/three-nodes/script
for rate in ${STEPS:-1000 1500 2000}; do
  for server in ${SERVERS:-herald centrifugo}; do
    OUT=$OUT ROUNDS=1 RATE=$rate BROKERS=${BROKER:-cluster} SERVERS=$server NAME=search-r$rate \
      bash docs/bench/peers/three-nodes/brokers.sh
    f=$OUT/search-r$rate-${BROKER:-cluster}-$server-1.txt
    echo "$rate $server: $(grep -h '^delivery latency' "$f" | grep -o 'p99=[0-9.]*') $(grep -h '^delivered' "$f" | cut -c28-38)"
  done
done
