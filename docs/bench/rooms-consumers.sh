#!/usr/bin/env bash
# The large-room chat scenario (docs/benchmarks.md, "Large rooms: api, outbox, kafka"): one
# message to a room of K members is one broadcast to K personal channels, sent through the HTTP
# API, a PostgreSQL outbox row and a Kafka record, for each K. One Herald node (release build, in
# memory) consumes the outbox and the topic; PostgreSQL and Kafka are the real servers the tests
# use (herald-services). Run from the repository root after
#   cargo build --release -p herald-server -p herald-bench -p herald-testkit
#   bash scripts/kafka-jars.sh
# Results: docs/bench/rooms/<via>-<K>.json (parameters, per-message rows, summary) and .txt.
# Optional: KS="100 1000" and VIAS="api outbox" to run a subset; MESSAGES (default 10).
set -euo pipefail
T=${CARGO_TARGET_DIR:-target}/release
D=docs/bench/rooms
P=docs/bench/prio.sh
KS=${KS:-"100 1000 10000 100000"}
VIAS=${VIAS:-"api outbox kafka"}
MESSAGES=${MESSAGES:-10}
mkdir -p "$D"

coproc SVC { "$T/herald-services" postgres kafka; }
while read -r line <&"${SVC[0]}"; do
  case $line in
    POSTGRES_DSN=*) DSN=${line#POSTGRES_DSN=} ;;
    KAFKA_BOOTSTRAP=*) KAFKA=${line#KAFKA_BOOTSTRAP=} ;;
    READY) break ;;
  esac
done
CONF=$(mktemp --suffix=.toml)
cleanup() { kill "${HERALD_PID:-}" 2>/dev/null || true; exec {SVC[1]}>&-; wait "$SVC_PID" 2>/dev/null || true; rm -f "$CONF"; }
trap cleanup EXIT
{
  cat docs/bench/bench.toml
  printf '\n[consumers.postgres.rooms]\ndsn = "%s"\ncreate_table = true\npoll_interval_ms = 1000\n' "$DSN"
  printf '\n[consumers.kafka]\nbrokers = "%s"\ntopics = ["herald-rooms"]\ngroup_id = "rooms"\n' "$KAFKA"
  printf '[consumers.kafka.properties]\n"allow.auto.create.topics" = "true"\n"fetch.wait.max.ms" = "10"\n'
} > "$CONF"
HERALD_API_KEY=benchkey "$T/herald" serve --config "$CONF" --port 8000 > "$D/herald.log" 2>&1 &
HERALD_PID=$!
sleep 3

for k in $KS; do
  per=$(( (k + 9999) / 10000 ))   # at most 10,000 connections: several channels each beyond that
  for via in $VIAS; do
    # A run's 10,000 connections leave 10,000 ports in TIME_WAIT for 60 s; explicitly bound
    # ports are then unavailable to every new outgoing connection (the API client's, the
    # database's), so the next run waits for them to clear.
    for _ in $(seq 70); do
      [ "$(ss -tan state time-wait | wc -l)" -lt 5000 ] && break
      sleep 1
    done
    echo "== $via K=$k ($per channels per connection)" >&2
    $P "$T/herald-room-bench" -k "$k" --per-connection "$per" --messages "$MESSAGES" --via "$via" \
      --pg-dsn "$DSN" --kafka-brokers "$KAFKA" --kafka-topic herald-rooms \
      --json "$D/$via-$k.json" > "$D/$via-$k.txt"
  done
done
