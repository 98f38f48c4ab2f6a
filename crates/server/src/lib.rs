//! # herald-server: the `herald` binary's library
//!
//! `main` parses flags and config, sets up logging, binds, and calls [`serve::run`].
//!
//! # Layout
//! - [`settings`]: loading the config from a TOML file, `HERALD_*` variables and flags.
//! - [`reload`]: configuration reload (`SIGHUP`, `POST /admin/api/reload`): what is applied
//!   live, what waits for a restart, the loaded version.
//! - [`serve`]: the accept loop (plain or TLS), connections per IP and graceful drain.
//! - [`guard`]: who may reach the node: `Origin` checks, the `--dev` `Host` check, per-IP counts.
//! - [`state`]: `App`, the node's application state every handler and connection reaches (the
//!   hub, config, counters, the drain; no protocol's own state).
//! - [`http`]: request routing, the one route table: `/ws`, `/api/*`, `/health`, `/metrics`, the
//!   demo page, `/admin`, the Pusher and stream endpoints; and `http::Node`, the `App` with each
//!   protocol's own state (the Pusher apps, the admin UI, the emulated sessions), which the
//!   routes hand to that protocol's handlers only.
//! - [`response`]: HTTP response helpers the handlers share, and the JSON error answer.
//! - [`api`]: the HTTP API handlers.
//! - [`admin`]: the admin web UI under `/admin` (embedded page, login, cluster-wide views).
//! - [`cluster`]: what nodes share through broker presence sets and how a node reads it back
//!   (entries keyed by node, which nodes count, channel counts summed over the cluster): the
//!   admin's cluster view, the Pusher census and the Pusher occupancy webhooks use it.
//! - [`publishing`]: publish and broadcast commands in the HTTP API's shape, run concurrently
//!   with one idempotency key (the API and the outbox and Kafka consumers share it).
//! - `handshake`: the WebSocket opening handshake both WebSocket endpoints share.
//! - `compression`: permessage-deflate for both WebSocket endpoints: the offer, the answer, and
//!   compressed messages (a fan-out's frame compressed once per worker thread).
//! - `engine`: the one connection engine. `engine::driver::Driver` is the loop every client
//!   connection runs (queued frames, the client's input, a timer, the drain: read, dispatch,
//!   write in batches, close), generic over a `Transport` (what carries frames: write a batch,
//!   flush, close with a code, the client's input) and a `Protocol` (the session: Herald's or
//!   Pusher's). `engine::policy` holds what every connection shares once: the write timeout,
//!   slow-consumer counting, the drain's close, the ping schedule. `engine::herald` is Herald's
//!   protocol (the `Session`, running a client's text messages, and `limits.max_connections`,
//!   counted over connections that completed `connect`, so sockets that never authenticate
//!   cannot lock others out); `engine::liveness` its timers (handshake, pings and pongs, token
//!   expiry; a one-way stream owes no pongs). The transports are adapters in their endpoints'
//!   modules: `ws::connection` (Herald's WebSocket, with the fan-out's direct writes),
//!   `pusher::ws` (Pusher's WebSocket and Pusher's protocol), `uni::run` (SSE and NDJSON),
//!   `emulation::run` (emulated WebSocket: `POST`s up, SSE down).
//! - [`ws`]: the `/ws` upgrade and the WebSocket connection's task.
//! - [`tls`]: rustls server config from PEM files.
//! - [`brokers`]: choosing the broker from `broker_url`.
//! - [`token`]: `herald token`, minting HS256 tokens for development.
//! - [`uni`]: one-way transports: Server-Sent Events and NDJSON streaming.
//! - [`emulation`]: WebSocket emulation for networks that block WebSocket: SSE down, POST up.
//! - [`jwks`]: token keys fetched from a JWKS URL, cached and refreshed on an unknown `kid`.
//! - [`proxy`]: proxy hooks: the HTTP client calling the application's backend, and the
//!   headers and cookies forwarded to it.
//! - `pusher`: the Pusher Channels protocol (`/app/{key}`, `/apps/{id}/…`) on the same hub
//!   (cargo feature `pusher`, on by default; without it none of `src/pusher` is built, the
//!   paths answer 404 and a config that names a Pusher app is refused at start-up).
//! - [`consumers`]: publish and broadcast commands drained from outside sources (a PostgreSQL
//!   transactional outbox, Kafka topics; docs/consumers.md).
//! - [`lifecycle`]: connect/subscribe/unsubscribe/disconnect events as a durable stream to the
//!   application (docs/lifecycle.md).
//! - [`centrifugo`]: Centrifugo's server HTTP API at `/centrifugo/api/<method>`, and the decoding
//!   of Centrifugo's publish commands the consumers share (docs/migrating-from-centrifugo.md).
//!
//! # Layers
//! Lowest first; a module uses its own layer or those below, never one above (`layers.rs`
//! lists them and its tests fail on a use that points up, or a cycle within a layer):
//! 1. foundations, which know no `App`: `response`, `guard`, `compression`, `tls`, `token`,
//!    `brokers`, `jwks`, `proxy`, `settings`, `reload`, `publishing`, `batch`, `cluster`, `otel`,
//!    `lifecycle`;
//! 2. `state`;
//! 3. `engine`, `handshake`;
//! 4. protocols and their handlers: `ws`, `pusher`, `uni`, `emulation`, `api`, `admin`,
//!    `consumers`, `centrifugo`;
//! 5. `http` (the route table and `http::Node`);
//! 6. `serve` (the accept loop, which assembles the node); then `main`.

pub mod admin;
pub mod api;
pub mod batch;
pub mod brokers;
pub mod centrifugo;
pub mod cluster;
mod compression;
pub mod consumers;
pub mod emulation;
mod engine;
pub mod guard;
mod handshake;
pub mod http;
pub mod jwks;
#[cfg(test)]
mod layers;
pub mod lifecycle;
pub mod otel;
pub mod proxy;
pub mod publishing;
#[cfg(feature = "pusher")]
pub mod pusher;
pub mod reload;
pub mod response;
pub mod serve;
pub mod settings;
pub mod state;
pub mod tls;
pub mod token;
pub mod uni;
pub mod ws;
