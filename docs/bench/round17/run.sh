#!/bin/sh
# Round 17 (issue 36 item 4): where a broadcast through NATS spends its time. One
# POST /api/broadcast to 10,000 personal channels each second for 20 s, in memory and through one
# nats-server -js, alternated. Besides herald-bench's own figures (node CPU, the rig's CPU, time
# until the broadcast reached all), nats-server's CPU time over each run is read from
# /proc/PID/stat with the node's, over 20 broadcasts in the middle of the run, so the CPU one
# broadcast costs can be added up per process.
# Needs target/release/herald and target/release/herald-bench. Run from the repository root.
set -uf
D=${OUT:-docs/bench/round17}
B=target/release
ROUNDS=${ROUNDS:-1 2 3}
NPORT=18742
TCK=$(getconf CLK_TCK)
P=docs/bench/prio.sh
n=0
settle() { while [ "$(ss -tan state time-wait | wc -l)" -gt 500 ]; do sleep 2; done; }
cpu_ms() { awk -v t="$TCK" '{print int(($14 + $15) * 1000 / t)}' "/proc/$1/stat"; }
run() { # label broker-url nats-server-pid
    label=$1 url=$2 npid=$3
    n=$((n + 1))
    settle
    port=$((18760 + n % 4)) src=127.0.$((90 + n % 4)).2
    echo "$(date -u +%H:%M:%S) $label ($(uptime | sed 's/.*load/load/'))" >> $D/series.log
    # The run: about 2 s of connecting, then 40 s of publishing. Both processes' CPU time is
    # read 12 s and 32 s in: 20 broadcasts, the connect phase left out.
    HERALD_BROKER_URL=$url $P $B/herald-bench fanin -n 10000 -r 1 -d 40 \
        --ws ws://127.0.0.1:$port/ws --api http://127.0.0.1:$port --source-base $src \
        --server-cmd "$B/herald serve --config docs/bench/bench.toml --port $port" \
        --json $D/$label.json > $D/$label.txt 2>&1 &
    bench=$!
    sleep 12
    hpid=$(pgrep -x herald | head -1)  # the server (the rig is herald-bench)
    h0=$(cpu_ms $hpid) c0=$(cpu_ms $npid)
    sleep 20
    h1=$(cpu_ms $hpid) c1=$(cpu_ms $npid)
    wait $bench
    echo "CPU over 20 broadcasts (12-32 s): node $((h1 - h0)) ms, nats-server $((c1 - c0)) ms" >> $D/$label.txt
    grep -E "^server  |^rig CPU|^machine|^delivered|^publication reached|^CPU over" $D/$label.txt >> $D/series.log
    gzip -9 -n -f $D/$label.json
}
# Two nats-servers: the streams on file (Herald's default) and in memory ([nats] storage).
rm -rf /tmp/round17-js /tmp/round17-js-mem && mkdir -p /tmp/round17-js /tmp/round17-js-mem
$P nats-server -a 127.0.0.1 -p $NPORT -js -sd /tmp/round17-js > /dev/null 2>&1 &
nfile=$!
$P nats-server -a 127.0.0.1 -p $((NPORT + 1)) -js -sd /tmp/round17-js-mem > /dev/null 2>&1 &
nmem=$!
sleep 1
for round in $ROUNDS; do
    run fanin10k-memory-$round memory $nfile
    run fanin10k-nats-$round nats://127.0.0.1:$NPORT $nfile
    # Opt-in (MEMSTORE=1): on nats-server 2.9.10 the memory store collapsed (reads of a
    # subject's last message timed out, nats-server kept a core busy after the run), which spoils
    # the runs after it.
    if [ "${MEMSTORE:-0}" = 1 ]; then
        HERALD_NATS__STORAGE=memory run fanin10k-nats-memstore-$round nats://127.0.0.1:$((NPORT + 1)) $nmem
    fi
done
kill $nfile $nmem
wait 2>/dev/null
