//! The node's application state: what every request handler and connection reaches through
//! `Arc<App>` (the hub, config, API key, connection counters, the drain). Kept apart from the
//! router so that handlers depend on the state, not on routing; and it knows no protocol: each
//! protocol's own state (the Pusher apps, the admin UI, the emulated sessions) is kept by that
//! protocol and handed to it by the route table ([`crate::http::Node`]; crate::layers).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use herald_core::NodeContext;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::watch;

use crate::guard::{HandshakeRate, PerIp};

/// Everything a request handler needs.
pub struct App {
    /// Hub, namespaces, tokens and config.
    pub ctx: Arc<NodeContext>,
    /// HTTP API key; `None` leaves the API open (only in `--dev`).
    pub api_key: Option<String>,
    /// Open WebSocket connections (for `limits.max_connections`).
    pub ws_connections: AtomicUsize,
    /// Flips to true when the node starts draining.
    pub draining: watch::Receiver<bool>,
    /// Open connections per client IP.
    pub per_ip: PerIp,
    /// WebSocket handshakes per second per client IP.
    pub handshakes: HandshakeRate,
    /// Open SSE connections.
    pub sse_connections: AtomicUsize,
    /// Open NDJSON streaming connections.
    pub ndjson_connections: AtomicUsize,
    /// Open WebSocket-emulation connections (SSE down, POST up).
    pub emulated_connections: AtomicUsize,
    /// Reloads the configuration (`SIGHUP`, `POST /admin/api/reload`).
    pub reloader: Arc<crate::reload::Reloader>,
}

impl App {
    /// Connections open on every transport (what a drain waits for).
    pub fn open_connections(&self) -> usize {
        self.ws_connections.load(Ordering::Relaxed)
            + self.sse_connections.load(Ordering::Relaxed)
            + self.ndjson_connections.load(Ordering::Relaxed)
            + self.emulated_connections.load(Ordering::Relaxed)
    }
}

/// `herald_ws_connections_open` and `herald_stream_connections_open{transport}`, read from the
/// App's counters at each scrape (the transports count in those atomics; the metrics read them
/// rather than keep a second count that could drift).
#[derive(Clone)]
pub struct OpenConnections(pub Arc<App>);

impl std::fmt::Debug for OpenConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenConnections")
    }
}

impl Collector for OpenConnections {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let app = &self.0;
        let n = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        encode_open(
            encoder,
            Counts {
                ws: n(&app.ws_connections),
                sse: n(&app.sse_connections),
                ndjson: n(&app.ndjson_connections),
                emulation: n(&app.emulated_connections),
            },
        )
    }
}

/// Open connections by transport, at one moment.
#[derive(Debug, Clone, Copy)]
struct Counts {
    ws: usize,
    sse: usize,
    ndjson: usize,
    emulation: usize,
}

fn encode_open(mut encoder: DescriptorEncoder, c: Counts) -> Result<(), std::fmt::Error> {
    let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    let ws = gauge(c.ws);
    ws.encode(encoder.encode_descriptor(
        "ws_connections_open",
        "WebSocket connections open at the transport.",
        None,
        ws.metric_type(),
    )?)?;
    let mut family = encoder.encode_descriptor(
        "stream_connections_open",
        "One-way stream connections open, by transport.",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (transport, n) in [
        ("sse", c.sse),
        ("ndjson", c.ndjson),
        ("emulation", c.emulation),
    ] {
        gauge(n).encode(family.encode_family(&[("transport", transport)])?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed(Counts);

    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_open(encoder, self.0)
        }
    }

    #[test]
    fn open_connections_keep_their_names_and_come_before_eof() {
        let text = herald_core::Metrics::new().render_with(Box::new(Fixed(Counts {
            ws: 3,
            sse: 2,
            ndjson: 1,
            emulation: 0,
        })));
        let expected =
            "# HELP herald_ws_connections_open WebSocket connections open at the transport.\n\
             # TYPE herald_ws_connections_open gauge\n\
             herald_ws_connections_open 3\n\
             # HELP herald_stream_connections_open One-way stream connections open, by transport.\n\
             # TYPE herald_stream_connections_open gauge\n\
             herald_stream_connections_open{transport=\"sse\"} 2\n\
             herald_stream_connections_open{transport=\"ndjson\"} 1\n\
             herald_stream_connections_open{transport=\"emulation\"} 0\n\
             # EOF\n";
        assert!(text.ends_with(expected), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(
            text.contains("herald_slow_consumers_total"),
            "the registry's own metrics"
        );
    }
}
