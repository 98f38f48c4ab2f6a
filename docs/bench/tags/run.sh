#!/usr/bin/env bash
# The fan-out before and after tags and tag filters (docs/benchmarks.md, "Tags and tag filters at
# fan-out"): 10,000 subscribers of one channel at 50,000 deliveries/s, alternated per round:
#   base      BASE (a build before tags, tag filters and write spans)
#   head      HEAD, no tags
#   tags      HEAD, every publication carries a tag
#   filtered  HEAD, tagged publications and every subscriber filtering on the tag (all match)
# Needs BASE and HEAD (herald binaries) and target/release/herald-bench.
set -u
cd "$(dirname "$0")/../../.."
export HERALD_API_KEY=benchkey
OUT=${OUT:-docs/bench/tags}
B=target/release/herald-bench
ROUNDS=${ROUNDS:-"1 2 3"}
# The base predates `allow_tags_filter`: it runs bench.toml, HEAD the same plus that key.
TAGS=docs/bench/tags/bench-tags.toml
run() { # name port bin config extra-args...
  name=$1 port=$2 bin=$3 config=$4; shift 4
  { echo "# $name"; echo "# load: $(uptime)"; } > "$OUT/$name.txt"
  timeout 300 docs/bench/prio.sh $B broadcast -n 10000 -r 5 -d 20 "$@" \
    --ws "ws://127.0.0.1:$port/ws" --api "http://127.0.0.1:$port" --json "$OUT/$name.json" \
    --server-cmd "$bin serve --config $config --port $port" \
    >> "$OUT/$name.txt" 2>&1
  gzip -f "$OUT/$name.json"
  sleep 3
}
for i in $ROUNDS; do
  run "base-$i" 18821 "$BASE" docs/bench/bench.toml --source-base 127.0.151.2
  run "head-$i" 18822 "$HEAD" $TAGS --source-base 127.0.152.2
  run "tags-$i" 18823 "$HEAD" $TAGS --source-base 127.0.153.2 --tags '{"sym":"EURUSD"}'
  run "filtered-$i" 18824 "$HEAD" $TAGS --source-base 127.0.154.2 --tags '{"sym":"EURUSD"}' \
    --tags-filter '{"key":"sym","cmp":"eq","val":"EURUSD"}'
done
