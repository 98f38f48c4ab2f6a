//! The node's application state: what every request handler and connection reaches through
//! `Arc<App>`. Kept apart from the router so that handlers depend on the state, not on routing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use herald_core::NodeContext;
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
    /// The emulated connections' inboxes, by session id.
    pub emulated: crate::emulation::Sessions,
    /// Pusher apps (none configured: `/app/*` closes with 4001, `/apps/*` answers 404).
    pub pusher: crate::pusher::Apps,
    /// The admin UI under `/admin` (`None`: off, the paths answer 404).
    pub admin: Option<Arc<crate::admin::Admin>>,
}

impl App {
    /// The open-connection counter of a one-way transport.
    pub fn stream_connections(&self, format: crate::uni::format::Format) -> &AtomicUsize {
        match format {
            crate::uni::format::Format::Sse => &self.sse_connections,
            crate::uni::format::Format::Ndjson => &self.ndjson_connections,
        }
    }

    /// Connections open on every transport (what a drain waits for).
    pub fn open_connections(&self) -> usize {
        self.ws_connections.load(Ordering::Relaxed)
            + self.sse_connections.load(Ordering::Relaxed)
            + self.ndjson_connections.load(Ordering::Relaxed)
            + self.emulated_connections.load(Ordering::Relaxed)
    }
}
