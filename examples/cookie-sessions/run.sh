#!/usr/bin/env bash
# Run the example: the app on :8080 (its hooks for Herald on 127.0.0.1:8081) and Herald on :8100,
# beside a quick-start node on :8000. Ports: APP_PORT, HOOK_PORT, HERALD_PORT.
# Herald is the release binary the quick start builds (`cargo run --release`), built when missing;
# HERALD_BIN picks another. Open http://127.0.0.1:8080/ in a browser, sign in, chat. Ctrl-C stops
# both.
set -euo pipefail
cd "$(dirname "$0")"
root=../..
app_port=${APP_PORT:-8080}
hook_port=${HOOK_PORT:-8081}
herald_port=${HERALD_PORT:-8100}
herald=${HERALD_BIN:-$root/target/release/herald}
if [[ ! -x $herald ]]; then
  (cd "$root" && cargo build --release -p herald-server)
fi
if [[ ! -f $root/clients/js/demo/herald.js ]]; then
  echo "clients/js/demo/herald.js is missing (it is committed; run npm run build in clients/js)" >&2
  exit 1
fi
for port in "$app_port" "$hook_port" "$herald_port"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is taken; set APP_PORT, HOOK_PORT or HERALD_PORT" >&2
    exit 1
  fi
done
export HERALD_API_KEY=${HERALD_API_KEY:-example-key}
config=$(mktemp -d)
trap 'kill ${app:-} 2>/dev/null; rm -rf "$config"' EXIT
sed -e "s/127\.0\.0\.1:8081/127.0.0.1:$hook_port/" -e "s/:8080\"/:$app_port\"/g" herald.toml >"$config/herald.toml"
HERALD_WS=ws://127.0.0.1:$herald_port/ws HERALD_API=http://127.0.0.1:$herald_port \
  python3 app.py --port "$app_port" --hook-port "$hook_port" &
app=$!
"$herald" serve --config "$config/herald.toml" --port "$herald_port"
