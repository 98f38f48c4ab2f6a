//! Prometheus metrics of the node. Counters are atomics: the hot path pays one relaxed add per
//! publication (not per subscriber), as nats-server updates stats per batch.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode, encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Every metric the node exports.
pub struct Metrics {
    registry: Registry,
    /// Open client connections.
    pub connections: Gauge,
    /// Connections accepted since start.
    pub connections_accepted: Counter,
    /// WebSocket handshakes refused by `limits.handshakes_per_ip_per_s`.
    pub handshakes_refused: Counter,
    /// TLS handshakes completed (a node serving TLS).
    pub tls_handshakes: Counter,
    /// TLS handshakes that resumed a session with a ticket (no certificate sent).
    pub tls_resumed: Counter,
    /// Client subscriptions (connection × channel).
    pub subscriptions: Gauge,
    /// Channels with at least one local subscriber.
    pub channels: Gauge,
    /// Commands received from clients.
    pub commands: Counter,
    /// Publications accepted through this node (API or clients).
    pub publications: Counter,
    /// Publications received from the broker.
    pub publications_received: Counter,
    /// Publications received for a channel without local subscribers (should stay 0 with
    /// targeted subscriptions).
    pub publications_without_subscriber: Counter,
    /// Publications queued to connections (one per subscriber).
    pub deliveries: Counter,
    /// Fossil deltas computed for delta subscribers (at most one per publication).
    pub deltas_computed: Counter,
    /// Connections closed because their outbound queue overflowed.
    pub slow_consumers: Counter,
    /// Subscriptions with `since` that recovered.
    pub recovered: Counter,
    /// Subscriptions with `since` that could not recover.
    pub recovery_failed: Counter,
    /// Recoveries answered `recovered: false` because the reply's byte budget was spent.
    pub recovery_over_budget: Counter,
    /// Subscriptions whose history read was shared with another subscriber's read in flight.
    pub history_reads_shared: Counter,
    /// Subscriptions answered from what the node holds for the channel, with no broker read.
    pub history_reads_local: Counter,
    /// Gap or reconnect catch-ups from history.
    pub catchups: Counter,
    /// Subscriptions ended with `unsub` 4003 because the node lost the channel's continuity.
    pub continuity_lost: Counter,
    /// Gaps at a channel's tail found by the periodic tail check.
    pub tail_gaps: Counter,
    /// Channels due a tail check that the last tick left for later (more than it reads).
    pub tail_checks_waiting: Gauge,
    /// Seconds a publish took at the broker.
    pub publish_seconds: Histogram,
    /// Calls to the application's backend (proxy hooks).
    pub proxy_calls: Counter,
    /// Proxy calls that found the backend down or too slow (error 112 to the client).
    pub proxy_unavailable: Counter,
    /// Proxy answers refused: not 200, too large, or malformed (error 100 to the client).
    pub proxy_bad_answers: Counter,
    /// Seconds a proxy call took, answer read.
    pub proxy_seconds: Histogram,
    /// Rows or records a consumer read from its source, by [`consumer_labels`] (read again after
    /// a retry or a crash, so it may exceed `published + failed`).
    pub consumer_consumed: Family<ConsumerLabels, Counter>,
    /// Rows or records a consumer published to all their channels.
    pub consumer_published: Family<ConsumerLabels, Counter>,
    /// Rows or records a consumer could not publish and set aside (dead-lettered).
    pub consumer_failed: Family<ConsumerLabels, Counter>,
    /// Publishes a consumer will try again because the broker was unavailable.
    pub consumer_retries: Family<ConsumerLabels, Counter>,
    /// Rows or records waiting in a consumer's source.
    pub consumer_lag: Family<ConsumerLabels, Gauge>,
    /// Kafka records taken from a topic, by `consumer`.
    pub kafka_consumed: Family<Labels, Counter>,
    /// Kafka records whose command published (on at least one channel), by `consumer`.
    pub kafka_published: Family<Labels, Counter>,
    /// Kafka records skipped in whole or in part, by `consumer` and `reason` (`malformed`: not a
    /// command; `refused`: a channel or the command was refused, e.g. an unknown namespace).
    pub kafka_failed: Family<Labels, Counter>,
    /// Publish attempts of a Kafka record repeated after a retryable failure, by `consumer`.
    pub kafka_retries: Family<Labels, Counter>,
    /// Records of a partition not committed yet: high watermark − committed offset, by
    /// `consumer`, `topic` and `partition` (refreshed every `stats_interval_ms`).
    pub kafka_lag: Family<Labels, Gauge>,
}

/// A metric's label pairs, for the families with labels.
pub type Labels = Vec<(String, String)>;

/// The labels of a consumer's metrics: `kind` (`postgres`, …) and `consumer` (its name).
pub type ConsumerLabels = Vec<(&'static str, String)>;

/// The labels of consumer `name` of `kind`.
pub fn consumer_labels(kind: &'static str, name: &str) -> ConsumerLabels {
    vec![("kind", kind.to_owned()), ("consumer", name.to_owned())]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("herald");
        macro_rules! reg {
            ($name:literal, $help:literal, $metric:expr) => {{
                let m = $metric;
                registry.register($name, $help, m.clone());
                m
            }};
        }
        Metrics {
            connections: reg!("connections", "Open client connections", Gauge::default()),
            connections_accepted: reg!(
                "connections_accepted",
                "Connections accepted",
                Counter::default()
            ),
            handshakes_refused: reg!(
                "handshakes_refused",
                "WebSocket handshakes refused by the per-IP rate",
                Counter::default()
            ),
            tls_handshakes: reg!(
                "tls_handshakes",
                "TLS handshakes completed",
                Counter::default()
            ),
            tls_resumed: reg!(
                "tls_resumed",
                "TLS handshakes that resumed a session with a ticket",
                Counter::default()
            ),
            subscriptions: reg!("subscriptions", "Client subscriptions", Gauge::default()),
            channels: reg!(
                "channels",
                "Channels with local subscribers",
                Gauge::default()
            ),
            commands: reg!(
                "commands",
                "Commands received from clients",
                Counter::default()
            ),
            publications: reg!(
                "publications",
                "Publications accepted by this node",
                Counter::default()
            ),
            publications_received: reg!(
                "hub_publications_received",
                "Publications received from the broker",
                Counter::default()
            ),
            publications_without_subscriber: reg!(
                "hub_publications_without_subscriber",
                "Publications received for channels without local subscribers",
                Counter::default()
            ),
            deliveries: reg!(
                "deliveries",
                "Publications queued to connections",
                Counter::default()
            ),
            deltas_computed: reg!(
                "deltas_computed",
                "Fossil deltas computed for delta subscribers (at most one per publication)",
                Counter::default()
            ),
            slow_consumers: reg!(
                "slow_consumers",
                "Connections closed as slow consumers (4001)",
                Counter::default()
            ),
            recovered: reg!(
                "recovered",
                "Subscriptions recovered from history",
                Counter::default()
            ),
            recovery_failed: reg!(
                "recovery_failed",
                "Subscriptions that could not recover",
                Counter::default()
            ),
            history_reads_shared: reg!(
                "history_reads_shared",
                "Subscriptions whose history read was shared with another one in flight (same channel, since and generation)",
                Counter::default()
            ),
            history_reads_local: reg!(
                "history_reads_local",
                "Subscriptions answered from the channel's position and recent publications on this node, without a broker read",
                Counter::default()
            ),
            recovery_over_budget: reg!(
                "recovery_over_budget",
                "Recoveries answered recovered: false because the reply's byte budget was spent",
                Counter::default()
            ),
            catchups: reg!(
                "catchups",
                "Catch-ups from history after a gap or broker reconnect",
                Counter::default()
            ),
            continuity_lost: reg!(
                "continuity_lost",
                "Subscriptions ended with unsub 4003 because continuity was lost",
                Counter::default()
            ),
            tail_gaps: reg!(
                "tail_gaps",
                "Gaps at a channel's tail found by the periodic tail check",
                Counter::default()
            ),
            tail_checks_waiting: reg!(
                "tail_checks_waiting",
                "Channels due a tail check that the last tick left for a later one (it reads at most 512)",
                Gauge::default()
            ),
            proxy_calls: reg!(
                "proxy_calls",
                "Calls to the application's backend (proxy hooks)",
                Counter::default()
            ),
            proxy_unavailable: reg!(
                "proxy_unavailable",
                "Proxy calls that found the backend down or slower than proxy.timeout_ms",
                Counter::default()
            ),
            proxy_bad_answers: reg!(
                "proxy_bad_answers",
                "Proxy answers refused: not 200, too large, or malformed",
                Counter::default()
            ),
            proxy_seconds: reg!(
                "proxy_seconds",
                "Seconds a proxy call took",
                Histogram::new(exponential_buckets(0.0005, 2.0, 14))
            ),
            publish_seconds: reg!(
                "publish_seconds",
                "Broker publish latency",
                Histogram::new(exponential_buckets(0.00005, 2.0, 16))
            ),
            consumer_consumed: reg!(
                "consumer_consumed",
                "Rows or records a consumer read from its source (again after a retry or crash)",
                Family::default()
            ),
            consumer_published: reg!(
                "consumer_published",
                "Rows or records a consumer published to all their channels",
                Family::default()
            ),
            consumer_failed: reg!(
                "consumer_failed",
                "Rows or records a consumer could not publish and set aside (dead-lettered)",
                Family::default()
            ),
            consumer_retries: reg!(
                "consumer_retries",
                "Publishes a consumer will retry because the broker was unavailable",
                Family::default()
            ),
            consumer_lag: reg!(
                "consumer_lag",
                "Rows or records waiting in a consumer's source",
                Family::default()
            ),
            kafka_consumed: reg!(
                "kafka_consumed",
                "Kafka records taken from a topic",
                Family::default()
            ),
            kafka_published: reg!(
                "kafka_published",
                "Kafka records whose command published",
                Family::default()
            ),
            kafka_failed: reg!(
                "kafka_failed",
                "Kafka records skipped in whole or in part (malformed, oversized or refused)",
                Family::default()
            ),
            kafka_retries: reg!(
                "kafka_retries",
                "Kafka record publishes repeated after a retryable failure",
                Family::default()
            ),
            kafka_lag: reg!(
                "kafka_lag",
                "Kafka records not committed yet (high watermark - committed offset), per partition",
                Family::default()
            ),
            registry,
        }
    }

    /// The registry, for other parts of the node (the broker, consumers) to register their own
    /// metrics into before the node starts.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("metrics encode");
        out
    }

    /// The exposition with `scraped`'s metrics (values read at scrape time from state the
    /// node owns, such as the transports' connection counters) after the registry's, under the
    /// same `herald_` prefix and before the closing `# EOF`.
    pub fn render_with(&self, scraped: Box<dyn Collector>) -> String {
        let mut late = Registry::with_prefix("herald");
        late.register_collector(scraped);
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &late))
            .and_then(|()| encode_eof(&mut out))
            .expect("metrics encode");
        out
    }
}
