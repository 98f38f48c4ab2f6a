#!/usr/bin/env bash
# The Go SDK's checks: go vet, go test -race ./... (unit tests, and tests against the real herald),
# then the whole cross-SDK conformance suite with the Go adapter. Exits non-zero on any failure.
#   bash clients/go/test.sh
# HERALD_BIN: the server binary (default target/debug/herald at the repository root; a relative
# path is taken from the repository root). Needs a Go toolchain (1.21 or newer: an older-than-1.26
# one fetches go.mod's version itself from the Go module proxy, unless GOTOOLCHAIN=local), a C
# compiler for -race, and Node 18+ for the conformance driver. The two module dependencies
# (github.com/coder/websocket, github.com/centrifugal/fdelta) come from the Go module proxy on
# first use, checked against go.sum, and are cached after.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
HERALD_BIN=${HERALD_BIN:-target/debug/herald}
[[ $HERALD_BIN == /* ]] || HERALD_BIN=$repo/$HERALD_BIN
export HERALD_BIN
if [[ ! -x $HERALD_BIN ]]; then
  echo "clients/go/test.sh: no herald binary at $HERALD_BIN (cargo build -p herald-server, or set HERALD_BIN)" >&2
  exit 1
fi
for tool in go node; do
  command -v "$tool" >/dev/null || { echo "clients/go/test.sh: $tool is not installed (Go: https://go.dev/doc/install)" >&2; exit 1; }
done
if [[ $(go env CGO_ENABLED) != 1 ]] || ! command -v "$(go env CC)" >/dev/null; then
  echo "clients/go/test.sh: no C compiler for the race detector; install gcc (apt-get install gcc)" >&2
  exit 1
fi

start=$(date +%s)
echo "== go vet"
go vet ./...
echo "== go test -race ./..."
go test -race -count=1 -timeout 300s ./...

echo "== conformance suite (Go adapter; one node, three nodes on Redis)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/herald-conformance-adapter" ./cmd/herald-conformance-adapter
# One node, and three nodes on Redis, side by side (clients/conformance/suite.sh).
bash ../conformance/suite.sh "$tmp/herald-conformance-adapter" --herald "$HERALD_BIN"
echo "clients/go/test.sh: all passed in $(($(date +%s) - start)) s"
