#!/usr/bin/env bash
# Delta compression beside permessage-deflate (docs/benchmarks.md, "Delta compression (Fossil)
# beside permessage-deflate"): the release server under the measurement test of
# crates/server/tests/delta.rs, the four modes in turn MEASURE_ROUNDS times. Writes the load
# average before each run and each run's bytes and node CPU to docs/bench/delta/measure-release.txt.
#   cargo build --release -p herald-server --bin herald && docs/bench/delta/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/bench/delta/measure-release.txt
{
  echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) $(nproc) cores; uptime: $(uptime)"
  HERALD_BIN=target/release/herald \
    MEASURE_PUBLICATIONS="${MEASURE_PUBLICATIONS:-1000}" MEASURE_ROUNDS="${MEASURE_ROUNDS:-3}" \
    cargo test -p herald-server --test delta -- --ignored --nocapture measure 2>&1 |
    grep -E '^(LOAD|MEASURE)'
} | tee "$out"
