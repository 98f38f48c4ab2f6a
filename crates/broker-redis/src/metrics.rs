//! The broker's own metrics (prefix `herald_broker_`), registered into the node's
//! prometheus-client registry beside the hub's (`Broker::register_metrics`).
//!
//! Each is bumped once per publication or event, never per subscriber.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Upper bounds of the round-trip histogram, in seconds.
const RTT_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// Metrics shared by the broker, its connections and its subscribers.
pub(crate) struct Metrics {
    /// Publications stored and published (duplicates by idempotency key excluded).
    pub(crate) published: Counter,
    /// Publishes that failed (Redis unreachable or an error).
    pub(crate) publish_errors: Counter,
    /// Publication messages received from Redis pub/sub.
    pub(crate) received_publications: Counter,
    /// Presence-change messages received.
    pub(crate) received_presence: Counter,
    /// Control messages received.
    pub(crate) received_control: Counter,
    /// Messages that could not be decoded (dropped).
    pub(crate) received_invalid: Counter,
    /// Channels subscribed again after a reconnect.
    pub(crate) resubscriptions: Counter,
    /// Times a subscription connection was restored (then the hub catches up).
    pub(crate) reconnects: Counter,
    /// `on_reconnected` calls: catch-ups from history requested from the hub.
    pub(crate) catchups: Counter,
    /// Channels this node is subscribed to now (the control channel excluded).
    pub(crate) subscribed_channels: Gauge,
    /// Subscription connections that are down now.
    pub(crate) disconnected: Gauge,
    /// Round trips of Redis commands.
    rtt: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            published: Counter::default(),
            publish_errors: Counter::default(),
            received_publications: Counter::default(),
            received_presence: Counter::default(),
            received_control: Counter::default(),
            received_invalid: Counter::default(),
            resubscriptions: Counter::default(),
            reconnects: Counter::default(),
            catchups: Counter::default(),
            subscribed_channels: Gauge::default(),
            disconnected: Gauge::default(),
            rtt: Histogram::new(RTT_BUCKETS),
        }
    }
}

/// `herald_broker_connected{mode}`: 1 while every subscription connection is up. Computed when
/// scraped from the count of connections down.
#[derive(Debug)]
struct Connected(Gauge);

impl prometheus_client::encoding::EncodeMetric for Connected {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let up = Gauge::<i64>::default();
        up.set(i64::from(self.0.get() == 0));
        up.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

impl Metrics {
    /// Record one command round trip.
    pub(crate) fn observe_rtt(&self, rtt: Duration) {
        self.rtt.observe(rtt.as_secs_f64());
    }

    /// Register every metric under `broker_` (the node's registry adds `herald_`); `mode` labels `connected` (standalone,
    /// sentinel, cluster, shards).
    pub(crate) fn register(&self, registry: &mut Registry, mode: &str) {
        let r = registry.sub_registry_with_prefix("broker");
        let counters = [
            (
                "messages_published",
                "Publications stored in Redis and published",
                &self.published,
            ),
            (
                "publish_errors",
                "Publishes that failed",
                &self.publish_errors,
            ),
            (
                "messages_received",
                "Publication messages received from Redis pub/sub",
                &self.received_publications,
            ),
            (
                "received_presence",
                "Join/leave messages received from Redis pub/sub",
                &self.received_presence,
            ),
            (
                "received_control",
                "Control messages received from Redis pub/sub",
                &self.received_control,
            ),
            (
                "received_invalid",
                "Pub/sub messages that could not be decoded",
                &self.received_invalid,
            ),
            (
                "resubscriptions",
                "Channels subscribed again after a reconnect",
                &self.resubscriptions,
            ),
            (
                "reconnects",
                "Subscription connections restored after a loss",
                &self.reconnects,
            ),
            (
                "catchups",
                "Catch-ups from history requested after a reconnect",
                &self.catchups,
            ),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        r.register(
            "subscribed_channels",
            "Channels this node is subscribed to in Redis",
            self.subscribed_channels.clone(),
        );
        r.register(
            "redis_rtt_seconds",
            "Round-trip time of Redis commands",
            self.rtt.clone(),
        );
        r.sub_registry_with_label(("mode".into(), mode.to_owned().into()))
            .register(
                "connected",
                "Whether every Redis subscription connection is up",
                Connected(self.disconnected.clone()),
            );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn renders_counters_and_histogram() {
        let m = Metrics::default();
        m.published.inc_by(3);
        m.observe_rtt(Duration::from_micros(300));
        m.observe_rtt(Duration::from_secs(5));
        let mut registry = Registry::with_prefix("herald");
        m.register(&mut registry, "standalone");
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("herald_broker_messages_published_total 3\n"),
            "{text}"
        );
        assert!(text.contains("herald_broker_redis_rtt_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("herald_broker_redis_rtt_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("herald_broker_connected{mode=\"standalone\"} 1\n"));
        m.disconnected.inc();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains("herald_broker_connected{mode=\"standalone\"} 0\n"));
    }
}
