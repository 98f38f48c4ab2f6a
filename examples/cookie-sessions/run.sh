#!/usr/bin/env bash
# Run the example: the app on :8080 and Herald on :8000 (built from this repository when missing).
# Open http://127.0.0.1:8080/ in a browser, sign in, chat. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")"
root=../..
herald=${HERALD_BIN:-$root/target/debug/herald}
if [[ ! -x $herald ]]; then
  (cd "$root" && cargo build -p herald-server)
fi
if [[ ! -f $root/clients/js/demo/herald.js ]]; then
  echo "clients/js/demo/herald.js is missing (it is committed; run npm run build in clients/js)" >&2
  exit 1
fi
HERALD_WS=ws://127.0.0.1:8000/ws python3 app.py --port 8080 &
app=$!
trap 'kill $app 2>/dev/null' EXIT
HERALD_API_KEY=${HERALD_API_KEY:-example-key} "$herald" serve --config herald.toml --port 8000
