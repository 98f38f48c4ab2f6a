//! The broker's own counters, rendered as Prometheus text lines prefixed `herald_broker_`.
//!
//! Plain atomics: each is bumped once per publication or event, never per subscriber.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the round-trip histogram, in seconds.
const RTT_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// Counters shared by the broker, its connections and its subscribers.
#[derive(Default)]
pub(crate) struct Metrics {
    /// Publications stored and published (duplicates by idempotency key excluded).
    pub(crate) published: AtomicU64,
    /// Publishes that failed (Redis unreachable or an error).
    pub(crate) publish_errors: AtomicU64,
    /// Publication messages received from Redis pub/sub.
    pub(crate) received_publications: AtomicU64,
    /// Presence-change messages received.
    pub(crate) received_presence: AtomicU64,
    /// Control messages received.
    pub(crate) received_control: AtomicU64,
    /// Messages that could not be decoded (dropped).
    pub(crate) received_invalid: AtomicU64,
    /// Channels subscribed again after a reconnect.
    pub(crate) resubscriptions: AtomicU64,
    /// Times a subscription connection was restored (then the hub catches up).
    pub(crate) reconnects: AtomicU64,
    /// `on_reconnected` calls: catch-ups from history requested from the hub.
    pub(crate) catchups: AtomicU64,
    /// Channels this node is subscribed to now (the control channel excluded).
    pub(crate) subscribed_channels: AtomicI64,
    /// Subscription connections that are down now.
    pub(crate) disconnected: AtomicI64,
    rtt_buckets: [AtomicU64; RTT_BUCKETS.len()],
    rtt_count: AtomicU64,
    rtt_sum_us: AtomicU64,
}

impl Metrics {
    /// Record one command round trip.
    pub(crate) fn observe_rtt(&self, rtt: Duration) {
        let s = rtt.as_secs_f64();
        if let Some(i) = RTT_BUCKETS.iter().position(|b| s <= *b) {
            self.rtt_buckets[i].fetch_add(1, Relaxed);
        }
        self.rtt_count.fetch_add(1, Relaxed);
        self.rtt_sum_us.fetch_add(rtt.as_micros() as u64, Relaxed);
    }

    /// Prometheus text exposition.
    pub(crate) fn render(&self, mode: &str) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP herald_broker_{name} {help}");
            let _ = writeln!(out, "# TYPE herald_broker_{name} counter");
            let _ = writeln!(out, "herald_broker_{name} {v}");
        };
        counter(
            "messages_published_total",
            "Publications stored in Redis and published.",
            self.published.load(Relaxed),
        );
        counter(
            "publish_errors_total",
            "Publishes that failed.",
            self.publish_errors.load(Relaxed),
        );
        counter(
            "messages_received_total",
            "Publication messages received from Redis pub/sub.",
            self.received_publications.load(Relaxed),
        );
        counter(
            "received_presence_total",
            "Join/leave messages received from Redis pub/sub.",
            self.received_presence.load(Relaxed),
        );
        counter(
            "received_control_total",
            "Control messages received from Redis pub/sub.",
            self.received_control.load(Relaxed),
        );
        counter(
            "received_invalid_total",
            "Pub/sub messages that could not be decoded.",
            self.received_invalid.load(Relaxed),
        );
        counter(
            "resubscriptions_total",
            "Channels subscribed again after a reconnect.",
            self.resubscriptions.load(Relaxed),
        );
        counter(
            "reconnects_total",
            "Subscription connections restored after a loss.",
            self.reconnects.load(Relaxed),
        );
        counter(
            "catchups_total",
            "Catch-ups from history requested after a reconnect.",
            self.catchups.load(Relaxed),
        );
        let _ = writeln!(out, "# HELP herald_broker_subscribed_channels Channels this node is subscribed to in Redis.");
        let _ = writeln!(out, "# TYPE herald_broker_subscribed_channels gauge");
        let _ = writeln!(
            out,
            "herald_broker_subscribed_channels {}",
            self.subscribed_channels.load(Relaxed)
        );
        let _ = writeln!(out, "# HELP herald_broker_connected Whether every Redis subscription connection is up ({mode}).");
        let _ = writeln!(out, "# TYPE herald_broker_connected gauge");
        let up = i64::from(self.disconnected.load(Relaxed) == 0);
        let _ = writeln!(out, "herald_broker_connected{{mode=\"{mode}\"}} {up}");
        let _ = writeln!(
            out,
            "# HELP herald_broker_redis_rtt_seconds Round-trip time of Redis commands."
        );
        let _ = writeln!(out, "# TYPE herald_broker_redis_rtt_seconds histogram");
        let mut cumulative = 0;
        for (bound, n) in RTT_BUCKETS.iter().zip(&self.rtt_buckets) {
            cumulative += n.load(Relaxed);
            let _ = writeln!(
                out,
                "herald_broker_redis_rtt_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.rtt_count.load(Relaxed);
        let _ = writeln!(
            out,
            "herald_broker_redis_rtt_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum = self.rtt_sum_us.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "herald_broker_redis_rtt_seconds_sum {sum}");
        let _ = writeln!(out, "herald_broker_redis_rtt_seconds_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histogram() {
        let m = Metrics::default();
        m.published.fetch_add(3, Relaxed);
        m.observe_rtt(Duration::from_micros(300));
        m.observe_rtt(Duration::from_secs(5));
        let text = m.render("standalone");
        assert!(text.contains("herald_broker_messages_published_total 3\n"));
        assert!(text.contains("herald_broker_redis_rtt_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("herald_broker_redis_rtt_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("herald_broker_connected{mode=\"standalone\"} 1\n"));
    }
}
