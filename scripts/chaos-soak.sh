#!/usr/bin/env bash
# The chaos soak for as long as asked (default 600 s per broker): three nodes on a real Redis,
# then on a real NATS, clients and publishers under load while nodes are killed (-9) and started
# again, nodes' broker links are cut, and the broker restarts. At the end every client must hold
# every channel to its last publication with no duplicate and no hole it was not told about.
# CI runs the same test for 15 s (`cargo test`).
#   scripts/chaos-soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
export HERALD_SOAK_SECS="${1:-600}"
cargo build -p herald-server --quiet
echo "== chaos soak on Redis (${HERALD_SOAK_SECS}s)"
cargo test -p herald-broker-redis --test e2e standalone_chaos_soak -- --nocapture
echo "== chaos soak on NATS (${HERALD_SOAK_SECS}s)"
cargo test -p herald-broker-nats --test e2e chaos_soak -- --nocapture
