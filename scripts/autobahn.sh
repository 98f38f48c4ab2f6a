#!/usr/bin/env bash
# WebSocket conformance: the Autobahn|Testsuite fuzzing client (`wstest -m fuzzingclient`), every
# case, against two agents (docs/conformance.md says how to read the result):
#   herald      a Herald node (`herald serve --dev`, port 18632): the server as shipped;
#   codec-echo  herald-ws-echo (port 18634): the same WebSocket codec and limits, echoing, for
#               the cases that need an echo (a node has none). It does not negotiate
#               permessage-deflate (a node does that in its own handshake), so cases 12 and 13
#               come out UNIMPLEMENTED for both agents.
#   scripts/autobahn.sh [OUT]     (default OUT: target/autobahn; the HTML report is OUT/index.html)
# autobahntestsuite runs on Python 2.7 only: it is installed into a virtualenv under
# target/autobahn-venv from pyenv's 2.7 (or a python2.7 on PATH).
# Set HERALD_URL to test a node you started yourself instead, CASES to run some cases only
# (CASES='"9.*", "7.*"').
# Needs the release build (cargo build --release -p herald-server -p herald-bench).
# Then scripts/autobahn-summary.py prints the counts per category and every failure's reason.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/autobahn}"
venv=target/autobahn-venv
port=18632

if [ ! -x "$venv/bin/wstest" ]; then
  py=$(command -v python2.7 || true)
  [ -x "${HOME}/.pyenv/versions/2.7.18/bin/python" ] && py="${HOME}/.pyenv/versions/2.7.18/bin/python"
  [ -n "$py" ] || { echo "autobahn.sh: needs Python 2.7 (pyenv install 2.7.18)" >&2; exit 1; }
  # virtualenv < 20.22 is the last line that still makes Python 2.7 environments.
  "$py" -m pip install -q --target target/autobahn-virtualenv "virtualenv<20.22"
  PYTHONPATH=target/autobahn-virtualenv "$py" -m virtualenv -q "$venv"
  "$venv/bin/pip" install -q autobahntestsuite
fi

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
if [ -z "${HERALD_URL:-}" ]; then
  target/release/herald serve --dev --port "$port" >"target/autobahn-herald.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  HERALD_URL="ws://127.0.0.1:$port/ws"
fi
target/release/herald-ws-echo --port 18634 >"target/autobahn-echo.log" 2>&1 &
pids+=($!)
sleep 0.5

cases="${CASES:-\"*\"}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cat >"$out/fuzzingclient.json" <<JSON
{
  "outdir": "$out",
  "servers": [
    {"agent": "herald", "url": "$HERALD_URL"},
    {"agent": "codec-echo", "url": "ws://127.0.0.1:18634"}
  ],
  "cases": [$cases],
  "exclude-cases": [],
  "exclude-agent-cases": {}
}
JSON
"$venv/bin/wstest" -m fuzzingclient -s "$out/fuzzingclient.json" >"$out/wstest.log" 2>&1
python3 scripts/autobahn-summary.py "$out/index.json"
