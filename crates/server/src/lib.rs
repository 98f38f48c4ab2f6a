//! # herald-server: the `herald` binary's library
//!
//! `main` parses flags and config, sets up logging, binds, and calls [`serve::run`].
//!
//! # Layout
//! - [`settings`]: loading the config from a TOML file, `HERALD_*` variables and flags.
//! - [`serve`]: the accept loop (plain or TLS), connection limit and graceful drain.
//! - [`http`]: request routing: `/ws`, `/api/*`, `/health`, `/metrics`, the demo page.
//! - [`api`]: the HTTP API handlers.
//! - [`ws`]: one WebSocket connection's task: read, dispatch, write in batches, ping, close.
//! - [`tls`]: rustls server config from PEM files.
//! - [`brokers`]: choosing the broker from `broker_url`.
//! - [`token`]: `herald token`, minting HS256 tokens for development.

pub mod api;
pub mod brokers;
pub mod http;
pub mod serve;
pub mod settings;
pub mod tls;
pub mod token;
pub mod ws;
