//! Request routing: `/ws`, `/api/*`, `/health`, `/metrics`, the demo page, the admin UI
//! (`/admin`), and the Pusher endpoints `/app/{key}` and `/apps/{id}/…`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use herald_core::NodeContext;
use herald_protocol::ErrorCode;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

use crate::guard::{loopback_host, HandshakeRate, PeerAddr, PerIp};
use crate::{api, ws};

/// The demo page and the SDK bundle it loads (built from clients/js).
const DEMO_HTML: &str = include_str!("../../../clients/js/demo/index.html");
const DEMO_JS: &str = include_str!("../../../clients/js/demo/herald.js");

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

/// A response with a body.
pub type HttpResponse = Response<Full<Bytes>>;

/// JSON response.
pub fn json(status: StatusCode, body: &serde_json::Value) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> HttpResponse {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Route one request.
pub async fn route(app: Arc<App>, req: Request<Incoming>) -> Result<HttpResponse, Infallible> {
    let path = req.uri().path().to_owned();
    if app.ctx.config.dev {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .unwrap_or("");
        if !loopback_host(host) {
            return Ok(api::error(
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied,
                "a --dev node answers only requests to a loopback host",
            ));
        }
    }
    let response = match (req.method(), path.as_str()) {
        (&Method::GET, "/ws") => {
            let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
            if peer.is_some_and(|ip| !app.handshakes.admit(ip)) {
                app.ctx.hub.metrics().handshakes_refused.inc();
                let mut r = api::error(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::TooManyRequests,
                    "too many WebSocket handshakes from this address",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            } else {
                ws::upgrade(app, req)
            }
        }
        (_, "/ws") => api::error(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BadRequest,
            "use GET with a WebSocket upgrade",
        ),
        (&Method::GET, "/health") => {
            if *app.draining.borrow() {
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &serde_json::json!({"status": "draining"}),
                )
            } else {
                json(StatusCode::OK, &serde_json::json!({"status": "ok"}))
            }
        }
        (&Method::GET, "/metrics") => {
            let ctx = &app.ctx;
            let mut body = ctx.hub.metrics().render();
            body.push_str(&format!(
                "# HELP herald_ws_connections_open WebSocket connections open at the transport.\n# TYPE herald_ws_connections_open gauge\nherald_ws_connections_open {}\n",
                app.ws_connections.load(Ordering::Relaxed)
            ));
            body.push_str(&format!(
                "# HELP herald_stream_connections_open One-way stream connections open, by transport.\n# TYPE herald_stream_connections_open gauge\nherald_stream_connections_open{{transport=\"sse\"}} {}\nherald_stream_connections_open{{transport=\"ndjson\"}} {}\nherald_stream_connections_open{{transport=\"emulation\"}} {}\n",
                app.sse_connections.load(Ordering::Relaxed),
                app.ndjson_connections.load(Ordering::Relaxed),
                app.emulated_connections.load(Ordering::Relaxed)
            ));
            text(StatusCode::OK, "text/plain; version=0.0.4", body)
        }
        (_, p) if p.starts_with("/api/") => api::handle(app, req).await,
        (_, p) if crate::admin::is_admin_path(p) => crate::admin::handle(app, req).await,
        (&Method::GET, p) if p.starts_with("/app/") => {
            let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
            if peer.is_some_and(|ip| !app.handshakes.admit(ip)) {
                app.ctx.hub.metrics().handshakes_refused.inc();
                let mut r = api::error(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::TooManyRequests,
                    "too many WebSocket handshakes from this address",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            } else {
                crate::pusher::ws::upgrade(app, req)
            }
        }
        (_, p) if p.starts_with("/apps/") => crate::pusher::api::handle(app, req).await,
        (&Method::GET, "/") if app.ctx.config.demo => {
            text(StatusCode::OK, "text/html; charset=utf-8", DEMO_HTML)
        }
        (&Method::GET, "/herald.js") if app.ctx.config.demo => text(
            StatusCode::OK,
            "application/javascript; charset=utf-8",
            DEMO_JS,
        ),
        (&Method::GET, "/") => text(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "Herald real-time messaging node. WebSocket: /ws · API: /api/* · /health · /metrics\n",
        ),
        _ => api::error(
            StatusCode::NOT_FOUND,
            ErrorCode::BadRequest,
            "no such endpoint",
        ),
    };
    Ok(response)
}
