#!/usr/bin/env bash
# Peers for side-by-side benchmarks (docs/bench/peers/README.md): other real-time servers built from
# their public registries into a cache outside the tree, and started with settings that match
# docs/bench/bench.toml. Never commit their sources or binaries.
#
#   scripts/peers.sh build centrifugo            # go install from the Go module proxy
#   scripts/peers.sh build sockudo               # cargo install from crates.io (a long build)
#   scripts/peers.sh build socketio              # npm install socket.io (pinned) from npm
#   ANYCABLE_SRC=DIR scripts/peers.sh build anycable  # go build from a checkout of v1.6.16
#   scripts/peers.sh start centrifugo --port N   # execs the server (herald-bench --server-cmd)
#   scripts/peers.sh config centrifugo --port N  # print the configuration only (for socketio and
#                                                # anycable: the command line, they have no file)
#   scripts/peers.sh path centrifugo             # the binary's path
#
# Centrifugo (Centrifugo's own protocol: herald-bench --centrifugo) and Sockudo (the Pusher
# protocol: herald-bench --pusher --pusher-app bench-app:bench-key:bench-secret --health-path /up).
# Socket.IO: socket.io from npm behind our own small server, scripts/peers/socketio-server.mjs
# (herald-bench --socketio --ws 'ws://HOST:N/socket.io/?EIO=4&transport=websocket');
# PEERS_SOCKETIO_REDIS=redis://host:port joins several processes with Socket.IO's Redis adapter.
# AnyCable (anycable-go in its Pusher mode: herald-bench --pusher --pusher-app
# bench-app:bench-key:bench-secret): the Go module proxy does not serve it, so the source is a
# checkout of github.com/anycable/anycable at v1.6.16 that you provide (ANYCABLE_SRC); its
# dependencies come from the module proxy.
# Environment: PEERS_DIR (default ~/.cache/herald/peers), HERALD_API_KEY (default benchkey: the
# same key herald-bench sends).
set -euo pipefail

CENTRIFUGO_VERSION=v6.9.1
SOCKUDO_VERSION=5.2.0
SOCKETIO_VERSION=4.8.4
SOCKETIO_REDIS_ADAPTER_VERSION=8.3.0
IOREDIS_VERSION=5.8.2
ANYCABLE_VERSION=v1.6.16
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/herald/peers}
API_KEY=${HERALD_API_KEY:-benchkey}

usage() {
  sed -n '2,23p' "$0" >&2
  exit 2
}

bin_path() {
  case $1 in
    centrifugo) echo "$PEERS_DIR/centrifugo-$CENTRIFUGO_VERSION/centrifugo" ;;
    sockudo) echo "$PEERS_DIR/sockudo-$SOCKUDO_VERSION/bin/sockudo" ;;
    socketio) command -v node ;;
    anycable) echo "$PEERS_DIR/anycable-$ANYCABLE_VERSION/anycable-go" ;;
    *) usage ;;
  esac
}

build() {
  local peer=$1 dir
  case $peer in
    centrifugo)
      dir=$PEERS_DIR/centrifugo-$CENTRIFUGO_VERSION
      mkdir -p "$dir"
      # The module proxy's published version; CGO off: a static binary, as upstream releases it.
      # The version string is set with -X as upstream's release build does.
      CGO_ENABLED=0 GOBIN=$dir nice -n 19 go install -trimpath \
        -ldflags "-X github.com/centrifugal/centrifugo/v6/internal/build.Version=${CENTRIFUGO_VERSION#v}" \
        "github.com/centrifugal/centrifugo/v6@$CENTRIFUGO_VERSION"
      ;;
    sockudo)
      # The published crate with its own lock file and release profile; its build directory
      # stays outside the tree (tens of minutes on 2 cores, several GB). Its own CARGO_HOME:
      # `cargo install` holds the package cache's lock for its whole build, which would stall
      # every other cargo command on the machine for as long.
      dir=$PEERS_DIR/sockudo-$SOCKUDO_VERSION
      mkdir -p "$dir"
      # Its metrics exporter compiles a .proto file at build time.
      command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler; }
      CARGO_HOME=$PEERS_DIR/cargo-home CARGO_TARGET_DIR=${PEERS_BUILD_DIR:-$PEERS_DIR/build-sockudo} \
        RUSTUP_TOOLCHAIN=${RUSTUP_TOOLCHAIN:-stable} nice -n 19 \
        "$(rustup which cargo 2>/dev/null || command -v cargo)" install sockudo \
        --version "$SOCKUDO_VERSION" --locked --root "$dir"
      ;;
    anycable)
      [ -f "${ANYCABLE_SRC:-}/cmd/anycable-go/main.go" ] || {
        echo "peers.sh: set ANYCABLE_SRC to a checkout of github.com/anycable/anycable at $ANYCABLE_VERSION" >&2
        exit 1
      }
      dir=$PEERS_DIR/anycable-$ANYCABLE_VERSION
      mkdir -p "$dir"
      # Without the mruby tag (`mrb`, optional upstream) and without cgo: a static binary.
      (cd "$ANYCABLE_SRC" && CGO_ENABLED=0 nice -n 19 go build -trimpath -o "$dir/anycable-go" ./cmd/anycable-go)
      # Not `anycable-go version`: that starts a server.
      "$dir/anycable-go" --version
      return
      ;;
    socketio)
      # The npm package at a pinned version, with its own lock of what npm resolved (recorded in
      # docs/bench/peers/socketio/README.md). No optional native add-ons (bufferutil,
      # utf-8-validate): what `npm install socket.io` gives.
      command -v npm >/dev/null || { echo "peers.sh: npm missing" >&2; exit 1; }
      dir=$PEERS_DIR/socketio-$SOCKETIO_VERSION
      mkdir -p "$dir"
      # With Socket.IO's Redis adapter over ioredis, for several processes (start --redis URL).
      nice -n 19 npm install --prefix "$dir" --save-exact --no-audit --no-fund "socket.io@$SOCKETIO_VERSION" \
        "@socket.io/redis-adapter@$SOCKETIO_REDIS_ADAPTER_VERSION" "ioredis@$IOREDIS_VERSION"
      echo "node $(node --version), socket.io $(node -p "require('$dir/node_modules/socket.io/package.json').version")"
      return
      ;;
    *) usage ;;
  esac
  "$(bin_path "$peer")" version 2>/dev/null || "$(bin_path "$peer")" --version 2>/dev/null || true
}

# Centrifugo v6 configuration matching docs/bench/bench.toml: anonymous clients connect without a
# token and subscribe to channels without a namespace; history of 1000 for 300 s; no presence and
# no join/leave; the HTTP API behind the bench's key. `force_recovery` makes every subscription
# recoverable, so that the subscribe reply carries the stream position (epoch, offset) as Herald's
# does. `client.insecure` stays off: the bench does not need it.
# PEERS_CENTRIFUGO_WRITE_BUFFER_POOL=1 adds `websocket.use_write_buffer_pool` (Centrifugo's own knob
# for many mostly idle connections: a shared write buffer instead of one per connection); off by
# default, as Centrifugo ships. PEERS_CENTRIFUGO_REDIS=redis://host:port puts the node on Centrifugo's
# Redis engine (broker and history in that Redis, as Herald's HERALD_BROKER_URL does), so that
# several nodes share channels; PEERS_CENTRIFUGO_REDIS_CLUSTER=host:port,host:port,... on a Redis
# Cluster; PEERS_CENTRIFUGO_NATS=nats://host:port on its NATS broker (no history there, see below).
centrifugo_config() {
  local port=$1 ws=""
  if [ "${PEERS_CENTRIFUGO_WRITE_BUFFER_POOL:-0}" = 1 ]; then
    ws=$'\n  "websocket": { "use_write_buffer_pool": true },'
  fi
  local history=$'"history_size": 1000,\n      "history_ttl": "300s",\n      "force_recovery": true,'
  if [ -n "${PEERS_CENTRIFUGO_REDIS:-}" ]; then
    ws+=$'\n  "engine": { "type": "redis", "redis": { "address": ["'"$PEERS_CENTRIFUGO_REDIS"$'"] } },'
  elif [ -n "${PEERS_CENTRIFUGO_REDIS_CLUSTER:-}" ]; then
    ws+=$'\n  "engine": { "type": "redis", "redis": { "cluster_address": ["'"$PEERS_CENTRIFUGO_REDIS_CLUSTER"$'"] } },'
  elif [ -n "${PEERS_CENTRIFUGO_NATS:-}" ]; then
    # Centrifugo's NATS broker carries publications only ("does not support history, recovery or
    # cache"), so the namespace keeps none: a weaker guarantee than Herald's JetStream history.
    ws+=$'\n  "broker": { "enabled": true, "type": "nats", "nats": { "url": "'"$PEERS_CENTRIFUGO_NATS"$'" } },'
    history=""
  fi
  cat <<EOF
{
  "log": { "level": "error" },$ws
  "http_server": { "address": "127.0.0.1", "port": $port },
  "health": { "enabled": true },
  "prometheus": { "enabled": true },
  "http_api": { "key": "$API_KEY" },
  "client": {
    "allow_anonymous_connect_without_token": true,
    "allowed_origins": ["*"]
  },
  "channel": {
    "without_namespace": {
      "allow_subscribe_for_client": true,
      "allow_subscribe_for_anonymous": true,
      $history
      "presence": false,
      "join_leave": false
    }
  }
}
EOF
}

# AnyCable's settings, all flags (see `start`).
anycable_args() {
  echo --public --host 127.0.0.1 --port "$1" --log_level warn \
    --pusher_app_id bench-app --pusher_app_key bench-key --pusher_secret bench-secret \
    --broadcast_adapter http
}

# Sockudo configuration matching docs/bench/pusher.toml's app (bench-app, bench-key,
# bench-secret): one node, local adapter, in-memory app manager, cache and queue. Its rate limiter
# is off: by default it admits 20 WebSocket connections a minute per address and 100 API requests
# a minute, which Herald's bench configuration has no counterpart of. Metrics on port + 1000.
# History and recovery stay at Sockudo's defaults: plain Pusher has neither, and the broadcast and
# idle scenarios that `--pusher-app` runs do not use them.
sockudo_config() {
  local port=$1
  cat <<EOF
{
  "host": "127.0.0.1",
  "port": $port,
  "debug": false,
  "app_manager": {
    "driver": "memory",
    "array": {
      "apps": [
        {
          "id": "bench-app",
          "key": "bench-key",
          "secret": "bench-secret",
          "enabled": true,
          "enable_client_messages": false,
          "max_connections": 100000
        }
      ]
    }
  },
  "adapter": { "driver": "local" },
  "cache": { "driver": "memory" },
  "queue": { "driver": "none" },
  "rate_limiter": { "enabled": false },
  "metrics": { "enabled": true, "host": "127.0.0.1", "port": $((port + 1000)) }
}
EOF
}

start() {
  local peer=$1 port=8000 conf bin
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --port) port=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  if [ "$peer" = socketio ]; then
    local dir=$PEERS_DIR/socketio-$SOCKETIO_VERSION
    [ -d "$dir/node_modules/socket.io" ] ||
      { echo "peers.sh: $dir missing; run: scripts/peers.sh build socketio" >&2; exit 1; }
    # One Node process (single-threaded), Socket.IO's defaults: scripts/peers/socketio-server.mjs.
    # PEERS_SOCKETIO_REDIS=URL: one of several processes, joined by Socket.IO's Redis adapter.
    local redis=()
    if [ -n "${PEERS_SOCKETIO_REDIS:-}" ]; then
      [ -d "$dir/node_modules/@socket.io/redis-adapter" ] ||
        { echo "peers.sh: the Redis adapter is missing from $dir; run: scripts/peers.sh build socketio" >&2; exit 1; }
      redis=(--redis "$PEERS_SOCKETIO_REDIS")
    fi
    HERALD_API_KEY=$API_KEY PEERS_SOCKETIO_DIR=$dir \
      exec node "$(dirname "$0")/peers/socketio-server.mjs" --port "$port" "${redis[@]}"
  fi
  if [ "$peer" = anycable ]; then
    bin=$(bin_path anycable)
    [ -x "$bin" ] || { echo "peers.sh: $bin missing; run: ANYCABLE_SRC=DIR scripts/peers.sh build anycable" >&2; exit 1; }
    # Pusher mode with docs/bench/pusher.toml's app; `--public`: every connection and stream
    # allowed without an RPC backend (Herald's bench runs anonymous too); no broker (no history,
    # as plain Pusher); broadcasts only through the Pusher trigger API (`http` adapter, not Redis).
    exec "$bin" $(anycable_args "$port")
  fi
  bin=$(bin_path "$peer")
  [ -x "$bin" ] || { echo "peers.sh: $bin missing; run: scripts/peers.sh build $peer" >&2; exit 1; }
  # One file per peer and port, rewritten at every start.
  conf=${TMPDIR:-/tmp}/herald-peer-$peer-$port.json
  case $peer in
    centrifugo)
      centrifugo_config "$port" >"$conf"
      exec "$bin" --config "$conf"
      ;;
    sockudo)
      sockudo_config "$port" >"$conf"
      exec "$bin" --config "$conf"
      ;;
  esac
}

[ $# -ge 2 ] || usage
cmd=$1
shift
case $cmd in
  build) build "$1" ;;
  start) start "$@" ;;
  path) bin_path "$1" ;;
  config)
    peer=$1; shift
    port=8000
    [ "${1:-}" = --port ] && port=$2
    case $peer in
      centrifugo|sockudo) "${peer}_config" "$port" ;;
      # No configuration file: their settings are the command line `start` runs.
      socketio) echo "node scripts/peers/socketio-server.mjs --port $port  # socket.io $SOCKETIO_VERSION, its defaults; HERALD_API_KEY=$API_KEY" ;;
      anycable) echo "anycable-go $(anycable_args "$port")  # $ANYCABLE_VERSION" ;;
      *) usage ;;
    esac
    ;;
  *) usage ;;
esac
