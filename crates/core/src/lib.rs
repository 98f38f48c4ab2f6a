//! # herald-core: the hub and everything it needs
//!
//! Knows no HTTP, no WebSocket and no Redis: the server drives [`session::Session`]s with parsed
//! messages and drains their [`outbound::Outbound`] queues; brokers plug in behind
//! [`herald_broker::Broker`].
//!
//! # Layout
//! - [`config`]: the configuration model, every key with its default.
//! - [`auth`]: JWT verification of connection and subscription tokens.
//! - [`namespace`]: channel names and namespaces.
//! - [`permission`]: who may do what on a channel, the one decision every command asks.
//! - [`hub`]: channels → local subscribers, fan-out, continuity, the client registry.
//! - [`live`]: the configuration in force, which a configuration reload replaces.
//! - `flights`: subscribers asking the broker the same history question at once share one read.
//! - [`lifecycle`]: the hub's connect/subscribe/unsubscribe/disconnect events, for a sink.
//! - [`outbound`]: a connection's bounded outbound queue.
//! - [`proxy`]: proxy hooks, the application backend deciding per event over HTTP.
//! - [`recovery`]: the all-or-nothing recovery decision.
//! - [`session`]: one connection's protocol state and command handling.
//! - [`rate`]: the per-connection command rate limit.
//! - [`metrics`]: Prometheus metrics.

pub mod auth;
pub mod config;
pub mod delta;
mod flights;
pub mod hub;
pub mod lifecycle;
pub mod live;
pub mod metrics;
pub mod namespace;
pub mod outbound;
pub mod permission;
pub mod proxy;
pub mod rate;
pub mod recovery;
pub mod session;
pub mod trace;

pub use config::Config;
pub use hub::Hub;
pub use metrics::Metrics;
pub use outbound::Outbound;
pub use session::{NodeContext, Session};
