#!/usr/bin/env bash
# Fetches Apache Kafka's server jars (and their runtime dependencies) from Maven Central into a
# cache folder, for the tests that start a real single-node KRaft broker (herald-testkit's
# kafka module). Nothing is fetched when the cache is complete. Prints the folder.
#
#   scripts/kafka-jars.sh            # -> ~/.cache/herald/kafka-<version>
#   HERALD_KAFKA_VERSION=4.1.1 HERALD_KAFKA_JARS=/some/dir scripts/kafka-jars.sh
#
# The testkit looks in the same place (HERALD_KAFKA_JARS, else ~/.cache/herald/kafka-<version>).
set -euo pipefail

version="${HERALD_KAFKA_VERSION:-4.1.1}"
dest="${HERALD_KAFKA_JARS:-${HOME}/.cache/herald/kafka-${version}}"

# A marker written last, so an interrupted fetch is redone rather than half-used.
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi

command -v mvn >/dev/null 2>&1 || { echo "mvn is needed to fetch Kafka's jars (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null 2>&1 || { echo "java (17+) is needed to run Kafka (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# kafka_2.13 is the broker (kafka.Kafka, kafka.tools.StorageTool); log4j's SLF4J binding lets the
# testkit send the broker's log to a file and wait for its "started" line.
cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>herald.test</groupId>
  <artifactId>kafka-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>${version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>2.24.3</version>
    </dependency>
  </dependencies>
</project>
POM

mkdir -p "$dest"
echo "== fetching Kafka ${version} jars into $dest" >&2
mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$dest" >&2
touch "$dest/.complete"
echo "$dest"
