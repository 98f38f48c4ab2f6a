#!/usr/bin/env bash
# Herald cross-SDK conformance suite against the JS SDK (clients/js), for CI and by hand: one node,
# and three nodes on Redis, side by side (suite.sh).
#   bash clients/conformance/run.sh [scenario.json ...]     (default: every scenarios/*.json)
# Installs what it needs: clients/js's npm packages (npm ci) and its build (dist/) when missing or
# older than src/. The driver itself uses only Node's standard library. HERALD_BIN overrides the
# server binary (default <repo>/target/debug/herald, built with cargo when missing).
# Prints one line per scenario with its time; exits non-zero when any scenario fails.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
js=../js

export HERALD_BIN=${HERALD_BIN:-$repo/target/debug/herald}
if [[ ! -x $HERALD_BIN ]]; then
  echo "== $HERALD_BIN missing: cargo build -p herald-server"
  (cd "$repo" && cargo build -p herald-server)
fi
if [[ ! -d $js/node_modules ]]; then
  echo "== npm ci (clients/js)"
  (cd "$js" && npm ci --no-audit --no-fund)
fi
if [[ ! -f $js/dist/index.node.mjs ]] || [[ -n $(find "$js/src" -newer "$js/dist/index.node.mjs" -print -quit) ]]; then
  echo "== npm run build (clients/js)"
  (cd "$js" && npm run build)
fi

start=$(date +%s)
status=0
bash suite.sh "node adapters/js/adapter.mjs" "$@" || status=$?
echo "conformance (js): $(($(date +%s) - start)) s in all"
exit "$status"
