//! The admin JSON API under `/admin/api/`: the cluster overview and charts, channels, one
//! channel's presence and history, a user's connections, disconnect, publish, the effective
//! configuration with secrets masked, and a configuration reload.
//!
//! Reads come from the cluster view ([`super::cluster`]) or the broker, which every node shares;
//! actions reuse the HTTP API's paths (control messages, [`crate::publishing`]), so an admin
//! action reaches a client on any node exactly as an API call would.

use std::collections::HashMap;
use std::sync::Arc;

use herald_broker::HistoryQuery;
use herald_core::session::history_body;
use herald_protocol::{ErrorCode, StreamPosition};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::cluster::{EVERY, FRESH};
use super::Admin;
use crate::api::{body, raw_body, ApiError};
use crate::publishing::{self, Command};
use crate::state::App;

type ApiResult = Result<Value, ApiError>;

/// Channels listed at most per page.
const MAX_CHANNELS: usize = 500;
/// Publications per history page at most.
const MAX_HISTORY_PAGE: u64 = 200;

/// Whether the call changes something (and so needs the CSRF token from a browser).
pub fn changes_state(method: &Method) -> bool {
    method != Method::GET && method != Method::HEAD
}

/// Dispatch one authenticated admin API call (`path` without `/admin/api/`).
pub async fn dispatch(
    app: Arc<App>,
    admin: &Admin,
    path: &str,
    req: Request<Incoming>,
) -> ApiResult {
    let query = parse_query(req.uri().query());
    match (req.method().clone(), path) {
        (Method::GET, "overview") => Ok(overview(&app, admin)),
        (Method::GET, "channels") => Ok(channels(&app, admin, &query)),
        (Method::GET, "channel") => channel(&app, admin, &query).await,
        (Method::GET, "connections") => connections(&app, admin, &query).await,
        (Method::GET, "config") => Ok(config(&app)),
        (Method::POST, "publish") => {
            let limit = app.ctx.config.limits.max_api_body_bytes;
            let bytes = raw_body(&app, req, limit).await?;
            publish(&app, &bytes).await
        }
        (Method::POST, "disconnect") => disconnect(&app, body(&app, req).await?).await,
        (Method::POST, "reload") => reload(&app).await,
        (
            _,
            "overview" | "channels" | "channel" | "connections" | "config" | "publish"
            | "disconnect" | "reload",
        ) => Err(ApiError::with_status(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BadRequest,
            "method not allowed",
        )),
        _ => Err(ApiError::with_status(
            StatusCode::NOT_FOUND,
            ErrorCode::BadRequest,
            format!("no admin endpoint /admin/api/{path}"),
        )),
    }
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn overview(app: &App, admin: &Admin) -> Value {
    json!({
        "node": app.ctx.hub.node_name(),
        "nodes": admin.cluster.nodes(),
        "series": admin.cluster.series(),
        "interval_ms": EVERY.as_millis() as u64,
        "fresh_ms": FRESH.as_millis() as u64,
        "config_version": app.reloader.version(),
    })
}

fn channels(app: &App, admin: &Admin, query: &HashMap<String, String>) -> Value {
    let q = query.get("q").map(String::as_str).unwrap_or("");
    let limit = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(50)
        .min(MAX_CHANNELS);
    let list = admin
        .cluster
        .channels(app.ctx.hub.node_name(), app.ctx.hub.channels(), q, limit);
    let channels: Vec<Value> = list
        .into_iter()
        .map(|(name, n)| json!({"channel": name, "subscribers": n}))
        .collect();
    json!({ "channels": channels })
}

fn required<'a>(query: &'a HashMap<String, String>, key: &str) -> Result<&'a str, ApiError> {
    query
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::code(ErrorCode::BadRequest, format!("give ?{key}=")))
}

/// Presence and one page of history. Pages go backwards: `before` (an offset of the `epoch`)
/// gives the `limit` publications just older than it; without it, the newest.
async fn channel(app: &App, admin: &Admin, query: &HashMap<String, String>) -> ApiResult {
    let name = required(query, "name")?;
    let ns = app.ctx.namespaces.resolve(name)?;
    let broker = app.ctx.hub.broker();
    let subscribers: u64 = admin
        .cluster
        .channels(
            app.ctx.hub.node_name(),
            app.ctx.hub.channels(),
            "",
            usize::MAX,
        )
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, s)| s)
        .sum();
    let presence = if ns.presence {
        let clients = broker.presence(name).await?;
        json!({ "available": true, "clients": clients })
    } else {
        json!({ "available": false, "clients": [] })
    };
    let history = if ns.history_size == 0 {
        json!({ "available": false })
    } else {
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<u64>().ok())
            .unwrap_or(20)
            .clamp(1, MAX_HISTORY_PAGE);
        let before = query.get("before").and_then(|b| b.parse::<u64>().ok());
        let q = match (before, query.get("epoch")) {
            (Some(before), Some(epoch)) => {
                let since = before.saturating_sub(limit + 1);
                HistoryQuery {
                    since: Some(StreamPosition {
                        epoch: epoch.clone(),
                        offset: since,
                    }),
                    limit: Some(before.saturating_sub(1).saturating_sub(since) as usize),
                }
            }
            _ => HistoryQuery {
                since: None,
                limit: Some(limit as usize),
            },
        };
        let h = broker.history(name, &q, &ns.stream_options()).await?;
        let mut page = history_body(&h).map_err(|e| {
            tracing::error!(channel = %name, cause = %e, "stored history cannot be encoded");
            ApiError::code(ErrorCode::Internal, "internal error")
        })?;
        page["available"] = json!(true);
        page
    };
    Ok(json!({
        "channel": name,
        "subscribers": subscribers,
        "presence": presence,
        "history": history,
    }))
}

/// A user's connections on every node (asked through the broker; takes about a second).
async fn connections(app: &App, admin: &Admin, query: &HashMap<String, String>) -> ApiResult {
    let user = query.get("user").map(String::as_str).unwrap_or("");
    let found = admin.cluster.user_connections(&app.ctx.hub, user).await?;
    Ok(json!({
        "user": user,
        "nodes": found.nodes,
        "missing": found.missing,
    }))
}

async fn publish(app: &App, body: &[u8]) -> ApiResult {
    let cmd = Command::parse("publish", body)?;
    let mut done = publishing::execute(&app.ctx, &cmd, None).await?;
    let position = done.results.pop().expect("one result per channel")?;
    Ok(json!(position))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DisconnectBody {
    user: Option<String>,
    client: Option<String>,
}

async fn disconnect(app: &App, b: DisconnectBody) -> ApiResult {
    let (user, client) = (b.user.clone(), b.client.clone());
    let done = crate::api::disconnect_everywhere(app, b.user, b.client, None).await?;
    tracing::info!(?user, ?client, "admin: disconnect");
    Ok(done)
}

/// Load the configuration again on this node (as `SIGHUP` does): what was applied, what keeps
/// its old value until a restart, the version now loaded; a refused file is a 422 with why.
async fn reload(app: &App) -> ApiResult {
    let reloader = app.reloader.clone();
    // Reading the file and building clients blocks briefly: off the connections' threads.
    let outcome = tokio::task::spawn_blocking(move || reloader.reload("admin API"))
        .await
        .map_err(|_| ApiError::code(ErrorCode::Internal, "reload failed"))?;
    match outcome {
        Ok(outcome) => Ok(serde_json::to_value(outcome).unwrap_or(Value::Null)),
        Err(refused) => Err(ApiError::with_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::BadRequest,
            format!(
                "configuration refused, the old one stays in force: {}",
                refused.0
            ),
        )),
    }
}

/// The effective configuration, secrets replaced by `"***"`.
fn config(app: &App) -> Value {
    let mut v = serde_json::to_value(&*app.ctx.config).unwrap_or(Value::Null);
    mask(&mut v);
    v
}

/// Replace secret values (by key name) and URL passwords, at any depth.
pub fn mask(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                if is_secret_key(k) && !val.is_null() {
                    *val = json!("***");
                } else {
                    mask(val);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        Value::String(s) if s.contains("://") => *s = herald_broker::redact_url(s),
        _ => {}
    }
}

fn is_secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    k == "token"
        || k == "api_key"
        || k.contains("secret")
        || k.contains("password")
        || k.contains("private")
        || k.contains("credential")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_at_any_depth() {
        let mut v = json!({
            "api_key": "k", "token_hmac_secret": "s", "token_require_exp": true,
            "broker_url": "redis://:pw@h:1",
            "admin": {"password": "p", "token": "t", "enabled": true},
            "pusher": {"apps": [{"id": "1", "key": "public", "secret": "s"}]},
            "token_issuer": null,
        });
        mask(&mut v);
        let text = v.to_string();
        for secret in ["\"k\"", "\"s\"", ":pw@", "\"p\"", "\"t\""] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
        assert_eq!(v["token_require_exp"], json!(true));
        assert_eq!(v["pusher"]["apps"][0]["key"], json!("public"));
        assert_eq!(v["token_issuer"], Value::Null);
    }
}
