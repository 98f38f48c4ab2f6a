//! The admin web UI under `/admin` on the main port: a page of plain HTML, CSS and JavaScript
//! built into the binary (no front-end build step, nothing fetched from the internet), and the
//! JSON API it calls. Off unless `[admin] enabled` or `--dev`.
//!
//! - [`auth`]: the admin password, login sessions, CSRF tokens and the `Origin` check.
//! - [`limit`]: how many failed logins a source, and all sources, may make per window.
//! - [`cluster`]: every node's stats snapshot, shared through a broker presence set.
//! - [`api`]: the JSON endpoints under `/admin/api/`.
//! - [`audit`]: the last admin actions on this node, also logged.
//!
//! Routes: `GET /admin/` (the page), `GET /admin/app.js`, `GET /admin/app.css`,
//! `POST /admin/login`, `POST /admin/logout`, `GET /admin/session`, `/admin/api/*`.

pub mod api;
pub mod audit;
pub mod auth;
pub mod cluster;
pub mod limit;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::Bytes;
use herald_core::{Config, Hub};
use herald_protocol::ErrorCode;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::api::{body, ApiError};
use crate::guard::PeerAddr;
use crate::response::{error, json, HttpResponse};
use crate::state::App;
use audit::AuditLog;
use auth::{AdminAuth, AdminConfig, Caller, Denied};
use cluster::Cluster;
use limit::Locked;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The admin UI of one node: who may use it and what it knows about the cluster.
pub struct Admin {
    /// Password, sessions, CSRF.
    pub auth: AdminAuth,
    /// Every node's latest snapshot and the chart samples.
    pub cluster: Arc<Cluster>,
    /// The last admin actions on this node.
    pub audit: AuditLog,
}

/// Who made an admin call, and from where: what the audit log records of the caller.
#[derive(Debug, Clone, Copy)]
pub struct Actor {
    /// The credential or login session.
    pub caller: Caller,
    /// The TCP peer's address.
    pub source: IpAddr,
}

impl Admin {
    /// The admin UI if `[admin]` (or `--dev`) enables it; fails on settings that would leave it
    /// unprotected. `api_key` is the client API key in effect, which must not open it.
    pub fn from_config(config: &Config, api_key: Option<&str>) -> anyhow::Result<Option<Admin>> {
        let cfg = AdminConfig::parse(config.admin.as_ref())?;
        if !cfg.enabled.unwrap_or(config.dev) {
            return Ok(None);
        }
        let auth = AdminAuth::new(&cfg, config.dev, api_key, config.tls_cert.is_some())?;
        if !auth.password_required() {
            tracing::warn!(
                "dev mode without [admin] password: the admin UI is open to anyone on loopback"
            );
        }
        Ok(Some(Admin {
            auth,
            cluster: Arc::new(Cluster::new(&config.broker_url)),
            audit: AuditLog::default(),
        }))
    }

    /// Record an admin action in the audit log (memory and a log line): `action` is a short
    /// verb (`publish`, `reload`, …), `target` what it acted on (a channel, `user=…`, or "").
    /// Never pass a secret in `target`.
    pub fn record(&self, actor: Actor, action: &str, target: &str, ok: bool) {
        self.audit
            .record(&actor.caller.who(), actor.source, action, target, ok);
    }

    /// Start sharing this node's snapshot with the cluster, and summarising failed logins.
    pub fn start(&self, hub: &Hub) {
        self.cluster.spawn(hub.clone());
        limit::LoginLimit::spawn_summaries(Arc::downgrade(&self.auth.limit));
    }
}

/// Whether `path` belongs to the admin UI.
pub fn is_admin_path(path: &str) -> bool {
    path == "/admin" || path.starts_with("/admin/")
}

/// Answer one request under `/admin`; `admin` is the node's admin UI (`None`: off, every path
/// answers 404).
pub async fn handle(
    app: Arc<App>,
    admin: Option<Arc<Admin>>,
    req: Request<Incoming>,
) -> HttpResponse {
    let Some(admin) = admin else {
        return error(
            StatusCode::NOT_FOUND,
            ErrorCode::BadRequest,
            "no such endpoint",
        );
    };
    let path = req.uri().path().to_owned();
    let response = match (req.method(), path.as_str()) {
        (&Method::GET, "/admin") => {
            let mut r = text(StatusCode::MOVED_PERMANENTLY, "text/plain", "");
            r.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/admin/"));
            r
        }
        (&Method::GET, "/admin/" | "/admin/index.html") => {
            text(StatusCode::OK, "text/html; charset=utf-8", INDEX_HTML)
        }
        (&Method::GET, "/admin/app.js") => text(
            StatusCode::OK,
            "application/javascript; charset=utf-8",
            APP_JS,
        ),
        (&Method::GET, "/admin/app.css") => {
            text(StatusCode::OK, "text/css; charset=utf-8", APP_CSS)
        }
        (&Method::POST, "/admin/login") => login(&app, &admin, req).await,
        (&Method::POST, "/admin/logout") => match auth::same_origin(req.headers()) {
            Ok(()) => {
                admin.auth.logout(req.headers());
                let mut r = json(StatusCode::OK, &json!({}));
                set_cookie(&mut r, &admin.auth.clear_cookie());
                r
            }
            Err(e) => api_error(&e),
        },
        (&Method::GET, "/admin/session") => {
            if let Err(e) = auth::same_origin(req.headers()) {
                return with_page_headers(api_error(&e));
            }
            let csrf = admin.auth.session_csrf(req.headers());
            json(
                StatusCode::OK,
                &json!({
                    "node": app.ctx.hub.node_name(),
                    "password_required": admin.auth.password_required(),
                    "logged_in": csrf.is_some(),
                    "csrf": csrf,
                }),
            )
        }
        (_, p) if p.starts_with("/admin/api/") => {
            match admin.auth.check(
                req.headers(),
                source(&req),
                api::changes_state(req.method()),
            ) {
                Ok(caller) => {
                    let actor = Actor {
                        caller,
                        source: source(&req),
                    };
                    let rest = p.trim_start_matches("/admin/api/").to_owned();
                    match api::dispatch(app.clone(), &admin, actor, &rest, req).await {
                        Ok(body) => json(StatusCode::OK, &body),
                        Err(e) => api_error(&e),
                    }
                }
                Err(Denied::Error(e)) => api_error(&e),
                Err(Denied::Locked(locked)) => too_many_failures(locked),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            ErrorCode::BadRequest,
            "no such endpoint",
        ),
    };
    with_page_headers(response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    #[serde(default)]
    password: String,
}

async fn login(app: &App, admin: &Admin, req: Request<Incoming>) -> HttpResponse {
    // Login CSRF: another site must not log a browser into this node either.
    if let Err(e) = auth::same_origin(req.headers()) {
        return api_error(&e);
    }
    let source = source(&req);
    let b: LoginBody = match body(app, req).await {
        Ok(b) => b,
        Err(e) => return api_error(&e),
    };
    match admin.auth.login(source, &b.password) {
        Ok(Some((sid, csrf, login))) => {
            admin
                .audit
                .record(&auth::session_name(login), source, "login", "", true);
            let mut r = json(StatusCode::OK, &json!({ "csrf": csrf }));
            set_cookie(&mut r, &admin.auth.cookie(&sid));
            r
        }
        Ok(None) => {
            // A serial guesser waits a quarter second per guess; parallel ones meet the login
            // limit (admin::limit), which also logs failures, once per window.
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            api_error(&ApiError::code(
                ErrorCode::Unauthorized,
                "wrong admin password",
            ))
        }
        Err(locked) => too_many_failures(locked),
    }
}

/// The source address a login limit is kept for: the TCP peer. (A reverse proxy's own address
/// for everything behind it: `X-Forwarded-For` is not trusted, as any client can send one.)
fn source<B>(req: &Request<B>) -> IpAddr {
    req.extensions()
        .get::<PeerAddr>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.0.ip())
}

/// 429 with `Retry-After`, while the login limit refuses the caller.
fn too_many_failures(locked: Locked) -> HttpResponse {
    let secs = locked.seconds();
    let mut r = api_error(&ApiError::code(
        ErrorCode::TooManyRequests,
        format!("too many failed logins, retry after {secs} s"),
    ));
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

fn api_error(e: &ApiError) -> HttpResponse {
    error(e.status(), e.error_code(), e.message())
}

fn set_cookie(r: &mut HttpResponse, cookie: &str) {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
}

fn text(status: StatusCode, content_type: &'static str, body: &'static str) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// The page may not be framed (clickjacking) and loads nothing from elsewhere; answers are not
/// cached (they hold live data or a CSRF token).
fn with_page_headers(mut r: HttpResponse) -> HttpResponse {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    r
}
