//! The admin JSON API under `/admin/api/`: the cluster overview and charts, channels (with
//! subscribers, and those with only history), one channel's presence and history (and removing
//! that history), a user's connections, disconnect, publish, broadcast,
//! server-side subscribe and unsubscribe, the audit log, the effective configuration with
//! secrets masked, and a configuration reload. Every action is recorded in the audit log
//! ([`super::audit`]).
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

use super::cluster::{EVERY, FRESH, LOST_KEPT};
use super::{Actor, Admin};
use crate::api::{body, raw_body, ApiError, UserChannelBody};
use crate::centrifugo::command::Action;
use crate::publishing::{self, Command};
use crate::state::App;

type ApiResult = Result<Value, ApiError>;

/// Channels listed at most per page.
const MAX_CHANNELS: usize = 500;
/// Channels with history asked of the broker per page at most (a Redis page may hold a few
/// hundred more: see `herald_broker_redis`'s admin module).
const MAX_HISTORY_CHANNELS: usize = 500;
/// A history listing cursor is at most this long (the brokers' are shorter: the longest, NATS's,
/// is an offset and an escaped channel name, at most 3 × 255 bytes).
const MAX_CURSOR_BYTES: usize = 1024;
/// Publications per history page at most.
const MAX_HISTORY_PAGE: u64 = 200;
/// Audit entries per answer at most (all that a node keeps).
const MAX_AUDIT: usize = super::audit::KEPT;
/// Presence entries whose node is looked up at most (the rest show no node).
const MAX_PRESENCE_NODES: usize = 200;
/// An audit entry's target is cut to this many characters (a broadcast may name many channels).
const MAX_TARGET_CHARS: usize = 200;

/// Whether the call changes something (and so needs the CSRF token from a browser).
pub fn changes_state(method: &Method) -> bool {
    method != Method::GET && method != Method::HEAD
}

/// Dispatch one authenticated admin API call (`path` without `/admin/api/`).
pub async fn dispatch(
    app: Arc<App>,
    admin: &Admin,
    actor: Actor,
    path: &str,
    req: Request<Incoming>,
) -> ApiResult {
    let query = parse_query(req.uri().query());
    match (req.method().clone(), path) {
        (Method::GET, "overview") => Ok(overview(&app, admin)),
        (Method::GET, "channels") => Ok(channels(&app, admin, &query)),
        (Method::GET, "channel") => channel(&app, admin, &query).await,
        (Method::GET, "history_channels") => history_channels(&app, admin, &query).await,
        (Method::GET, "connections") => connections(&app, admin, &query).await,
        (Method::GET, "config") => Ok(config(&app)),
        (Method::GET, "audit") => Ok(audit(admin, &query)),
        (Method::POST, method @ ("publish" | "broadcast")) => {
            let limit = crate::publishing::max_body_bytes(&app.ctx.config.limits, method);
            let bytes = raw_body(&app, req, limit).await?;
            let done = if method == "publish" {
                publish(&app, &bytes).await
            } else {
                crate::api::broadcast(&app, &bytes, None).await
            };
            admin.record(actor, method, &channels_of(&bytes), done.is_ok());
            done
        }
        (Method::POST, "disconnect") => {
            let b: DisconnectBody = body(&app, req).await?;
            let target = match (&b.user, &b.client) {
                (Some(user), _) => format!("user={user}"),
                (None, Some(client)) => format!("client={client}"),
                (None, None) => String::new(),
            };
            let done = disconnect(&app, b).await;
            admin.record(actor, "disconnect", &cut(target), done.is_ok());
            done
        }
        (Method::POST, method @ ("subscribe" | "unsubscribe")) => {
            let b: UserChannelBody = body(&app, req).await?;
            let target = cut(format!("user={} channel={}", b.user, b.channel));
            let done = crate::api::user_channel(&app, b, method == "subscribe").await;
            admin.record(actor, method, &target, done.is_ok());
            done
        }
        (Method::POST, "history_remove") => {
            let b: ChannelBody = body(&app, req).await?;
            let target = cut(b.channel.clone());
            let done = history_remove(&app, b.channel).await;
            admin.record(actor, "history_remove", &target, done.is_ok());
            done
        }
        (Method::POST, "reload") => {
            let done = reload(&app).await;
            admin.record(actor, "reload", "", done.is_ok());
            done
        }
        (
            _,
            "overview" | "channels" | "channel" | "history_channels" | "connections" | "config"
            | "audit" | "publish" | "broadcast" | "disconnect" | "subscribe" | "unsubscribe"
            | "history_remove" | "reload",
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

/// The channels a publish or broadcast body names, for the audit log (read leniently: the
/// command itself is parsed, and refused, by the API's code).
fn channels_of(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let names: Vec<&str> = match (&v["channel"], &v["channels"]) {
        (Value::String(c), _) => vec![c.as_str()],
        (_, Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    cut(names.join(","))
}

/// `s` cut to [`MAX_TARGET_CHARS`], with `…` when cut.
fn cut(s: String) -> String {
    match s.char_indices().nth(MAX_TARGET_CHARS) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s,
    }
}

/// The newest audit entries of this node (`?limit=`, default 100).
fn audit(admin: &Admin, query: &HashMap<String, String>) -> Value {
    let limit = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(100)
        .min(MAX_AUDIT);
    json!({ "entries": admin.audit.newest(limit), "kept": MAX_AUDIT })
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn overview(app: &App, admin: &Admin) -> Value {
    json!({
        "node": app.ctx.hub.node_name(),
        "nodes": admin.cluster.all_nodes(),
        "series": admin.cluster.series(),
        "interval_ms": EVERY.as_millis() as u64,
        "fresh_ms": FRESH.as_millis() as u64,
        "lost_kept_ms": LOST_KEPT.as_millis() as u64,
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

/// Every channel the cluster view knows of (this node's own and the other nodes' last reports),
/// with its subscriber count: unfiltered and uncapped.
fn every_channel(app: &App, admin: &Admin) -> Vec<(String, u64)> {
    admin.cluster.channels(
        app.ctx.hub.node_name(),
        app.ctx.hub.channels(),
        "",
        usize::MAX,
    )
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
    let subscribers: u64 = every_channel(app, admin)
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, s)| s)
        .sum();
    let presence = if ns.presence {
        let clients = broker.presence(name).await?;
        let nodes = presence_nodes(app, admin, &clients).await;
        let clients: Vec<Value> = clients
            .iter()
            .map(|c| {
                let mut v = json!(c);
                v["node"] = json!(nodes.get(&c.client));
                v
            })
            .collect();
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
        add_times(&mut page, &h.stored_at_ms);
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

/// Each history row's `time_ms` (when the broker stored it), where the broker told.
fn add_times(page: &mut Value, stored_at_ms: &[u64]) {
    if let Some(rows) = page["publications"].as_array_mut() {
        if rows.len() == stored_at_ms.len() {
            for (row, at) in rows.iter_mut().zip(stored_at_ms) {
                row["time_ms"] = json!(at);
            }
        }
    }
}

/// The body of an action on one channel.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelBody {
    channel: String,
}

/// Remove the channel's history in the broker (every node's view: it is shared); the stream's
/// epoch and top offset stay. Centrifugo's `history_remove` runs the same [`Action`], so both
/// answer 108 alike where the broker cannot remove history.
async fn history_remove(app: &App, channel: String) -> ApiResult {
    app.ctx.namespaces.resolve(&channel)?;
    Action::RemoveHistory { channel }.run(&app.ctx).await?;
    Ok(json!({}))
}

/// One page of the channels whose history holds publications and that have no subscriber the
/// cluster view knows of (`?cursor=` from the previous page, `?limit=`, `?q=` a substring applied
/// to the page, so a page may list fewer than it looked at).
async fn history_channels(app: &App, admin: &Admin, query: &HashMap<String, String>) -> ApiResult {
    let q = query.get("q").map(String::as_str).unwrap_or("");
    let limit = match query.get("limit") {
        None => 50,
        Some(l) => l.parse::<usize>().ok().filter(|l| *l > 0).ok_or_else(|| {
            ApiError::code(ErrorCode::BadRequest, "limit must be a positive integer")
        })?,
    }
    .min(MAX_HISTORY_CHANNELS);
    let cursor = query.get("cursor").map(String::as_str);
    if cursor.is_some_and(|c| c.is_empty() || c.len() > MAX_CURSOR_BYTES) {
        return Err(ApiError::code(
            ErrorCode::BadRequest,
            "cursor must be one a previous page gave",
        ));
    }
    let page = match app.ctx.hub.broker().history_channels(cursor, limit).await {
        Ok(Some(page)) => page,
        Ok(None) => return Ok(json!({ "available": false, "channels": [], "cursor": null })),
        // A cursor the broker cannot read is the caller's mistake, not the broker's.
        Err(herald_broker::BrokerError::Internal { message, .. }) if cursor.is_some() => {
            return Err(ApiError::code(
                ErrorCode::BadRequest,
                format!("cursor must be one a previous page gave ({message})"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let subscribed: std::collections::HashSet<String> = every_channel(app, admin)
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, _)| name)
        .collect();
    let mut names: Vec<String> = page
        .channels
        .into_iter()
        .filter(|c| !subscribed.contains(c) && (q.is_empty() || c.contains(q)))
        .collect();
    names.sort();
    names.dedup();
    Ok(json!({ "available": true, "channels": names, "cursor": page.cursor }))
}

/// Which node hosts each of the first [`MAX_PRESENCE_NODES`] presence entries (client id →
/// node): their users' connections, asked of every node in one question (about a second when
/// there are other nodes). A client not found (gone meanwhile, a node that did not answer, or
/// beyond the cap) has no node.
async fn presence_nodes(
    app: &App,
    admin: &Admin,
    clients: &[herald_protocol::ClientInfo],
) -> HashMap<String, String> {
    let mut users: Vec<String> = clients
        .iter()
        .take(MAX_PRESENCE_NODES)
        .map(|c| c.user.clone())
        .collect();
    users.sort();
    users.dedup();
    if users.is_empty() {
        return HashMap::new();
    }
    let found = match admin.cluster.users_connections(&app.ctx.hub, users).await {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(cause = %e, "admin: asking which node hosts each client failed");
            return HashMap::new();
        }
    };
    found
        .nodes
        .into_iter()
        .flat_map(|a| {
            let node = a.node;
            a.clients.into_iter().map(move |c| (c, node.clone()))
        })
        .collect()
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
    crate::api::disconnect_everywhere(app, b.user, b.client, None).await
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
