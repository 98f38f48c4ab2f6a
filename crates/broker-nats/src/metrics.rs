//! Counters of the NATS broker, rendered as Prometheus text (prefix `herald_broker_`).

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Relaxed atomics: each counter is independent and read only for `/metrics`.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) publishes: AtomicU64,
    pub(crate) publish_errors: AtomicU64,
    /// Publishes that lost the race for the next offset to another publisher and retried.
    pub(crate) publish_conflicts: AtomicU64,
    pub(crate) publish_duplicates: AtomicU64,
    /// Sum of publish latencies in microseconds (with `publishes`: the mean).
    pub(crate) publish_micros: AtomicU64,
    pub(crate) history_reads: AtomicU64,
    pub(crate) history_errors: AtomicU64,
    /// Publications handed to the hub.
    pub(crate) publications_received: AtomicU64,
    pub(crate) presence_changes_received: AtomicU64,
    pub(crate) control_received: AtomicU64,
    /// Messages on a delivery subject that were not ours or did not decode.
    pub(crate) malformed_received: AtomicU64,
    /// Channels this node holds a NATS subscription for.
    pub(crate) subscriptions: AtomicI64,
    pub(crate) connected: AtomicI64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    /// async-nats dropped messages for a subscription that could not keep up.
    pub(crate) slow_consumer_events: AtomicU64,
    pub(crate) presence_refresh_errors: AtomicU64,
}

pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Prometheus text exposition of every counter.
    pub(crate) fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::with_capacity(2048);
        let mut line = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP herald_broker_{name} {help}");
            let _ = writeln!(out, "# TYPE herald_broker_{name} {kind}");
            let _ = writeln!(out, "herald_broker_{name}{{broker=\"nats\"}} {value}");
        };
        line(
            "connected",
            "gauge",
            "1 while connected to NATS.",
            self.connected.load(Ordering::Relaxed).to_string(),
        );
        line(
            "subscriptions",
            "gauge",
            "Channels with a NATS subscription on this node.",
            self.subscriptions.load(Ordering::Relaxed).to_string(),
        );
        line(
            "publishes_total",
            "counter",
            "Publications stored in JetStream by this node.",
            get(&self.publishes).to_string(),
        );
        line(
            "publish_errors_total",
            "counter",
            "Publishes that failed.",
            get(&self.publish_errors).to_string(),
        );
        line(
            "publish_conflicts_total",
            "counter",
            "Publishes retried because another publisher took the offset.",
            get(&self.publish_conflicts).to_string(),
        );
        line(
            "publish_duplicates_total",
            "counter",
            "Publishes answered from an earlier one with the same idempotency key.",
            get(&self.publish_duplicates).to_string(),
        );
        line(
            "publish_seconds_sum",
            "counter",
            "Total time spent in successful publishes.",
            format!("{:.6}", get(&self.publish_micros) as f64 / 1e6),
        );
        line(
            "history_reads_total",
            "counter",
            "History reads.",
            get(&self.history_reads).to_string(),
        );
        line(
            "history_errors_total",
            "counter",
            "History reads that failed.",
            get(&self.history_errors).to_string(),
        );
        line(
            "publications_received_total",
            "counter",
            "Publications received from NATS and handed to the hub.",
            get(&self.publications_received).to_string(),
        );
        line(
            "presence_changes_received_total",
            "counter",
            "Join/leave messages received.",
            get(&self.presence_changes_received).to_string(),
        );
        line(
            "control_received_total",
            "counter",
            "Control messages received.",
            get(&self.control_received).to_string(),
        );
        line(
            "malformed_received_total",
            "counter",
            "Messages received that did not decode.",
            get(&self.malformed_received).to_string(),
        );
        line(
            "disconnects_total",
            "counter",
            "Connections to NATS lost.",
            get(&self.disconnects).to_string(),
        );
        line(
            "reconnects_total",
            "counter",
            "Reconnections after which the hub was told to catch up.",
            get(&self.reconnects).to_string(),
        );
        line(
            "slow_consumer_total",
            "counter",
            "Times the NATS client dropped messages for a subscription.",
            get(&self.slow_consumer_events).to_string(),
        );
        line(
            "presence_refresh_errors_total",
            "counter",
            "Presence records that could not be refreshed.",
            get(&self.presence_refresh_errors).to_string(),
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
        inc(&m.publishes);
        let text = m.render();
        assert!(text.contains("herald_broker_publishes_total{broker=\"nats\"} 1\n"));
        assert!(text
            .lines()
            .all(|l| l.starts_with("# ") || l.starts_with("herald_broker_")));
    }
}
