//! The NATS broker's metrics (prefix `herald_broker_`), registered into the node's
//! prometheus-client registry beside the hub's (`Broker::register_metrics`). Names shared with
//! the Redis broker mean the same thing, so one dashboard fits both; the rest are NATS-specific.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the publish-time histogram, in seconds (the Redis broker's RTT buckets).
const PUBLISH_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// Each metric is independent and read only when scraped.
pub(crate) struct Metrics {
    pub(crate) published: Counter,
    pub(crate) publish_errors: Counter,
    /// Messages stored: fewer than publications when queued ones were stored together.
    pub(crate) stored_messages: Counter,
    /// Publishes that lost the race for the next offset to another publisher and retried.
    pub(crate) publish_conflicts: Counter,
    pub(crate) publish_duplicates: Counter,
    /// Successful publish times.
    publish_seconds: Histogram,
    pub(crate) history_reads: Counter,
    pub(crate) history_errors: Counter,
    /// Publications handed to the hub.
    pub(crate) received_publications: Counter,
    pub(crate) received_presence: Counter,
    pub(crate) received_control: Counter,
    /// Messages that were not ours or did not decode.
    pub(crate) received_invalid: Counter,
    /// Channels this node holds a NATS subscription for.
    pub(crate) subscribed_channels: Gauge,
    /// JetStream requests sent and not yet answered or timed out (at most
    /// `max_requests_in_flight`; the rest wait in the node, see `Inner::jetstream`).
    pub(crate) requests_in_flight: Gauge,
    pub(crate) connected: Gauge,
    pub(crate) disconnects: Counter,
    pub(crate) reconnects: Counter,
    /// Channel subscriptions the client re-sent after reconnects.
    pub(crate) resubscriptions: Counter,
    /// Times the hub was asked to catch up (`on_reconnected`).
    pub(crate) catchups: Counter,
    /// async-nats dropped messages for a subscription that could not keep up.
    pub(crate) slow_consumer_events: Counter,
    pub(crate) presence_refresh_errors: Counter,
    /// Epoch markers stored on empty subjects (reads of channels nobody published to).
    pub(crate) markers_stored: Counter,
    /// Markers deleted after `empty_ttl` or replaced by a fresh copy.
    pub(crate) markers_deleted: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            published: Counter::default(),
            publish_errors: Counter::default(),
            stored_messages: Counter::default(),
            publish_conflicts: Counter::default(),
            publish_duplicates: Counter::default(),
            publish_seconds: Histogram::new(PUBLISH_BUCKETS),
            history_reads: Counter::default(),
            history_errors: Counter::default(),
            received_publications: Counter::default(),
            received_presence: Counter::default(),
            received_control: Counter::default(),
            received_invalid: Counter::default(),
            subscribed_channels: Gauge::default(),
            requests_in_flight: Gauge::default(),
            connected: Gauge::default(),
            disconnects: Counter::default(),
            reconnects: Counter::default(),
            resubscriptions: Counter::default(),
            catchups: Counter::default(),
            slow_consumer_events: Counter::default(),
            presence_refresh_errors: Counter::default(),
            markers_stored: Counter::default(),
            markers_deleted: Counter::default(),
        }
    }
}

/// Count one event.
pub(crate) fn inc(counter: &Counter) {
    counter.inc();
}

impl Metrics {
    /// Record one successful publish, waiting for the channel's earlier publishes included.
    pub(crate) fn observe_publish(&self, took: Duration) {
        self.publish_seconds.observe(took.as_secs_f64());
        inc(&self.published);
    }

    /// Register every metric under `broker_` (the node's registry adds `herald_`).
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("broker");
        let counters = [
            (
                "messages_published",
                "Publications stored in JetStream by this node",
                &self.published,
            ),
            (
                "publish_errors",
                "Publishes that failed",
                &self.publish_errors,
            ),
            (
                "nats_stored_messages",
                "JetStream messages stored: fewer than publications when queued ones went together",
                &self.stored_messages,
            ),
            (
                "publish_conflicts",
                "Publishes retried because another publisher took the offset",
                &self.publish_conflicts,
            ),
            (
                "nats_markers_stored",
                "Epoch markers stored for channels read before anything was published",
                &self.markers_stored,
            ),
            (
                "nats_markers_deleted",
                "Epoch markers deleted after the empty-stream TTL (or replaced by a fresh copy)",
                &self.markers_deleted,
            ),
            (
                "publish_duplicates",
                "Publishes answered from an earlier one with the same idempotency key",
                &self.publish_duplicates,
            ),
            (
                "messages_received",
                "Publications received from NATS and handed to the hub",
                &self.received_publications,
            ),
            (
                "received_presence",
                "Join/leave messages received from NATS",
                &self.received_presence,
            ),
            (
                "received_control",
                "Control messages received from NATS",
                &self.received_control,
            ),
            (
                "received_invalid",
                "Messages received that could not be decoded",
                &self.received_invalid,
            ),
            (
                "history_reads",
                "History reads from JetStream",
                &self.history_reads,
            ),
            (
                "history_errors",
                "History reads that failed",
                &self.history_errors,
            ),
            ("disconnects", "Connections to NATS lost", &self.disconnects),
            (
                "reconnects",
                "Connections to NATS restored after a loss",
                &self.reconnects,
            ),
            (
                "resubscriptions",
                "Channels subscribed again after a reconnect",
                &self.resubscriptions,
            ),
            (
                "catchups",
                "Catch-ups from history requested after a reconnect",
                &self.catchups,
            ),
            (
                "nats_slow_consumer",
                "Times the NATS client dropped messages for a subscription",
                &self.slow_consumer_events,
            ),
            (
                "presence_refresh_errors",
                "Presence records that could not be refreshed",
                &self.presence_refresh_errors,
            ),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        r.register(
            "subscribed_channels",
            "Channels this node is subscribed to in NATS",
            self.subscribed_channels.clone(),
        );
        r.register(
            "nats_requests_in_flight",
            "JetStream requests sent by this node and not yet answered or timed out",
            self.requests_in_flight.clone(),
        );
        r.register(
            "connected",
            "Whether the connection to NATS is up",
            self.connected.clone(),
        );
        r.register(
            "nats_publish_seconds",
            "Time to store a publication (JetStream ack included)",
            self.publish_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn renders_prometheus_lines() {
        let m = Metrics::default();
        m.observe_publish(Duration::from_micros(300));
        let mut registry = Registry::with_prefix("herald");
        m.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("herald_broker_messages_published_total 1\n"),
            "{text}"
        );
        assert!(text.contains("herald_broker_nats_publish_seconds_bucket{le=\"0.00025\"} 0\n"));
        assert!(text.contains("herald_broker_nats_publish_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("herald_broker_nats_publish_seconds_count 1\n"));
        assert!(text
            .lines()
            .all(|l| l.starts_with("# ") || l.starts_with("herald_broker_")));
    }
}
