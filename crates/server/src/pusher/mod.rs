//! Pusher Channels protocol 7 on Herald's hub: Pusher clients (pusher-js, Laravel Echo, the
//! mobile SDKs) and Pusher server SDKs work against a Herald node, single or multi-node.
//!
//! # Layout
//! - [`apps`]: `[[pusher.apps]]` and `HERALD_PUSHER_APP_*`, and the channel mapping: Pusher
//!   channel `X` of app `ID` is the Herald channel `pusher:ID:X`; the apps in force, replaceable
//!   at run time.
//! - [`apps_db`]: apps read from a PostgreSQL table (`[pusher.postgres]`), polled.
//! - [`auth`]: channel authorization and HTTP request signatures.
//! - [`codes`]: the Pusher close and error codes Herald sends.
//! - [`wire`]: protocol messages and the envelope a Pusher event travels in.
//! - [`limits`]: Pusher's size limits (event names, presence `user_info`).
//! - [`conn`]: one connection's subscriptions, presence and client events.
//! - [`shared`]: each publication translated into a Pusher event once for all its subscribers.
//! - `direct`: the fan-out writes those events to the sockets itself, without waking each
//!   connection's task.
//! - [`ws`]: the WebSocket endpoint `/app/{key}`.
//! - [`api`]: the HTTP API `/apps/{id}/…`.
//! - [`census`]: subscriptions per channel counted for the cluster, for the API's channel queries.
//! - [`counting`]: `pusher_internal:subscription_count` pushed to subscribers (opt-in per app).
//! - [`watchlist`]: watchlist events (opt-in per app): watched users online and offline.
//! - [`webhooks`]: batched, signed, retried webhooks; occupancy decided cluster-wide.
//! - this file: [`Node`], what the endpoints are handed: the node's `App` and the Pusher apps
//!   (kept here, not in `App`: the node's state knows no protocol, crate::layers).
//!
//! docs/pusher.md describes what is supported and how it differs from hosted Pusher.
//!
//! Built with the `pusher` cargo feature (on by default). Without it this module is not built:
//! `http` has no Pusher routes (the paths answer 404) and `serve` refuses a config that names a
//! Pusher app.

pub mod api;
pub mod apps;
pub mod apps_db;
pub mod auth;
pub mod census;
pub mod codes;
pub mod conn;
pub mod counting;
mod direct;
pub mod limits;
pub mod shared;
pub mod watchlist;
pub mod webhooks;
pub mod wire;
pub mod ws;

use std::sync::Arc;

pub use apps::Apps;

use crate::state::App;

/// The node as the Pusher endpoints see it: the node's state and the Pusher apps (none
/// configured: `/app/*` closes with 4001, `/apps/*` answers 404). Every Pusher connection keeps
/// one handle to it.
pub struct Node {
    /// The node's state.
    pub state: Arc<App>,
    /// The Pusher apps, their settings, webhooks and census.
    pub apps: Apps,
}
