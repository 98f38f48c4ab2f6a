//! Counters of the NATS broker, rendered as Prometheus text (prefix `herald_broker_`). Names
//! shared with the Redis broker mean the same thing, so one dashboard fits both; the rest are
//! NATS-specific.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the publish-time histogram, in seconds (the Redis broker's RTT buckets).
const PUBLISH_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// Relaxed atomics: each counter is independent and read only for `/metrics`.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) published: AtomicU64,
    pub(crate) publish_errors: AtomicU64,
    /// Messages stored: fewer than publications when queued ones were stored together.
    pub(crate) stored_messages: AtomicU64,
    /// Publishes that lost the race for the next offset to another publisher and retried.
    pub(crate) publish_conflicts: AtomicU64,
    pub(crate) publish_duplicates: AtomicU64,
    /// Sum of successful publish times, in microseconds.
    publish_micros: AtomicU64,
    /// Successful publishes per `PUBLISH_BUCKETS` bucket (not cumulative; beyond the last: none).
    publish_buckets: [AtomicU64; PUBLISH_BUCKETS.len()],
    pub(crate) history_reads: AtomicU64,
    pub(crate) history_errors: AtomicU64,
    /// Publications handed to the hub.
    pub(crate) received_publications: AtomicU64,
    pub(crate) received_presence: AtomicU64,
    pub(crate) received_control: AtomicU64,
    /// Messages that were not ours or did not decode.
    pub(crate) received_invalid: AtomicU64,
    /// Channels this node holds a NATS subscription for.
    pub(crate) subscribed_channels: AtomicI64,
    pub(crate) connected: AtomicI64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    /// Channel subscriptions the client re-sent after reconnects.
    pub(crate) resubscriptions: AtomicU64,
    /// Times the hub was asked to catch up (`on_reconnected`).
    pub(crate) catchups: AtomicU64,
    /// async-nats dropped messages for a subscription that could not keep up.
    pub(crate) slow_consumer_events: AtomicU64,
    pub(crate) presence_refresh_errors: AtomicU64,
}

pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

impl Metrics {
    /// Record one successful publish, waiting for the channel's earlier publishes included.
    pub(crate) fn observe_publish(&self, took: Duration) {
        let s = took.as_secs_f64();
        if let Some(i) = PUBLISH_BUCKETS.iter().position(|b| s <= *b) {
            self.publish_buckets[i].fetch_add(1, Relaxed);
        }
        inc(&self.published);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.publish_micros.fetch_add(micros, Relaxed);
    }

    /// Prometheus text exposition of every counter.
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP herald_broker_{name} {help}");
            let _ = writeln!(out, "# TYPE herald_broker_{name} {kind}");
            let _ = writeln!(out, "herald_broker_{name} {value}");
        };
        let counters: [(&str, &str, &AtomicU64); 17] = [
            (
                "messages_published_total",
                "Publications stored in JetStream by this node.",
                &self.published,
            ),
            (
                "publish_errors_total",
                "Publishes that failed.",
                &self.publish_errors,
            ),
            (
                "nats_stored_messages_total",
                "JetStream messages stored: fewer than publications when queued ones went together.",
                &self.stored_messages,
            ),
            (
                "publish_conflicts_total",
                "Publishes retried because another publisher took the offset.",
                &self.publish_conflicts,
            ),
            (
                "publish_duplicates_total",
                "Publishes answered from an earlier one with the same idempotency key.",
                &self.publish_duplicates,
            ),
            (
                "messages_received_total",
                "Publications received from NATS and handed to the hub.",
                &self.received_publications,
            ),
            (
                "received_presence_total",
                "Join/leave messages received from NATS.",
                &self.received_presence,
            ),
            (
                "received_control_total",
                "Control messages received from NATS.",
                &self.received_control,
            ),
            (
                "received_invalid_total",
                "Messages received that could not be decoded.",
                &self.received_invalid,
            ),
            (
                "history_reads_total",
                "History reads from JetStream.",
                &self.history_reads,
            ),
            (
                "history_errors_total",
                "History reads that failed.",
                &self.history_errors,
            ),
            (
                "disconnects_total",
                "Connections to NATS lost.",
                &self.disconnects,
            ),
            (
                "reconnects_total",
                "Connections to NATS restored after a loss.",
                &self.reconnects,
            ),
            (
                "resubscriptions_total",
                "Channels subscribed again after a reconnect.",
                &self.resubscriptions,
            ),
            (
                "catchups_total",
                "Catch-ups from history requested after a reconnect.",
                &self.catchups,
            ),
            (
                "nats_slow_consumer_total",
                "Times the NATS client dropped messages for a subscription.",
                &self.slow_consumer_events,
            ),
            (
                "presence_refresh_errors_total",
                "Presence records that could not be refreshed.",
                &self.presence_refresh_errors,
            ),
        ];
        for (name, help, counter) in counters {
            one(name, "counter", help, counter.load(Relaxed).to_string());
        }
        one(
            "subscribed_channels",
            "gauge",
            "Channels this node is subscribed to in NATS.",
            self.subscribed_channels.load(Relaxed).to_string(),
        );
        one(
            "connected",
            "gauge",
            "Whether the connection to NATS is up.",
            self.connected.load(Relaxed).to_string(),
        );
        let name = "herald_broker_nats_publish_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to store a publication (JetStream ack included)."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in PUBLISH_BUCKETS.iter().zip(&self.publish_buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.published.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.publish_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum:.6}");
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_lines() {
        let m = Metrics::default();
        m.observe_publish(Duration::from_micros(300));
        let text = m.render();
        assert!(text.contains("herald_broker_messages_published_total 1\n"));
        assert!(text.contains("herald_broker_nats_publish_seconds_bucket{le=\"0.00025\"} 0\n"));
        assert!(text.contains("herald_broker_nats_publish_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("herald_broker_nats_publish_seconds_count 1\n"));
        assert!(text
            .lines()
            .all(|l| l.starts_with("# ") || l.starts_with("herald_broker_")));
    }
}
