#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/herald (docs/deploy.md, "Helm chart") with
# deploy/helm/validate, a small Go program on Helm's Go SDK: `helm lint` and a render for the
# chart's values and every file in deploy/helm/herald/examples/, every rendered object decoded
# strictly into its Kubernetes type (unknown fields refused), and the drain invariants (probes on
# /ready and /health, grace period above preStop + drain_ms, liveness outlasting the drain,
# drain_ms the binary's default unless overridden, non-root). With a herald binary (HERALD_BIN,
# default target/debug/herald when built) the in-memory cases are also started with the rendered
# settings: /health and /ready answer 200, SIGTERM exits 0, and the HPA's metric is on /metrics;
# the Redis, Redis Cluster and NATS cases are started with their broker URL on a closed port and
# must stop at connecting to it (every setting the chart passes accepted).
#
#   bash scripts/helm-test.sh            the check
#   bash scripts/helm-test.sh selftest   the check must fail on broken copies of the chart
#
# Needs Go on PATH: 1.26 or later, or 1.21 or later, which fetches the 1.26 toolchain that
# deploy/helm/validate/go.mod asks for through the Go proxy by itself. Modules come from the Go
# proxy (go.sum pins them). The program is built into target/helm-validate/ (cold caches: 5 min
# on a busy 2-core machine, 2 min of CPU, 250 MB of modules and 400 MB of build cache; warm: 2 s in
# all).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

fail() { echo "helm-test: FAIL: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "go not found: install Go 1.26 or later (https://go.dev/dl/)"
mkdir -p target/helm-validate
bin=$repo/target/helm-validate/validate
(cd deploy/helm/validate && nice go build -mod=readonly -o "$bin" .) ||
  fail "building deploy/helm/validate"

herald_bin=${HERALD_BIN:-}
if [ -z "$herald_bin" ] && [ -x target/debug/herald ]; then
  herald_bin=target/debug/herald
fi
herald_args=()
if [ -n "$herald_bin" ]; then
  [ -x "$herald_bin" ] || fail "HERALD_BIN: no executable at $herald_bin"
  herald_args=(-herald "$(readlink -f "$herald_bin")")
fi

validate() { # CHART_DIR
  timeout 120 "$bin" -chart "$1" -examples "$1/examples" \
    -config-rs "$repo/crates/core/src/config.rs" ${herald_args[@]+"${herald_args[@]}"}
}

if [ "${1:-}" != selftest ]; then
  validate deploy/helm/herald
  exit 0
fi

# Each break: a file of the chart, a Python expression turning its text into the broken text (no
# `|` in it), and the message the check must fail with.
work=$(mktemp -d "${TMPDIR:-/tmp}/herald-helm-selftest.XXXXXX")
trap 'rm -rf "$work"' EXIT
breaks=(
  "templates/deployment.yaml|s.replace('path: /ready', 'path: /health')|readiness probe asks \"/health\""
  "values.yaml|s.replace('  periodSeconds: 10', '  periodSeconds: 2')|liveness failureThreshold 3 × periodSeconds 2 s"
  "templates/deployment.yaml|s.replace('terminationGracePeriodSeconds:', 'terminationGracePeriod:')|unknown field \"terminationGracePeriod\""
  "templates/_helpers.tpl|s.replace('add \$need 5', 'sub \$need 5')|terminationGracePeriodSeconds"
  "values.yaml|s.replace('drainMs: 5000', 'drainMs: 3000')|the binary's default drain_ms is"
  "templates/deployment.yaml|s.replace('value: {{ include \"herald.drainMs\" .', 'value: {{ print \"5000\"')|HERALD_DRAIN_MS is 5000, want 20000"
  "values.yaml|s.replace('runAsNonRoot: true', 'runAsNonRoot: false')|runAsNonRoot is not true"
  "templates/service.yaml|s.replace('targetPort: http', 'targetPort: web')|targetPort web"
  "templates/hpa.yaml|s.replace('kind: Deployment', 'kind: StatefulSet')|HPA herald scales StatefulSet"
  "templates/deployment.yaml|s.replace('gt (int .Values.replicaCount) 1', 'gt (int .Values.replicaCount) 100')|the chart renders the memory broker with 3 replicas"
  "values.schema.json|s.replace('\"additionalProperties\": false', '\"additionalProperties\": true')|the chart renders a misspelt value"
)
if [ -n "$herald_bin" ]; then
  breaks+=(
    "values.yaml|s.replace('metricName: herald_connections', 'metricName: herald_connection')|metric herald_connection is not in a node's /metrics"
    "templates/deployment.yaml|s.replace('name: HERALD_NATS__REPLICAS', 'name: HERALD_NATS__REPLICA')|nats.yaml: running herald with the rendered settings (broker unreachable): the node did not get as far as connecting"
    "templates/deployment.yaml|s.replace('value: \"0.0.0.0\"', 'value: \"0.0.0.0\"\\n            - name: HERALD_LIMITS__NO_SUCH_KEY\\n              value: \"1\"')|did not start with the chart's settings"
  )
fi
n=0
for b in "${breaks[@]}"; do
  IFS='|' read -r file expr want <<<"$b"
  n=$((n + 1))
  rm -rf "$work/herald"
  cp -r deploy/helm/herald "$work/herald"
  python3 - "$work/herald/$file" "$expr" <<'EOF'
import sys
path, expr = sys.argv[1], sys.argv[2]
s = open(path).read()
t = eval(expr, {"s": s})
if t == s:
    sys.exit(f"selftest: the break {expr} changed nothing in {path}")
open(path, "w").write(t)
EOF
  if validate "$work/herald" >"$work/out.txt" 2>&1; then
    cat "$work/out.txt"
    fail "selftest $n ($file: $expr): the check passed on a broken chart"
  fi
  grep -qF -- "$want" "$work/out.txt" ||
    { cat "$work/out.txt"; fail "selftest $n ($file: $expr): failed without '$want'"; }
  echo "ok   selftest $n: $file: $(grep -m1 -F -- "$want" "$work/out.txt" | sed 's/^ *- //')"
done
echo "helm-test selftest: OK ($n broken charts refused)"
