#!/usr/bin/env bash
# Herald's Python SDK: type check (mypy --strict), unit tests (pytest, some against a real herald node) and the cross-SDK
# conformance suite with the Python adapter.
#   bash clients/python/test.sh
# Creates or reuses a virtual environment in clients/python/.venv and installs the package (editable)
# with its test dependencies from PyPI, again only when pyproject.toml changed. HERALD_BIN is the
# server binary (default <repo>/target/debug/herald, built with cargo when missing). Needs python3
# (3.9+) and node (18+, for the conformance driver). Exits non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$here"

export HERALD_BIN=${HERALD_BIN:-$repo/target/debug/herald}
case $HERALD_BIN in /*) ;; *) HERALD_BIN=$repo/$HERALD_BIN ;; esac
if [[ ! -x $HERALD_BIN ]]; then
  echo "== $HERALD_BIN missing: cargo build -p herald-server"
  (cd "$repo" && cargo build -p herald-server)
fi
command -v node >/dev/null || { echo "node (18+) is needed for the conformance driver" >&2; exit 1; }
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
  || { echo "python3 3.9+ is needed ($(python3 --version 2>&1))" >&2; exit 1; }

venv=$here/.venv
if [[ ! -x $venv/bin/python ]]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi
stamp=$venv/.herald-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]] || ! "$venv/bin/python" -c 'import herald, websockets, pytest, mypy' 2>/dev/null; then
  echo "== pip install -e '.[test]'"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
  touch "$stamp"
fi

echo "== mypy --strict (the package's type hints)"
"$venv/bin/python" -m mypy --strict --cache-dir "$venv/.mypy_cache" src/herald

start=$(date +%s)
echo "== pytest (clients/python/tests)"
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests
echo "pytest: $(($(date +%s) - start)) s"

start=$(date +%s)
echo "== conformance suite, Python adapter (one node; three nodes on Redis)"
# One node, and three nodes on Redis, side by side (clients/conformance/suite.sh).
bash "$repo/clients/conformance/suite.sh" "'$venv/bin/python' adapters/python/adapter.py" --herald "$HERALD_BIN"
echo "conformance (python): $(($(date +%s) - start)) s"
