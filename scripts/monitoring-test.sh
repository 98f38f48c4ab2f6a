#!/usr/bin/env bash
# Checks the monitoring files (docs/deploy.md, "Monitoring"):
#   - deploy/prometheus/herald-alerts.yml: `promtool check rules`, then its unit tests
#     (herald-alerts.test.yml) with `promtool test rules`;
#   - every `runbook_url: docs/deploy.md#anchor` in it is a heading of docs/deploy.md;
#   - deploy/grafana/herald.json: JSON, with a `datasource` variable, and every panel (rows
#     aside) with a data source and at least one target with an expression.
# promtool comes from Debian's `prometheus` package, installed (alone, quietly) when missing.
# That every metric these files name exists on a live node is checked by
# `cargo test -p herald-server --test dashboards`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
  echo "== installing promtool (Debian package prometheus)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

promtool check rules deploy/prometheus/herald-alerts.yml
promtool test rules deploy/prometheus/herald-alerts.test.yml

python3 - <<'EOF'
import json
import re
import sys

errors = []

# Runbook anchors: GitHub's anchor of a heading is its text lower-cased, punctuation dropped,
# spaces turned into hyphens.
def anchor(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")

with open("docs/deploy.md") as f:
    anchors = {anchor(l.lstrip("#")) for l in f if l.startswith("#")}
with open("deploy/prometheus/herald-alerts.yml") as f:
    rules = f.read()
runbooks = re.findall(r"runbook_url:\s*\"?([^\"\n]+)\"?", rules)
alerts = re.findall(r"- alert:\s*(\S+)", rules)
if len(runbooks) != len(alerts):
    errors.append(f"herald-alerts.yml: {len(alerts)} alerts but {len(runbooks)} runbook_url")
for url in runbooks:
    path, _, frag = url.partition("#")
    if path != "docs/deploy.md" or frag not in anchors:
        errors.append(f"herald-alerts.yml: runbook_url {url} is not a heading of docs/deploy.md")

with open("deploy/grafana/herald.json") as f:
    dashboard = json.load(f)
variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
ds = variables.get("datasource")
if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
    errors.append("herald.json: no `datasource` variable of type datasource for prometheus")
if not isinstance(dashboard.get("schemaVersion"), int):
    errors.append("herald.json: no schemaVersion")

def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))

count = 0
ids = set()
for p in panels(dashboard.get("panels", [])):
    title = p.get("title", "?")
    if p.get("id") in ids:
        errors.append(f"herald.json: panel {title!r}: id {p.get('id')} used twice")
    ids.add(p.get("id"))
    if p.get("type") == "row":
        continue
    count += 1
    if (p.get("datasource") or {}).get("uid") != "${datasource}":
        errors.append(f"herald.json: panel {title!r} has no datasource ${{datasource}}")
    targets = p.get("targets") or []
    if not targets:
        errors.append(f"herald.json: panel {title!r} has no targets")
    for t in targets:
        if not (t.get("expr") or "").strip():
            errors.append(f"herald.json: panel {title!r}: target {t.get('refId')} has no expr")
        if (t.get("datasource") or {}).get("uid") != "${datasource}":
            errors.append(f"herald.json: panel {title!r}: target {t.get('refId')} has no datasource")
if count == 0:
    errors.append("herald.json: no panels")

for e in errors:
    print(e, file=sys.stderr)
if errors:
    sys.exit(1)
print(f"herald.json: {count} panels, each with a data source and targets; "
      f"{len(runbooks)} runbook anchors found in docs/deploy.md")
EOF
