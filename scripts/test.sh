#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (Debian packages for Redis,
# NATS, PostgreSQL, Java, Maven and Chromium; Rust crates; npm packages), then runs the Rust tests
# (unit, integration against the real binary, real Redis / Redis Cluster / NATS / PostgreSQL /
# Kafka started on free loopback ports) and the TypeScript SDK's unit, Node integration and
# headless-browser tests. Kafka's jars come from Maven Central (scripts/kafka-jars.sh, cached under
# ~/.cache/herald).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs nats-server in /usr/sbin, which a minimal PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

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
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== Kafka jars"
bash scripts/kafka-jars.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo build"
cargo build --workspace --all-targets --locked

echo "== cargo test"
cargo test --workspace --locked

echo "== TypeScript SDK"
HERALD_BIN="$PWD/target/debug/herald" bash clients/js/scripts/test.sh
