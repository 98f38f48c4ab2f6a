//! The lifecycle event stream (`[lifecycle]`, docs/lifecycle.md): connect, subscribe,
//! unsubscribe and disconnect events, delivered to the application's HTTP endpoint in order, at
//! least once, each with an id to deduplicate on, and surviving node crashes.
//!
//! Why a stream and not a hook: a synchronous disconnect hook cannot be made reliable (a node
//! that dies calls nothing). Here each node appends its events to a durable log together with the
//! set of its connections ([`log`]); a node that stops renewing its lease has that set turned
//! into `disconnect` events by whichever node notices first, in the same atomic step that removes
//! it, so each is emitted once. One node at a time delivers the log to the endpoint ([`deliver`]).
//!
//! - [`recorder`]: the hub's sink: per-connection state, events in order, queued for the log.
//! - [`log`]: the durable log (Redis or NATS JetStream) or a node-local one (memory, a single
//!   node).
//! - [`deliver`]: the log to the HTTP endpoint, in order, with retries.

mod deliver;
mod log;
mod recorder;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use tokio::sync::mpsc;

pub use recorder::Recorder;

/// `[lifecycle]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleConfig {
    /// Where the events go: each batch is `POST`ed as `{"events": [...]}`.
    #[serde(default)]
    pub http_url: Option<String>,
    /// Or: a Kafka topic, one record per event (key: the user, or the client when anonymous;
    /// value: the event's JSON), through these bootstrap servers.
    #[serde(default)]
    pub kafka_brokers: Option<String>,
    /// The topic, with `kafka_brokers`.
    #[serde(default)]
    pub kafka_topic: Option<String>,
    /// The durable log every node shares (a standalone Redis). Without it the log is in this
    /// node's memory: nothing survives the node, so use it only for a single node.
    #[serde(default)]
    pub redis_url: Option<String>,
    /// Or: the durable log on NATS JetStream (a stream and a KV bucket named after `prefix`),
    /// for a cluster without Redis. Not with `redis_url`.
    #[serde(default)]
    pub nats_url: Option<String>,
    /// A node that has not renewed its lease for this long is lost: another node emits its
    /// connections' `unsubscribe` and `disconnect` events.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// The most events in one `POST`.
    #[serde(default = "default_batch_max")]
    pub batch_max: usize,
    /// How long one `POST` may take before it is retried.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The prefix of the log's Redis keys (all in one hash slot).
    #[serde(default = "default_prefix")]
    pub prefix: String,
}

fn default_lease_ms() -> u64 {
    10_000
}
fn default_batch_max() -> usize {
    500
}
fn default_timeout_ms() -> u64 {
    5_000
}
fn default_prefix() -> String {
    "herald-lifecycle".into()
}

impl LifecycleConfig {
    /// `[lifecycle]` from the config, checked; `None` when the section is absent.
    pub fn load(section: Option<&serde_json::Value>) -> anyhow::Result<Option<Self>> {
        let Some(section) = section else {
            return Ok(None);
        };
        let config: LifecycleConfig =
            serde_json::from_value(section.clone()).context("invalid [lifecycle]")?;
        match (&config.http_url, &config.kafka_brokers, &config.kafka_topic) {
            (Some(url), None, None) => {
                let url =
                    reqwest::Url::parse(url).context("invalid [lifecycle] http_url: not a URL")?;
                anyhow::ensure!(
                    matches!(url.scheme(), "http" | "https"),
                    "invalid [lifecycle] http_url: the scheme must be http or https"
                );
            }
            (None, Some(brokers), Some(topic)) => {
                anyhow::ensure!(
                    cfg!(feature = "kafka"),
                    "[lifecycle] kafka_brokers: this build has no Kafka support: rebuild with --features kafka"
                );
                anyhow::ensure!(
                    !brokers.is_empty() && !topic.is_empty(),
                    "invalid [lifecycle]: kafka_brokers and kafka_topic must not be empty"
                );
            }
            _ => anyhow::bail!(
                "invalid [lifecycle]: set http_url, or kafka_brokers and kafka_topic (one sink)"
            ),
        }
        anyhow::ensure!(
            config.redis_url.is_none() || config.nats_url.is_none(),
            "invalid [lifecycle]: set redis_url or nats_url, not both (one durable log)"
        );
        if config.nats_url.is_some() {
            anyhow::ensure!(
                config
                    .prefix
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "invalid [lifecycle] prefix: with nats_url, only letters, digits, '-' and '_' (it names a JetStream stream and KV bucket)"
            );
        }
        anyhow::ensure!(
            (1_000..=600_000).contains(&config.lease_ms),
            "invalid [lifecycle] lease_ms: from 1000 to 600000"
        );
        anyhow::ensure!(
            (1..=10_000).contains(&config.batch_max),
            "invalid [lifecycle] batch_max: from 1 to 10000"
        );
        anyhow::ensure!(
            (100..=120_000).contains(&config.timeout_ms),
            "invalid [lifecycle] timeout_ms: from 100 to 120000"
        );
        anyhow::ensure!(
            !config.prefix.is_empty() && !config.prefix.contains(['{', '}']),
            "invalid [lifecycle] prefix: not empty, without braces"
        );
        Ok(Some(config))
    }
}

/// The running stream: its recorder is the hub's sink; [`Lifecycle::stop`] flushes it.
pub struct Lifecycle {
    recorder: Arc<Recorder>,
    writer: tokio::task::JoinHandle<()>,
    log: Arc<log::Log>,
    node: String,
}

impl Lifecycle {
    /// Connect the log, take over what an earlier run of this node left in it, and start
    /// writing, the lease, the reaper and the delivery.
    pub async fn start(config: LifecycleConfig, node: &str) -> anyhow::Result<Self> {
        let log = Arc::new(log::Log::connect(&config, node).await?);
        let reaped = log.reap(node, true).await.context("lifecycle log")?;
        if reaped > 0 {
            tracing::info!(
                events = reaped,
                "lifecycle: emitted the disconnects an earlier run of this node left"
            );
        }
        log.renew_lease().await.context("lifecycle log")?;
        let (tx, rx) = mpsc::unbounded_channel();
        let recorder = Arc::new(Recorder::new(node.to_owned(), tx));
        let writer = tokio::spawn(log::write(log.clone(), rx, config.batch_max));
        tokio::spawn(log::keep_lease(Arc::downgrade(&log)));
        tokio::spawn(log::reap_lost(Arc::downgrade(&log)));
        tokio::spawn(deliver::run(Arc::downgrade(&log), config));
        Ok(Lifecycle {
            recorder,
            writer,
            log,
            node: node.to_owned(),
        })
    }

    /// The hub's sink.
    pub fn recorder(&self) -> Arc<Recorder> {
        self.recorder.clone()
    }

    /// The node stops: write what is queued (at most `limit`), then give up the lease so that
    /// nothing is left to reap. Delivery goes on from the other nodes (or the next start).
    pub async fn stop(self, limit: Duration) {
        self.recorder.close();
        if tokio::time::timeout(limit, self.writer).await.is_err() {
            tracing::warn!("lifecycle: events still queued when the node stopped; a node that starts with this name, or another node after the lease, emits the disconnects");
            return;
        }
        if let Err(e) = self.log.release(&self.node).await {
            tracing::warn!(cause = %e, "lifecycle: the lease was not released");
        }
    }
}
