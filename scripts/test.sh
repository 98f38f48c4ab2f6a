#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (Debian packages for Redis,
# NATS, PostgreSQL, Java, Maven and Chromium; Rust crates; npm packages), then runs the Rust tests
# (unit, integration against the real binary, real Redis / Redis Cluster / NATS / PostgreSQL /
# Kafka started on free loopback ports) and the TypeScript SDK's unit, Node integration and
# headless-browser tests. Kafka's jars come from Maven Central (scripts/kafka-jars.sh, cached under
# ~/.cache/herald).
#
# No step can hang CI: each runs under a time limit, set well above its normal time on a 2-core
# machine from a clean clone, and a step that runs past it is stopped with
# "== TIMEOUT: step '...'"; each Rust test binary has its own limit too (scripts/test-binary.sh),
# and libtest names any test running for over 60 s. Slower machines:
#   HERALD_STEP_TIMEOUT_SCALE     multiplies every step's limit (default 1)
#   HERALD_TEST_BINARY_TIMEOUT_S  seconds one Rust test binary may run (default 600)
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs nats-server in /usr/sbin, which a minimal PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"
# A CI build is built once and thrown away: no incremental caches, and line tables only (backtraces
# keep file:line). This halves the target directory (about 12 GB to 5 GB from a clean clone); CI
# machines share their disk, and a full disk failed a run.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only

# step NAME LIMIT_S COMMAND... (scripts/step.sh): every step below runs under a time limit.
source scripts/step.sh

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
# PostgreSQL for the outbox consumer's tests: Debian keeps initdb and pg_ctl in
# /usr/lib/postgresql/<version>/bin, off PATH (herald-testkit looks there too).
have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have_postgres || missing+=(postgresql)
# The Kafka consumer's client (rdkafka) builds librdkafka from source and links OpenSSL; the test
# broker is Apache Kafka on Java 17, fetched with Maven.
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  step "apt-get update" 600 $SUDO apt-get update -qq
  step "apt-get install" 1800 $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

step "Kafka jars" 900 bash scripts/kafka-jars.sh

step "cargo fmt --check" 300 cargo fmt --all -- --check

# The patched crates in vendor/ (vendor/README.md): exactly crates.io + vendor/patches/, every
# [patch] used, and the crates' own tests passing on the patched copies.
step "vendored crates: check, unused [patch]" 600 bash -c \
  'bash scripts/vendor-patches.sh selftest && bash scripts/vendor-patches.sh check && bash scripts/vendor-patches.sh unused'
# tokio-websockets' own tests run here. rustls' published crate ships no data for its unit tests,
# so only its 15 doc tests could run, and their dev-dependencies build aws-lc-sys (about 3 min on 2
# cores): run `bash scripts/vendor-patches.sh test rustls` when its patch changes (vendor/README.md).
step "vendored crates: upstream tests" 1800 bash scripts/vendor-patches.sh test tokio-websockets
# cargo-deny (deny.toml): built once from crates.io (no prebuilt binary is reachable), then reused.
command -v cargo-deny >/dev/null 2>&1 ||
  step "cargo install cargo-deny" 1800 cargo install --locked cargo-deny --version 0.20.2
step "cargo deny (bans, licences, sources)" 600 cargo deny --locked check bans licenses sources
# The advisory database is a git repository on GitHub; a machine that reaches only package
# registries cannot fetch it, and says so instead of failing.
if timeout 30 git ls-remote https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
  step "cargo deny (advisories)" 600 cargo deny --locked check advisories
else
  echo "== cargo deny (advisories): SKIPPED, github.com/rustsec/advisory-db is not reachable"
fi

# What the SDK and deploy steps far below download and build (Go: the Helm chart's checker on
# Helm's SDK, about 2 min of CPU with empty caches, and the Go SDK's race-instrumented tests, about
# 3 min; Maven: the Kotlin SDK's artifacts, about 110 MB, and its compile; pip: the Python SDK's
# virtual environment) starts now, niced, in the background: the Rust build leaves a core idle in
# its last, serial crates, and the downloads wait on the network, not the CPU. Those steps wait
# for it; whatever it did not finish they do themselves (a failure here only costs that time).
warm_log=$(mktemp)
(
  if command -v go >/dev/null 2>&1; then
    nice -n 10 bash -c 'mkdir -p target/helm-validate &&
      (cd deploy/helm/validate && go build -mod=readonly -o ../../../target/helm-validate/validate .) &&
      (cd clients/go && go test -race -count=1 -run "^$" ./... >/dev/null)' &
  fi
  if command -v mvn >/dev/null 2>&1; then
    nice -n 10 mvn -q -B -Dstyle.color=never -f clients/kotlin/pom.xml -DskipTests test-compile &
  fi
  nice -n 10 bash -c 'python3 -m venv clients/python/.venv &&
    clients/python/.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "clients/python[test]"' &
  status=0
  for job in $(jobs -p); do wait "$job" || status=1; done
  exit "$status"
) >"$warm_log" 2>&1 &
warm_pid=$!
# Not left running when a step fails and the suite stops.
trap '[ -n "${warm_pid:-}" ] && pkill -P "$warm_pid" 2>/dev/null; [ -n "${warm_pid:-}" ] && kill "$warm_pid" 2>/dev/null; true' EXIT
wait_warm() {
  [ -n "${warm_pid:-}" ] || return 0
  wait "$warm_pid" || { echo "== background warm-up failed (the steps below do it again):"; tail -20 "$warm_log"; }
  warm_pid=
}

step "cargo clippy (-D warnings)" 2700 cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo build" 2700 cargo build --workspace --all-targets --locked

# The server without its default features (`kafka`: no librdkafka; `pusher`) still builds, and
# refuses a config that names a Kafka consumer or a Pusher app (about 1 min on 2 cores after the
# build above).
step "herald-server without Kafka and Pusher" 600 bash -c \
  'cargo check -p herald-server --no-default-features --locked &&
   cargo test -p herald-server --no-default-features --locked --lib -- consumers:: serve::'

# Each test binary runs through scripts/test-binary.sh (cargo's runner for the host target).
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUNNER"
# Socket.IO from npm (a few seconds) for herald-bench's test against it (crates/bench/tests/socketio.rs).
step "Socket.IO peer for herald-bench's test (npm)" 300 bash scripts/peers.sh build socketio
step "cargo test" 1800 env "$runner_var=$PWD/scripts/test-binary.sh" HERALD_TEST_REQUIRE_SOCKETIO=1 \
  cargo test --workspace --locked

# The deterministic simulation (crates/sim): a fixed budget of seeds in the debug build as CI
# builds it (about 6 s of one core per seed: 12 seeds about 70 s on 2 cores; most of it is
# tokio's runtime, so an opt-level override for herald-sim alone would not help); a failing seed
# prints its one-line replay. scripts/sim.sh runs fresh seeds longer, in release.
step "simulation seeds" 360 target/debug/herald-sim --seeds 1..12

# The Grafana dashboard and the Prometheus alert rules (deploy/): promtool's rule tests and the
# dashboard's shape; tests/dashboards.rs (in cargo test) checks every metric they name is exported.
step "monitoring: promtool rules, dashboard JSON" 300 bash scripts/monitoring-test.sh

step "TypeScript SDK" 1200 env HERALD_BIN="$PWD/target/debug/herald" bash clients/js/scripts/test.sh

# The cross-SDK conformance suite (clients/conformance): each scenario against the real binary
# through a fault-injecting proxy, with the JS SDK's adapter (about 25 s). Its self-test (each
# scenario can fail; about 70 s) runs by hand: node clients/conformance/driver/selftest.mjs
step "conformance suite (JS SDK)" 300 env HERALD_BIN="$PWD/target/debug/herald" bash clients/conformance/run.sh

# The container image (built with buildah from the debug binary, unpacked, its entrypoint run
# chrooted as the image's user: probes, a client, a publish, a SIGTERM drain) and the Helm chart
# (lint, render every example, strict Kubernetes types, drain/probe timings against the binary's
# defaults, the rendered settings run on the binary). Their self-tests (each check fails on a
# broken image or chart; about 40 s) run by hand: bash scripts/image-test.sh selftest, and
# bash scripts/helm-test.sh selftest. About 20 s with warm caches.
wait_warm
step "deploy: container image and Helm chart" 900 env HERALD_BIN="$PWD/target/debug/herald" bash -c \
  'bash scripts/image-test.sh && bash scripts/helm-test.sh'

# The Python, Go and Kotlin SDKs (clients/python, clients/go, clients/kotlin), side by side
# (scripts/sdk-tests.sh): each one's own checks (Python: mypy --strict, pytest; Go: vet, race tests;
# Kotlin: Maven build, JUnit), then the conformance suite on one node and on three nodes on Redis.
# About 100 s with warm caches (the Go and Maven builds are warmed up in the background above).
step "SDKs: Python, Go, Kotlin (with the conformance suite)" 900 env HERALD_BIN="$PWD/target/debug/herald" bash scripts/sdk-tests.sh
