//! [`RedisBroker`]: the `Broker` trait on Redis. This file holds the shared state and routes each
//! trait call to the module that owns it: [`crate::topology`] (connecting), [`crate::publish`],
//! [`crate::history`], [`crate::presence`], and the subscribers for delivery.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, BrokerHandler, ControlMessage, HistoryChannels, HistoryQuery,
    HistoryResult, PresencePage, PresenceStats, PublishOptions, PublishTarget, SharedBroker,
    StreamOptions,
};
use herald_protocol::{ClientInfo, StreamPosition};
use prometheus_client::registry::Registry;
use redis::RedisError;

use crate::config::RedisConfig;
use crate::link::{self, Commands, Conn};
use crate::masters::Masters;
use crate::metrics::Metrics;
use crate::names::{self, Names};
use crate::presence::{self, LocalPresence};
use crate::receive::{Dispatch, Subscriber};
use crate::topology;

/// The Broker on Redis. Build it with [`crate::connect`] or [`crate::connect_with`].
pub struct RedisBroker {
    inner: Arc<Inner>,
}

/// What every part of the broker shares.
pub(crate) struct Inner {
    pub(crate) node: String,
    pub(crate) cfg: RedisConfig,
    pub(crate) names: Names,
    pub(crate) cluster: bool,
    pub(crate) commands: Commands,
    /// One per standalone shard, or one for the Cluster.
    pub(crate) subscribers: Vec<Subscriber>,
    pub(crate) dispatch: Arc<Dispatch>,
    pub(crate) metrics: Arc<Metrics>,
    /// Presence entries this node added. Refreshed periodically, so they expire in Redis only
    /// when this node stops refreshing (crash).
    pub(crate) local_presence: LocalPresence,
    pub(crate) started: OnceLock<()>,
    /// On a Cluster: the slot map and this node's connection to each master, for broadcasts.
    pub(crate) masters: Masters,
}

impl RedisBroker {
    /// Connect to the servers `cfg` names, as node `node`. Fails if Redis cannot be reached now.
    pub async fn connect(cfg: RedisConfig, node: &str) -> Result<RedisBroker, BrokerError> {
        Ok(RedisBroker {
            inner: Arc::new(topology::connect(cfg, node).await?),
        })
    }

    /// This broker as the server's shared handle.
    pub fn shared(self) -> SharedBroker {
        Arc::new(self)
    }
}

impl Inner {
    /// The standalone shard that owns `channel` (always 0 on a Cluster, which routes by slot).
    pub(crate) fn shard(&self, channel: &str) -> usize {
        match &self.commands {
            Commands::Shards(links) => names::shard_of(channel, links.len()),
            Commands::Cluster(_) => 0,
        }
    }

    fn subscriber(&self, channel: &str) -> &Subscriber {
        &self.subscribers[if self.cluster { 0 } else { self.shard(channel) }]
    }

    /// `SPUBLISH` on a Cluster (the message stays on the slot's shard), else `PUBLISH`.
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.cluster {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// The server identity the publish and history scripts bind epochs to on `conn` (see
    /// [`Conn::identity`]); empty, i.e. never bound, with `synchronous_persistence`.
    pub(crate) fn identity(&self, conn: &Conn) -> std::sync::Arc<str> {
        if self.cfg.synchronous_persistence {
            std::sync::Arc::from("")
        } else {
            conn.identity()
        }
    }

    /// Run one command or script on `shard`'s command connection: measured, bounded by the
    /// command timeout, failing fast while the link is down.
    pub(crate) async fn run<T, F, Fut>(&self, shard: usize, f: F) -> Result<T, BrokerError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let conn = self.commands.conn(shard)?;
        link::run(&self.metrics, self.cfg.command_timeout(), conn, f).await
    }
}

#[async_trait]
impl Broker for RedisBroker {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        let inner = &self.inner;
        if inner.started.set(()).is_err() {
            return Err(BrokerError::internal("broker started twice"));
        }
        let _ = inner.dispatch.handler.set(handler);
        // The one always-on subscription: control messages for every node.
        let control = inner.names.control.clone();
        inner.subscribers[0].subscribe(control).await?;
        presence::spawn_presence_refresh(inner);
        tracing::info!(node = %inner.node, cluster = inner.cluster, "redis broker started");
        Ok(())
    }

    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        self.inner.publish(channel, data, info, opts).await
    }

    async fn publish_many(
        &self,
        targets: &[PublishTarget],
        data: Bytes,
        info: Option<ClientInfo>,
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        self.inner.publish_many(targets, data, info).await
    }

    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner
            .subscriber(channel)
            .subscribe(inner.names.pubsub(channel))
            .await
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner
            .subscriber(channel)
            .unsubscribe(inner.names.pubsub(channel))
            .await
    }

    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        self.inner.history(channel, query, opts).await
    }

    async fn positions(
        &self,
        channels: &[(Arc<str>, StreamOptions)],
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        self.inner.positions(channels).await
    }

    async fn remove_history(&self, channel: &str) -> Result<bool, BrokerError> {
        self.inner.remove_history(channel).await.map(|()| true)
    }

    async fn history_channels(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryChannels>, BrokerError> {
        self.inner.history_channels(cursor, limit).await
    }

    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        self.inner.add_presence(channel, who).await
    }

    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        self.inner.remove_presence(channel, client).await
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.inner.presence(channel).await
    }

    async fn presence_stats(&self, channel: &str) -> Result<PresenceStats, BrokerError> {
        self.inner.presence_stats(channel).await
    }

    async fn presence_page(
        &self,
        channel: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        self.inner.presence_page(channel, after, limit).await
    }

    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        self.inner
            .publish_presence_change(channel, joined, who)
            .await
    }

    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        self.inner.publish_control(message).await
    }

    fn register_metrics(&self, registry: &mut Registry) {
        let inner = &self.inner;
        let mode = match (&inner.commands, inner.cluster) {
            (_, true) => "cluster",
            (Commands::Shards(l), _) if l.len() > 1 => "shards",
            _ => "standalone",
        };
        inner.metrics.register(registry, mode);
    }
}
