#!/usr/bin/env bash
# Herald JS SDK: the whole test suite from a clean clone.
#   1. Debian's chromium for the browser test (apt-get; no browser download from the internet)
#   2. npm ci, build (dist/ and demo/herald.js)
#   3. vitest: unit tests, Node integration tests against the real `herald` binary, browser tests
# HERALD_BIN overrides the server binary (default <repo>/target/debug/herald, built when missing).
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x /usr/bin/chromium ]]; then
  echo "== installing chromium (Debian package)"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y chromium
fi

echo "== npm ci"
npm ci --no-audit --no-fund

echo "== build"
npm run build

echo "== typecheck (sources and tests)"
npx tsc -p tsconfig.test.json

echo "== vitest: unit, integration (real herald), browser (headless chromium)"
# One run, three projects; vitest prints one summary line with the pass/fail counts.
npx vitest run
