#!/usr/bin/env bash
# Run fresh seeds of the deterministic simulation (crates/sim) for SECONDS (default 600), in a
# release build. A failing seed prints the one line that replays it (and exits 1); add it to
# crates/sim/tests/sim.rs as a regression test once the bug is fixed. Extra arguments go to
# herald-sim (for example --no-identity to run with epochs not bound to the broker's life).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
cargo build --release --locked -p herald-sim
exec target/release/herald-sim --for "$seconds" "$@"
