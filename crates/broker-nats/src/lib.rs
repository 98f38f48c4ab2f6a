//! # Herald's Broker on NATS
//!
//! Several Herald nodes share a NATS server (or cluster) with JetStream:
//!
//! - **Targeted delivery.** A node holds one core subscription per channel it hosts, on
//!   `herald.d.<channel>`, taken when the channel's first local subscriber arrives and dropped
//!   when the last leaves. No wildcard subscription ever delivers publications; the one
//!   always-on subscription is `herald.control`.
//! - **Offsets and history in JetStream.** A publication is stored on `herald.h.<channel>` in
//!   one stream for all channels, with its epoch and offset in headers; the next offset is taken
//!   with `Nats-Expected-Last-Subject-Sequence`, so storing and numbering are one atomic step;
//!   publications that queue up on a busy channel are stored together (the `publish` module).
//!   The stream republishes each stored message to the delivery subject, so nodes receive
//!   exactly what history holds, in offset order. Channels without history go to a stream that
//!   keeps only the newest message (their offset counter).
//! - **Reconnects lose nothing.** After a reconnect the client re-subscribes, the broker waits
//!   for one server round trip (the subscriptions are then in effect) and calls
//!   [`BrokerHandler::on_reconnected`](herald_broker::BrokerHandler::on_reconnected); the hub
//!   then catches up every hosted channel from JetStream. Publishing while disconnected fails at
//!   once with [`BrokerError::Unavailable`]. A slow-consumer event (the client dropped
//!   messages) also triggers a catch-up; none is ignored, several within a second share one.
//! - **A NATS that comes back behind is noticed.** Each node remembers the newest position it saw
//!   per channel ([`herald_broker::Watermarks`]); a channel whose last stored message is below it
//!   in the same epoch (a file store that lost its last writes) starts over with a new epoch
//!   instead of handing out offsets again (the `publish` module).
//! - **A NATS that restarted is noticed without a witness.** Every stored message is stamped with
//!   the boot id kept in a memory stream that every restart of its servers empties; a channel
//!   whose last message carries another boot id starts a new epoch, whichever node reads it first
//!   (the `boot` module; `synchronous_persistence` turns this off).
//! - **Presence** lives in a memory stream with a TTL, refreshed by the node that owns each
//!   record, so a crashed node's clients expire.
//!
//! The guide with configuration keys is `docs/multi-node-nats.md`.
//!
//! # Layout
//! - [`config`]: [`NatsConfig`], the `[nats]` configuration table.
//! - `boot`: the boot id that binds epochs to the life of the NATS server(s).
//! - `broker`: [`NatsBroker`], the connection and shared state; routes each `Broker` call.
//! - `publish`: offsets by compare-and-set, per-channel tail and queue (group commit), epoch
//!   markers, rollback detection.
//! - `markers`: the epoch of a channel nobody published to yet, and its expiry.
//! - `history`: position and publication reads (link walk or ephemeral consumer).
//! - `receive`: per-channel subscription tasks, control messages, reconnect and slow-consumer
//!   catch-ups, stream recreation watch.
//! - `presence`: presence records, their refresh and expiry.
//! - `topology`: connecting (options, credentials, TLS) and the streams' set-up at connect.
//! - `streams`: creating and growing the JetStream streams.
//! - `codec`: how publications are laid out in a NATS message.
//! - [`names`]: channel names ↔ subject tokens, and every subject the broker uses.
//! - `metrics`: counters for `/metrics`.

mod admin;
mod boot;
mod broker;
mod codec;
pub mod config;
mod history;
mod markers;
mod metrics;
pub mod names;
mod presence;
mod publish;
mod receive;
mod streams;
mod topology;

use std::sync::Arc;

use herald_broker::{BrokerError, SharedBroker};

pub use broker::NatsBroker;
pub use config::{NatsConfig, Storage};

/// Connect to the NATS server(s) at `url` (comma-separated for several) as node `node`, with
/// the default configuration. This is what `HERALD_BROKER_URL=nats://…` does.
pub async fn connect(url: &str, node: &str) -> Result<SharedBroker, BrokerError> {
    let urls = url
        .split(',')
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect();
    connect_with(
        NatsConfig {
            urls,
            ..NatsConfig::default()
        },
        node,
    )
    .await
}

/// Connect with a full configuration (the server's `[nats]` table).
pub async fn connect_with(config: NatsConfig, node: &str) -> Result<SharedBroker, BrokerError> {
    Ok(Arc::new(NatsBroker::connect(config, node).await?))
}
