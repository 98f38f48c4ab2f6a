//! Request routing: `/ws`, `/api/*`, `/health`, `/ready`, `/metrics`, the demo page, the admin UI
//! (`/admin`), and the Pusher endpoints `/app/{key}` and `/apps/{id}/…`; and [`Node`], what the
//! routes hand requests to.

use std::convert::Infallible;
use std::sync::Arc;

use herald_protocol::ErrorCode;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode};

use crate::admin::Admin;
use crate::emulation::Sessions;
use crate::guard::{loopback_host, PeerAddr};
use crate::response::{error, json, text, HttpResponse};
use crate::state::App;
use crate::{api, ws};

/// The demo page and the SDK bundle it loads (built from clients/js).
const DEMO_HTML: &str = include_str!("../../../clients/js/demo/index.html");
const DEMO_JS: &str = include_str!("../../../clients/js/demo/herald.js");

/// The node as its routes see it: the state every handler shares, and each protocol's own,
/// handed to that protocol's handlers only (the state knows no protocol: crate::layers).
pub struct Node {
    /// The node's state.
    pub app: Arc<App>,
    /// The Pusher endpoints' apps (none configured: `/app/*` closes with 4001, `/apps/*`
    /// answers 404; a build without the `pusher` feature has neither endpoint).
    #[cfg(feature = "pusher")]
    pub pusher: Arc<crate::pusher::Node>,
    /// The admin UI under `/admin` (`None`: off, the paths answer 404).
    pub admin: Option<Arc<Admin>>,
    /// The emulated connections' inboxes, by session id.
    pub emulated: Arc<Sessions>,
}

/// Route one request.
pub async fn route(node: Arc<Node>, req: Request<Incoming>) -> Result<HttpResponse, Infallible> {
    let app = &node.app;
    let path = req.uri().path().to_owned();
    if app.ctx.config.dev {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .unwrap_or("");
        if !loopback_host(host) {
            return Ok(error(
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
                let mut r = error(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::TooManyRequests,
                    "too many WebSocket handshakes from this address",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            } else {
                ws::upgrade(app.clone(), req)
            }
        }
        (_, "/ws") => error(
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
        // Readiness (a Kubernetes readiness probe): whether the node takes new connections.
        (&Method::GET, "/ready") => {
            if *app.draining.borrow() {
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &serde_json::json!({"status": "draining"}),
                )
            } else {
                json(StatusCode::OK, &serde_json::json!({"status": "ready"}))
            }
        }
        (&Method::GET, "/metrics") => {
            let open = Box::new(crate::state::OpenConnections(app.clone()));
            let body = app.ctx.hub.metrics().render_with(open);
            text(StatusCode::OK, "text/plain; version=0.0.4", body)
        }
        (_, p) if p.starts_with(crate::centrifugo::PREFIX) => {
            crate::centrifugo::handle(app.clone(), req).await
        }
        (_, p) if p.starts_with("/api/") && crate::centrifugo::claims(req.headers()) => {
            crate::centrifugo::handle(app.clone(), req).await
        }
        (_, p) if p.starts_with("/api/") => api::handle(app.clone(), req).await,
        (_, p) if crate::admin::is_admin_path(p) => {
            crate::admin::handle(app.clone(), node.admin.clone(), req).await
        }
        #[cfg(feature = "pusher")]
        (&Method::GET, p) if p.starts_with("/app/") => {
            let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
            if peer.is_some_and(|ip| !app.handshakes.admit(ip)) {
                app.ctx.hub.metrics().handshakes_refused.inc();
                let mut r = error(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::TooManyRequests,
                    "too many WebSocket handshakes from this address",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            } else {
                crate::pusher::ws::upgrade(node.pusher.clone(), req)
            }
        }
        #[cfg(feature = "pusher")]
        (_, p) if p.starts_with("/apps/") => {
            crate::pusher::api::handle(node.pusher.clone(), req).await
        }
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
            "Herald real-time messaging node. WebSocket: /ws · API: /api/* · /health · /ready · /metrics\n",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            ErrorCode::BadRequest,
            "no such endpoint",
        ),
    };
    Ok(response)
}
