//! Counters of the NATS broker, rendered as Prometheus text (prefix `herald_broker_`). Names
//! shared with the Redis broker mean the same thing, so one dashboard fits both; the rest are
//! NATS-specific.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Relaxed atomics: each counter is independent and read only for `/metrics`.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) published: AtomicU64,
    pub(crate) publish_errors: AtomicU64,
    /// Publishes that lost the race for the next offset to another publisher and retried.
    pub(crate) publish_conflicts: AtomicU64,
    pub(crate) publish_duplicates: AtomicU64,
    /// Sum of successful publish latencies, in microseconds.
    pub(crate) publish_micros: AtomicU64,
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
    /// Prometheus text exposition of every counter.
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP herald_broker_{name} {help}");
            let _ = writeln!(out, "# TYPE herald_broker_{name} {kind}");
            let _ = writeln!(out, "herald_broker_{name} {value}");
        };
        let counters: [(&str, &str, &AtomicU64); 16] = [
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
        let _ = writeln!(out, "# HELP herald_broker_nats_publish_seconds Time to store a publication (JetStream ack included).");
        let _ = writeln!(out, "# TYPE herald_broker_nats_publish_seconds summary");
        let _ = writeln!(
            out,
            "herald_broker_nats_publish_seconds_sum {:.6}",
            self.publish_micros.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "herald_broker_nats_publish_seconds_count {}",
            self.published.load(Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_lines() {
        let m = Metrics::default();
        inc(&m.published);
        let text = m.render();
        assert!(text.contains("herald_broker_messages_published_total 1\n"));
        assert!(text.contains("herald_broker_nats_publish_seconds_count 1\n"));
        assert!(text
            .lines()
            .all(|l| l.starts_with("# ") || l.starts_with("herald_broker_")));
    }
}
