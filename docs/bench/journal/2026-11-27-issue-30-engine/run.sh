#!/bin/sh
# Issue 30 part 1 (one connection engine), 2-core machine shared with other engineers' builds:
# the build before the engine (herald-before) and after it (herald-after), alternated run by run
# in one session, same flags. BIN holds herald-before, herald-after and herald-bench (release
# builds). Run from the repository root. PARTS picks the scenarios; ROUNDS the alternations.
set -uf
D=docs/bench/journal/2026-11-27-issue-30-engine
BIN=${BIN:-/tmp/I-bin}
BENCH=$BIN/herald-bench
PARTS=${PARTS:-idle idle-pusher idle-sse storm bcast}
ROUNDS=${ROUNDS:-2}
n=0
settle() { # wait for the previous runs' sockets (from this script's source addresses) to leave TIME_WAIT
    while [ "$(ss -tan state time-wait | grep -cE ' 127\.0\.([89][0-9]|1[01][0-9])\.[0-9]+:')" -gt 500 ]; do
        sleep 2
    done
}
log() { echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $*" >> $D/series.log; }
keep() { grep -E "$2" $D/$1.txt >> $D/series.log; gzip -9 -n -f $D/$1.json; }
run() { # label pattern build config scenario-args... (PORT and SRC replaced)
    label=$1 pattern=$2 build=$3 config=$4; shift 4
    n=$((n + 1)); port=$((18800 + n)); src=127.0.$((80 + n % 40)).2
    settle; log "$label"
    args=$(echo "$*" | sed "s/PORT/$port/g; s/SRC/$src/g")
    server="$BIN/herald-$build serve --config docs/bench/$config.toml --port $port"
    # shellcheck disable=SC2086
    docs/bench/prio.sh $BENCH $args --server-cmd "$server" --json $D/$label.json > $D/$label.txt 2>&1
    keep $label "$pattern"
}
for r in $(seq 1 $ROUNDS); do
  for part in $PARTS; do
    # Which build goes first alternates from round to round, so that a drift cancels out.
    order="before after"; [ $((r % 2)) -eq 0 ] && order="after before"
    for build in $order; do
      case $part in
        idle) run idle10k-$build-$r '^server RSS|^stopped' $build bench idle -n 10000 -d 10 --source-base SRC \
            --ws ws://127.0.0.1:PORT/ws --api http://127.0.0.1:PORT ;;
        idle-pusher) run idle10k-pusher-$build-$r '^server RSS|^stopped' $build pusher idle -n 10000 -d 10 --source-base SRC \
            --pusher --prefix pusher:bench-app:bench --ws ws://127.0.0.1:PORT/app/bench-key?protocol=7 \
            --api http://127.0.0.1:PORT ;;
        idle-sse) run idle10k-sse-$build-$r '^server RSS|^stopped' $build bench idle -n 10000 -d 10 --source-base SRC \
            --transport sse --ws ws://127.0.0.1:PORT/ws --api http://127.0.0.1:PORT ;;
        storm) run storm10k-$build-$r '^storm|^delivered' $build bench storm -n 10000 -r 2 -d 20 --source-base SRC \
            --ws ws://127.0.0.1:PORT/ws --api http://127.0.0.1:PORT ;;
        bcast) run bcast50k-$build-$r '^delivery latency|^server  |^machine|^delivered' $build bench broadcast -n 10000 -r 5 -d 30 \
            --source-base SRC --ws ws://127.0.0.1:PORT/ws --api http://127.0.0.1:PORT ;;
      esac
    done
  done
done
