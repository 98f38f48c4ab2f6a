//! # herald-server: the `herald` binary's library
//!
//! `main` parses flags and config, sets up logging, binds, and calls [`serve::run`].
//!
//! # Layout
//! - [`settings`]: loading the config from a TOML file, `HERALD_*` variables and flags.
//! - [`serve`]: the accept loop (plain or TLS), connections per IP and graceful drain.
//! - [`guard`]: who may reach the node: `Origin` checks, the `--dev` `Host` check, per-IP counts.
//! - [`state`]: `App`, the node's application state every handler and connection reaches.
//! - [`http`]: request routing, the one route table: `/ws`, `/api/*`, `/health`, `/metrics`, the
//!   demo page, `/admin`, the Pusher and stream endpoints.
//! - [`response`]: HTTP response helpers the handlers share.
//! - [`api`]: the HTTP API handlers.
//! - [`admin`]: the admin web UI under `/admin` (embedded page, login, cluster-wide views).
//! - [`publishing`]: publish and broadcast commands in the HTTP API's shape, run concurrently
//!   with one idempotency key (the API and the outbox and Kafka consumers share it).
//! - `handshake`: the WebSocket opening handshake both WebSocket endpoints share.
//! - `compression`: permessage-deflate for both WebSocket endpoints: the offer, the answer, and
//!   compressed messages (a fan-out's frame compressed once per worker thread).
//! - [`ws`]: the `/ws` upgrade and running a client's text message (shared with emulated
//!   connections); it also enforces `limits.max_connections` (counted over connections that
//!   completed `connect`, so sockets that never authenticate cannot lock others out).
//!   `ws::connection`: one WebSocket connection's task, a `Connection` with one method per event
//!   (queued frames, a client message, a timer, the drain): read, dispatch, write in batches,
//!   ping, close.
//! - `liveness`: a two-way connection's timers (handshake, pings and pongs, token expiry), shared
//!   by WebSocket and emulated connections.
//! - [`tls`]: rustls server config from PEM files.
//! - [`brokers`]: choosing the broker from `broker_url`.
//! - [`token`]: `herald token`, minting HS256 tokens for development.
//! - [`uni`]: one-way transports: Server-Sent Events and NDJSON streaming.
//! - [`emulation`]: WebSocket emulation for networks that block WebSocket: SSE down, POST up.
//! - [`jwks`]: token keys fetched from a JWKS URL, cached and refreshed on an unknown `kid`.
//! - [`proxy`]: proxy hooks: the HTTP client calling the application's backend, and the
//!   headers and cookies forwarded to it.
//! - [`pusher`]: the Pusher Channels protocol (`/app/{key}`, `/apps/{id}/…`) on the same hub.
//! - [`consumers`]: publish and broadcast commands drained from outside sources (a PostgreSQL
//!   transactional outbox, Kafka topics; docs/consumers.md).

pub mod admin;
pub mod api;
pub mod brokers;
mod compression;
pub mod consumers;
pub mod emulation;
pub mod guard;
mod handshake;
pub mod http;
pub mod jwks;
mod liveness;
pub mod proxy;
pub mod publishing;
pub mod pusher;
pub mod response;
pub mod serve;
pub mod settings;
pub mod state;
pub mod tls;
pub mod token;
pub mod uni;
pub mod ws;
