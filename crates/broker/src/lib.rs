//! # The broker: how a publication reaches every node that hosts a subscriber
//!
//! The hub (in `herald-core`) depends on the [`Broker`] trait only. A broker stores each channel's
//! stream (epoch, offsets, bounded history), delivers publications to the nodes that subscribed to
//! the channel, and keeps presence. One node with everything in memory uses [`MemoryBroker`];
//! `herald-broker-redis` and `herald-broker-nats` implement the same trait for several nodes.
//!
//! # Layout
//! - [`Broker`] and [`BrokerHandler`]: the trait a broker implements and the callbacks it calls.
//! - [`memory`]: the in-memory broker (single node).
//! - [`meta`]: a publication's info and tags in one byte string, for brokers that carry them so.
//! - [`conformance`]: one test suite, written against the trait, that every broker runs.
//! - [`backoff`]: retry pacing (doubling delays with jitter) for every retry loop.
//! - [`watermark`]: the newest position a node saw per channel, to catch a broker that rolled back.
//! - [`redact`]: connection URLs with their passwords hidden, for logs and errors.

pub mod backoff;
pub mod conformance;
pub mod memory;
pub mod meta;
pub mod redact;
pub mod watermark;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ClientInfo, Publication, StreamPosition};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

pub use backoff::Backoff;
pub use memory::MemoryBroker;
pub use redact::redact_url;
pub use watermark::Watermarks;

/// The error that caused a [`BrokerError`], shared so that one failure can fail many waiting
/// calls.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// What a broker failure means for the caller: whether to retry ([`Unavailable`](Self::Unavailable))
/// or not ([`Internal`](Self::Internal)), what failed, and the underlying error where there was one.
/// `Clone`, so that one failed write can answer every publication that waited on it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The broker cannot be reached right now; retry later (error 111 / HTTP 503).
    #[error("broker unavailable: {message}")]
    Unavailable {
        /// What failed, with the cause's text; fit to send to the client.
        message: String,
        /// The underlying error (I/O, client library), for logs and inspection.
        #[source]
        cause: Option<Cause>,
    },
    /// The broker answered something unexpected, or Herald is misconfigured (error 100 / HTTP
    /// 500). Logged, never sent to a client.
    #[error("broker error: {message}")]
    Internal {
        /// What failed, with the cause's text.
        message: String,
        /// The underlying error, if any.
        #[source]
        cause: Option<Cause>,
    },
}

impl BrokerError {
    /// A retryable failure without an underlying error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        BrokerError::Unavailable {
            message: message.into(),
            cause: None,
        }
    }

    /// A failure that retrying will not fix, without an underlying error.
    pub fn internal(message: impl Into<String>) -> Self {
        BrokerError::Internal {
            message: message.into(),
            cause: None,
        }
    }

    /// The same failure, keeping `cause` as its [`source`](std::error::Error::source).
    pub fn caused_by(self, cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let cause = Some(Cause::from(cause.into()));
        match self {
            BrokerError::Unavailable { message, .. } => BrokerError::Unavailable { message, cause },
            BrokerError::Internal { message, .. } => BrokerError::Internal { message, cause },
        }
    }

    /// What failed, in words.
    pub fn message(&self) -> &str {
        match self {
            BrokerError::Unavailable { message, .. } | BrokerError::Internal { message, .. } => {
                message
            }
        }
    }
}

/// How a channel's stream is kept; comes from the channel's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOptions {
    /// Publications kept in history (0: none kept; offsets are still assigned).
    pub history_size: usize,
    /// How long a publication stays in history.
    pub history_ttl: Duration,
    /// How long the stream's epoch and top offset outlive its last publication. Longer than
    /// `history_ttl`, so that a client that was away longer than the TTL is told `recovered: false`
    /// against the same epoch instead of silently starting over.
    pub meta_ttl: Duration,
    /// How long a stream that was only read, never published to, keeps its epoch after the last
    /// read. Reads (a subscribe, a history call, a node's tail check of a hosted channel) create
    /// the epoch so that subscribers and the first publisher agree on it; keeping that state
    /// short bounds what clients reading fresh channel names can make the broker hold.
    pub empty_ttl: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            history_size: 100,
            history_ttl: Duration::from_secs(300),
            meta_ttl: Duration::from_secs(24 * 3600),
            empty_ttl: Duration::from_secs(600),
        }
    }
}

/// One `history` read.
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    /// Only publications after this position.
    pub since: Option<StreamPosition>,
    /// At most this many: the oldest after `since`, or the newest without `since`. `Some(0)` reads
    /// only the stream's position.
    pub limit: Option<usize>,
}

impl HistoryQuery {
    /// The stream's position only (`limit: Some(0)`), as [`Broker::positions`] reads it.
    pub const POSITION: HistoryQuery = HistoryQuery {
        since: None,
        limit: Some(0),
    };
}

/// The answer to a history read.
#[derive(Debug, Clone)]
pub struct HistoryResult {
    /// The stream's current epoch and newest offset.
    pub position: StreamPosition,
    /// Publications in offset order.
    pub publications: Vec<Publication>,
    /// With `since`: the epoch matched and the history still held every publication after
    /// `since.offset` (up to the limit). Without `since`: always true.
    pub continuous: bool,
    /// When each publication was stored, ms since the Unix epoch by the store's clock (Redis's or
    /// NATS's server time, this node's clock in memory): one per publication, in the same order,
    /// or empty where the broker does not know. Not sent to clients; the admin UI shows it.
    pub stored_at_ms: Vec<u64>,
}

/// One page of the channels that hold history ([`Broker::history_channels`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryChannels {
    /// Channel names; a name may repeat across pages (a Redis `SCAN` may return a key twice; a
    /// Redis Cluster's masters or a NATS stream's subjects may change between pages).
    pub channels: Vec<String>,
    /// Where the next page starts; `None` when the listing is complete.
    pub cursor: Option<String>,
}

/// A message between nodes that is not a publication: API actions that must reach a client
/// wherever it is connected, and node liveness for `/api/info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ControlMessage {
    /// Disconnect a user's connections or one client.
    Disconnect {
        /// All connections of this user.
        user: Option<String>,
        /// Or this one connection.
        client: Option<String>,
        /// Close code to use.
        code: u16,
    },
    /// Subscribe every connection of a user to a channel.
    Subscribe {
        /// The user.
        user: String,
        /// The channel.
        channel: String,
    },
    /// Unsubscribe every connection of a user from a channel.
    Unsubscribe {
        /// The user.
        user: String,
        /// The channel.
        channel: String,
    },
    /// A node's periodic report about itself.
    NodeInfo(NodeInfo),
}

/// What a node reports about itself in `/api/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Open client connections.
    pub connections: u64,
    /// Client subscriptions (connection × channel).
    pub subscriptions: u64,
    /// Channels with at least one local subscriber.
    pub channels: u64,
    /// Seconds since the node started.
    pub uptime_s: u64,
    /// Herald version.
    pub version: String,
}

/// What a broker calls when something arrives for this node. Implemented by the hub. Calls must
/// be cheap and never block on I/O: they run on the broker's receive path.
pub trait BrokerHandler: Send + Sync + 'static {
    /// A publication on a channel this node subscribed to, in offset order per channel. One with
    /// offset 0 was kept out of the stream ([`PublishOptions::skip_history`]): it has no place in
    /// that order, and its epoch means nothing.
    fn on_publication(&self, channel: &str, epoch: &str, publication: Publication);
    /// A publication that carries the W3C `traceparent` of the span that published it
    /// ([`PublishOptions::traceparent`]). A handler that does not trace delivers it as any other.
    fn on_traced_publication(
        &self,
        channel: &str,
        epoch: &str,
        publication: Publication,
        traceparent: &str,
    ) {
        let _ = traceparent;
        self.on_publication(channel, epoch, publication);
    }
    /// A client joined (`joined`) or left a channel this node subscribed to.
    fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo);
    /// A control message for every node.
    fn on_control(&self, message: ControlMessage);
    /// The broker lost its connection and got it back, and has re-subscribed every channel: the
    /// hub must catch up every channel from history, because publications may have been missed.
    fn on_reconnected(&self);
}

/// The connection between nodes: streams, delivery and presence.
///
/// The hub calls [`subscribe`](Broker::subscribe) when a channel gets its first local subscriber
/// and [`unsubscribe`](Broker::unsubscribe) when its last one leaves; it never calls both for the
/// same channel at once, so a broker needs no reference counting of its own.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Called once, before the node serves, with the handler that receives incoming events.
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError>;

    /// Append to the channel's stream and deliver to every node subscribed to it, atomically:
    /// the returned position is the publication's. With an `idempotency_key` seen recently on
    /// this channel, return the earlier position and publish nothing.
    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError>;

    /// Publish the same data to several channels, each as [`publish`](Broker::publish) would:
    /// results in `targets`' order, each channel stored or failed on its own (a channel may
    /// appear more than once). The default runs the publishes concurrently; a broker that can
    /// store several channels' publications in one round trip overrides it.
    async fn publish_many(
        &self,
        targets: &[PublishTarget],
        data: Bytes,
        info: Option<ClientInfo>,
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        let publishes = targets
            .iter()
            .map(|t| self.publish(&t.channel, data.clone(), info.clone(), &t.opts));
        futures_util::future::join_all(publishes).await
    }

    /// Start delivering the channel's publications to this node. Returns once the subscription
    /// is in effect, so that a history read made afterwards misses nothing.
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError>;

    /// Stop delivering the channel's publications to this node.
    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError>;

    /// Read the channel's position and publications.
    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError>;

    /// The newest position of each channel, as [`history`](Broker::history) with `limit: Some(0)`
    /// reads it (starting a stream over where that would), in `channels`' order. The hub's tail
    /// check reads hundreds a second per node. The default reads them one by one; a broker that
    /// can read many in one round trip overrides it.
    async fn positions(
        &self,
        channels: &[(Arc<str>, StreamOptions)],
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        let mut out = Vec::with_capacity(channels.len());
        for (channel, opts) in channels {
            let read = self.history(channel, &HistoryQuery::POSITION, opts).await;
            out.push(read.map(|h| h.position));
        }
        out
    }

    /// Remove the channel's kept publications, keeping its epoch and top offset (so a client
    /// recovering from an offset before the removal is told `recovered: false`, and the next
    /// publication continues the offsets). `Ok(false)`: this broker cannot (the default).
    async fn remove_history(&self, channel: &str) -> Result<bool, BrokerError> {
        let _ = channel;
        Ok(false)
    }

    /// One page of the channels whose history holds publications, at most about `limit` names,
    /// starting at `cursor` (`None`: the first page), without blocking the store for long (a
    /// bounded amount of work per call). Names may be listed a little after their history
    /// expired. `Ok(None)`: this broker cannot list them (the default).
    async fn history_channels(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryChannels>, BrokerError> {
        let _ = (cursor, limit);
        Ok(None)
    }

    /// Record that a client is subscribed to the channel.
    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError>;

    /// Forget a client's presence in the channel.
    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError>;

    /// Everyone subscribed to the channel, on every node.
    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError>;

    /// How many clients and distinct users are present in the channel. The default counts the
    /// whole member list; brokers that keep counts override it so that a large channel's count
    /// costs no list.
    async fn presence_stats(&self, channel: &str) -> Result<PresenceStats, BrokerError> {
        Ok(PresenceStats::of(&self.presence(channel).await?))
    }

    /// Up to `limit` present clients with ids greater than `after`, in client-id order, and
    /// whether more follow. The default sorts the whole member list; brokers that keep the
    /// members ordered override it so that a page costs about its own size.
    async fn presence_page(
        &self,
        channel: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        Ok(PresencePage::from_unsorted(
            self.presence(channel).await?,
            after,
            limit,
        ))
    }

    /// Tell every node hosting the channel that a client joined or left.
    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError>;

    /// Send a control message to every node (this one included).
    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError>;

    /// Register the broker's own metrics into the node's registry (prefix `herald`, served on
    /// `/metrics`), under `broker_`.
    fn register_metrics(&self, _registry: &mut Registry) {}

    /// The broker's own metrics alone, as Prometheus text (for tests and diagnostics).
    fn metrics_text(&self) -> String {
        let mut registry = Registry::with_prefix("herald");
        self.register_metrics(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("writing to a String");
        text
    }
}

/// Options of one publish.
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    /// How the channel's stream is kept.
    pub stream: StreamOptions,
    /// Deduplicates retried API publishes.
    pub idempotency_key: Option<String>,
    /// The W3C `traceparent` of a sampled publication's broker span, carried to every receiving
    /// node ([`BrokerHandler::on_traced_publication`]) so their fan-out spans join the trace.
    /// `None` unless tracing sampled this publication: nothing extra goes on the wire.
    pub traceparent: Option<String>,
    /// The publication's tags, stored and delivered with it (empty: none).
    pub tags: herald_protocol::tags::Tags,
    /// Deliver to every node's subscribers now, without storing it or giving it an offset: it
    /// reaches handlers as offset 0 (with any epoch), and the publish answers [`unstored`]. The
    /// idempotency key is not remembered for it.
    pub skip_history: bool,
}

/// The position a publish with [`PublishOptions::skip_history`] answers: none (empty epoch,
/// offset 0), as the publication has none.
pub fn unstored() -> StreamPosition {
    StreamPosition {
        epoch: String::new(),
        offset: 0,
    }
}

/// One channel of [`Broker::publish_many`], with how its stream is kept.
#[derive(Debug, Clone)]
pub struct PublishTarget {
    /// The channel.
    pub channel: String,
    /// Its stream options and idempotency key.
    pub opts: PublishOptions,
}

/// A channel's presence counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PresenceStats {
    /// Present clients (connections subscribed to the channel).
    pub num_clients: u64,
    /// Distinct users among them (anonymous clients count as one user, `""`).
    pub num_users: u64,
}

impl PresenceStats {
    /// The counts of a member list.
    pub fn of(clients: &[ClientInfo]) -> Self {
        let users: std::collections::HashSet<&str> =
            clients.iter().map(|c| c.user.as_str()).collect();
        PresenceStats {
            num_clients: clients.len() as u64,
            num_users: users.len() as u64,
        }
    }
}

/// One page of a channel's presence, in client-id order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PresencePage {
    /// The page's clients, ordered by client id.
    pub clients: Vec<ClientInfo>,
    /// Whether clients with greater ids follow (the next page starts after the last one here).
    pub more: bool,
}

impl PresencePage {
    /// The page of a whole, unordered member list.
    pub fn from_unsorted(mut all: Vec<ClientInfo>, after: Option<&str>, limit: usize) -> Self {
        all.retain(|c| after.is_none_or(|a| c.client.as_str() > a));
        all.sort_by(|x, y| x.client.cmp(&y.client));
        let more = all.len() > limit;
        all.truncate(limit);
        PresencePage { clients: all, more }
    }
}

/// A new random epoch: 8 bytes, hex.
pub fn new_epoch() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Keep `Arc<dyn Broker>` usable where a `Broker` is expected.
pub type SharedBroker = Arc<dyn Broker>;

#[cfg(test)]
mod tests {
    use super::BrokerError;
    use std::error::Error as _;

    #[test]
    fn broker_error_keeps_its_cause_through_clone() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = BrokerError::unavailable("redis at x: refused").caused_by(io);
        let copy = err.clone();
        assert_eq!(copy.to_string(), "broker unavailable: redis at x: refused");
        assert_eq!(copy.message(), "redis at x: refused");
        assert_eq!(
            copy.source().map(|c| c.to_string()).as_deref(),
            Some("refused")
        );
        assert!(BrokerError::internal("bad").source().is_none());
    }
}
