#!/usr/bin/env bash
# Herald's Kotlin/JVM SDK: build and unit tests (mvn test: JUnit, some against a real herald node,
# and a Java usage test), then the whole cross-SDK conformance suite with the Kotlin adapter in
# both setups (one node; three nodes on Redis). Exits non-zero on any failure.
#   bash clients/kotlin/test.sh
# HERALD_BIN: the server binary (default target/debug/herald at the repository root; a relative path
# is taken from the repository root). Needs Java 17+, Maven 3.8+ (artifacts from Maven Central into
# the default local repository, ~/.m2, on first use), node 18+ (the conformance driver) and
# redis-server (the three-node run).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$here"

HERALD_BIN=${HERALD_BIN:-target/debug/herald}
[[ $HERALD_BIN == /* ]] || HERALD_BIN=$repo/$HERALD_BIN
export HERALD_BIN
if [[ ! -x $HERALD_BIN ]]; then
  echo "clients/kotlin/test.sh: no herald binary at $HERALD_BIN (cargo build -p herald-server, or set HERALD_BIN)" >&2
  exit 1
fi
for tool in java mvn node; do
  command -v "$tool" >/dev/null || { echo "clients/kotlin/test.sh: $tool is not installed" >&2; exit 1; }
done

start=$(date +%s)
echo "== mvn test (unit tests, tests against the real herald, Java usage test)"
# -q: only failures are printed; the classpath file lets the adapter start with plain java.
# (sed drops the bare colour resets some plugins print even with -q; pipefail keeps mvn's status.)
mvn -q -B -Dstyle.color=never test dependency:build-classpath -Dmdep.includeScope=runtime -Dmdep.outputFile=target/adapter-classpath.txt 2>&1 \
  | sed -e 's/\x1b\[0m//g' -e '/^[[:space:]]*$/d'
echo "mvn: $(($(date +%s) - start)) s"

start=$(date +%s)
echo "== conformance suite, Kotlin adapter (one node; three nodes on Redis)"
adapter="java -XX:TieredStopAtLevel=1 -cp '$(cat target/adapter-classpath.txt):$here/target/classes' dev.herald.conformance.AdapterKt"
bash "$repo/clients/conformance/suite.sh" "$adapter" --herald "$HERALD_BIN"
echo "conformance (kotlin): $(($(date +%s) - start)) s"
