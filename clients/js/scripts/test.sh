#!/usr/bin/env bash
# Herald JS SDK: the whole test suite from a clean clone.
#   1. Debian's chromium for the browser test (apt-get; no browser download from the internet)
#   2. npm ci, lint (Biome: formatting and lint rules of biome.json), build (dist/ and demo/herald.js)
#   3. vitest: unit tests, Node integration tests against the real `herald` binary, browser tests
# HERALD_BIN overrides the server binary (default <repo>/target/debug/herald, built when missing).
# Exits non-zero on any failure. Every step runs under a time limit (the repository's
# scripts/step.sh: "== TIMEOUT: step '...'" when one runs past it; HERALD_STEP_TIMEOUT_SCALE
# multiplies the limits).
set -euo pipefail
cd "$(dirname "$0")/.."
source ../../scripts/step.sh

if [[ ! -x /usr/bin/chromium ]]; then
  echo "== installing chromium (Debian package)"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  step "apt-get update" 600 $SUDO apt-get update
  step "apt-get install chromium" 1200 $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y chromium
fi

step "npm ci" 600 npm ci --no-audit --no-fund

# Formatting and lint rules (biome.json); warnings fail too, so findings cannot pile up.
step "lint (biome)" 300 npm run lint

step "build" 300 npm run build

step "typecheck (sources and tests)" 300 npx tsc -p tsconfig.test.json

# One run, three projects. The JSON report feeds the plain closing line below
# ("js: N passed, N failed, N skipped"), which CI tools read; vitest's own exit code decides.
mkdir -p test-output
rm -f test-output/vitest.json
status=0
step "vitest: unit, integration (real herald), browser (headless chromium)" 600 \
  npx vitest run --reporter=default --reporter=json --outputFile.json=test-output/vitest.json ||
  status=$?
node -e '
  const fs = require("fs");
  const f = "test-output/vitest.json";
  if (!fs.existsSync(f)) { console.log("js: 0 passed, 1 failed"); process.exit(0); }
  const r = JSON.parse(fs.readFileSync(f, "utf8"));
  const skipped = (r.numPendingTests || 0) + (r.numTodoTests || 0);
  console.log(`js: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${skipped} skipped`);
'
exit "$status"
