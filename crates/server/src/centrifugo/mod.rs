//! Centrifugo's server HTTP API (v5/v6), so that an application and its Centrifugo server SDK
//! (`cent`, `gocent`, …) move to Herald by changing only the API's base URL.
//!
//! `POST /centrifugo/api/<method>` with Centrifugo's request bodies and replies
//! (`{"result": …}` or `{"error": {"code", "message"}}`, HTTP 200 either way, as Centrifugo
//! answers; with `X-Centrifugo-Error-Mode: transport` an error is an HTTP status and the bare
//! error). The key is the node's `api_key`, given as `X-API-Key: <key>`,
//! `Authorization: apikey <key>` or Herald's `Authorization: Bearer <key>`. A request to
//! Herald's own `/api/<method>` that carries `X-API-Key` or `Authorization: apikey` is answered
//! here too (Herald's API takes only `Bearer`, so the two never meet): a Centrifugo SDK pointed
//! at the node with Centrifugo's default `/api` path works unchanged.
//!
//! Publishing goes through [`crate::publishing`], like Herald's own API and the consumers, with
//! the requests decoded by [`command::decode`]; the other methods use the same broker and hub
//! calls as `crate::api`. Centrifugo fields that Herald cannot honour are refused by name (error
//! 107), never dropped silently: docs/migrating-from-centrifugo.md lists them.

pub mod command;
pub mod fields;

use std::sync::Arc;

use herald_broker::{BrokerError, HistoryQuery};
use herald_core::namespace::NamespaceError;
use herald_protocol::{ErrorCode, StreamPosition};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap};
use hyper::{Method, Request, StatusCode};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use self::fields::Fields;
use crate::api::{self, ApiError};
use crate::guard::origin_listed;
use crate::publishing::{self, PublishError};
use crate::response::{json as json_response, HttpResponse};
use crate::state::App;

/// The compatibility API's own path prefix.
pub const PREFIX: &str = "/centrifugo/api/";

/// Centrifugo methods Herald does not have: answered with error 108 and a reason, rather than
/// 404, so that a caller learns the method exists in Centrifugo but not here.
const NOT_AVAILABLE: &[(&str, &str)] = &[
    ("refresh", "Herald cannot extend a connection's expiry from the server: the client refreshes its token"),
    ("rpc", "Herald has no server-side RPC handlers"),
    ("connections", "a Centrifugo PRO method"),
    ("update_user_status", "a Centrifugo PRO method"),
    ("get_user_status", "a Centrifugo PRO method"),
    ("delete_user_status", "a Centrifugo PRO method"),
    ("block_user", "a Centrifugo PRO method"),
    ("unblock_user", "a Centrifugo PRO method"),
    ("revoke_token", "a Centrifugo PRO method"),
    ("invalidate_user_tokens", "a Centrifugo PRO method"),
    ("device_register", "a Centrifugo PRO method (push notifications)"),
    ("device_update", "a Centrifugo PRO method (push notifications)"),
    ("device_remove", "a Centrifugo PRO method (push notifications)"),
    ("device_list", "a Centrifugo PRO method (push notifications)"),
    ("device_topic_list", "a Centrifugo PRO method (push notifications)"),
    ("device_topic_update", "a Centrifugo PRO method (push notifications)"),
    ("user_topic_list", "a Centrifugo PRO method (push notifications)"),
    ("user_topic_update", "a Centrifugo PRO method (push notifications)"),
    ("send_push_notification", "a Centrifugo PRO method (push notifications)"),
    ("update_push_status", "a Centrifugo PRO method (push notifications)"),
    ("cancel_push", "a Centrifugo PRO method (push notifications)"),
    ("map_publish", "Centrifugo map channels are not supported"),
    ("map_remove", "Centrifugo map channels are not supported"),
    ("map_read_state", "Centrifugo map channels are not supported"),
    ("map_read_stream", "Centrifugo map channels are not supported"),
    ("map_stats", "Centrifugo map channels are not supported"),
    ("map_clear", "Centrifugo map channels are not supported"),
    ("shared_poll_publish", "Centrifugo shared polling is not supported"),
];

/// Centrifugo's error codes for the API (its `apiproto` errors, plus the client protocol's for
/// what only Herald answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CentError {
    /// Centrifugo's code.
    pub code: u16,
    /// For the caller.
    pub message: String,
}

impl CentError {
    fn new(code: u16, message: impl Into<String>) -> Self {
        CentError {
            code,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        CentError::new(107, message)
    }

    /// Herald's error code as Centrifugo's: the same number where the meaning is the same
    /// (100 internal, 101, 102 unknown channel/namespace, 103, 104, 106, 107, 108); Herald's
    /// 111 "broker temporarily unavailable" is Centrifugo's 100 (what Centrifugo answers when
    /// its engine fails, and what its consumers and SDK users retry), 110 "too many requests"
    /// is Centrifugo's 111.
    fn from_code(code: ErrorCode, message: &str) -> Self {
        match code {
            ErrorCode::TemporarilyUnavailable | ErrorCode::BackendUnavailable => {
                CentError::new(100, format!("temporarily unavailable: {message}"))
            }
            ErrorCode::TooManyRequests => CentError::new(111, message),
            other => CentError::new(other.as_u16(), message),
        }
    }

    /// The HTTP status in transport error mode (Centrifugo's mapping, with Herald's extra codes).
    fn status(&self) -> StatusCode {
        match self.code {
            101 => StatusCode::UNAUTHORIZED,
            102 | 104 => StatusCode::NOT_FOUND,
            103 => StatusCode::FORBIDDEN,
            106 => StatusCode::PAYLOAD_TOO_LARGE,
            107 | 108 => StatusCode::BAD_REQUEST,
            111 => StatusCode::TOO_MANY_REQUESTS,
            112 => StatusCode::RANGE_NOT_SATISFIABLE,
            113 => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn body(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

impl From<PublishError> for CentError {
    fn from(e: PublishError) -> Self {
        CentError::from_code(e.error_code(), e.message())
    }
}

impl From<BrokerError> for CentError {
    fn from(e: BrokerError) -> Self {
        PublishError::from(e).into()
    }
}

impl From<NamespaceError> for CentError {
    fn from(e: NamespaceError) -> Self {
        PublishError::from(e).into()
    }
}

impl From<ApiError> for CentError {
    fn from(e: ApiError) -> Self {
        CentError::from_code(e.error_code(), e.message())
    }
}

type CentResult = Result<Value, CentError>;

/// Whether a request to Herald's `/api/…` is a Centrifugo SDK's: it carries `X-API-Key` or
/// `Authorization: apikey …`, which Herald's own API never takes.
pub fn claims(headers: &HeaderMap) -> bool {
    headers.contains_key("x-api-key")
        || headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case("apikey "))
}

/// Answer a request to `/centrifugo/api/<method>` (or a claimed `/api/<method>`).
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> HttpResponse {
    let transport_mode = req
        .headers()
        .get("x-centrifugo-error-mode")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"transport"));
    let path = req.uri().path();
    let method = path
        .strip_prefix(PREFIX)
        .or_else(|| path.strip_prefix("/api/"))
        .unwrap_or("")
        .to_owned();
    match serve(&app, req, &method).await {
        Ok(result) => json_response(StatusCode::OK, &result),
        // Before the method ran (key, HTTP method, path, body): a status, as Centrifugo.
        Err(Refused { status, error }) => json_response(status, &json!({ "error": error.body() })),
        Err(Answered(error)) if transport_mode => json_response(error.status(), &error.body()),
        Err(Answered(error)) => json_response(StatusCode::OK, &json!({ "error": error.body() })),
    }
}

/// Why a request got no `result`.
enum Failure {
    /// Refused before it ran, with an HTTP status.
    Refused {
        status: StatusCode,
        error: CentError,
    },
    /// The method's own error.
    Answered(CentError),
}
use Failure::{Answered, Refused};

async fn serve(app: &App, req: Request<Incoming>, method: &str) -> Result<Value, Failure> {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let listed = origin
            .to_str()
            .is_ok_and(|o| origin_listed(&app.ctx.config.api_allowed_origins, o));
        if !listed {
            return Err(Refused {
                status: StatusCode::FORBIDDEN,
                error: CentError::new(
                    103,
                    "cross-origin API calls are refused (api_allowed_origins)",
                ),
            });
        }
    }
    if !authorized(app, req.headers()) {
        return Err(Refused {
            status: StatusCode::UNAUTHORIZED,
            error: CentError::new(
                101,
                "missing or wrong API key (X-API-Key: <key> or Authorization: apikey <key>)",
            ),
        });
    }
    let known = method == "batch" || is_method(method);
    let not_available = NOT_AVAILABLE.iter().find(|(m, _)| *m == method);
    if !known && not_available.is_none() {
        return Err(Refused {
            status: StatusCode::NOT_FOUND,
            error: CentError::new(104, format!("not found: no API method {method:?}")),
        });
    }
    if req.method() != Method::POST {
        return Err(Refused {
            status: StatusCode::METHOD_NOT_ALLOWED,
            error: CentError::bad("use POST"),
        });
    }
    let limit = match method {
        "broadcast" | "batch" => publishing::max_body_bytes(&app.ctx.config.limits, "broadcast"),
        _ => app.ctx.config.limits.max_api_body_bytes,
    };
    let body = api::raw_body(app, req, limit).await.map_err(|e| Refused {
        status: e.status(),
        error: CentError::from(e),
    })?;
    // Malformed JSON is a transport error in Centrifugo too (HTTP 400).
    if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
        return Err(Refused {
            status: StatusCode::BAD_REQUEST,
            error: CentError::bad("bad request: the body is not JSON"),
        });
    }
    if let Some((_, why)) = not_available {
        return Err(Answered(CentError::new(
            108,
            format!("not available: {method} is not supported by Herald ({why})"),
        )));
    }
    if method == "batch" {
        // Centrifugo's batch reply is `{"replies": […]}` itself, not wrapped in "result".
        return batch(app, &body).await.map_err(Answered);
    }
    call(app, method, &body)
        .await
        .map(|r| json!({ "result": r }))
        .map_err(Answered)
}

fn is_method(method: &str) -> bool {
    matches!(
        method,
        "publish"
            | "broadcast"
            | "subscribe"
            | "unsubscribe"
            | "disconnect"
            | "history_remove"
            | "presence"
            | "presence_stats"
            | "history"
            | "channels"
            | "info"
    )
}

/// The key as Centrifugo SDKs send it, or as Herald's own API takes it; compared in constant
/// time. No `api_key` configured: every call is allowed, as on Herald's API.
fn authorized(app: &App, headers: &HeaderMap) -> bool {
    let Some(key) = &app.api_key else {
        return true;
    };
    let from_header = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let from_auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            (scheme.eq_ignore_ascii_case("apikey") || scheme.eq_ignore_ascii_case("bearer"))
                .then_some(rest)
        });
    [from_header, from_auth]
        .into_iter()
        .flatten()
        .any(|given| constant_time_eq(given.trim().as_bytes(), key.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Run one method (not `batch`) on its request body.
async fn call(app: &App, method: &str, body: &[u8]) -> CentResult {
    match method {
        "publish" | "broadcast" => publish(app, method, body).await,
        "subscribe" | "unsubscribe" | "disconnect" | "history_remove" => {
            control(app, method, body).await
        }
        "presence" => presence(app, body, false).await,
        "presence_stats" => presence(app, body, true).await,
        "history" => history(app, body).await,
        "channels" => channels(app, body),
        "info" => info(app, body),
        other => match NOT_AVAILABLE.iter().find(|(m, _)| *m == other) {
            Some((_, why)) => Err(CentError::new(
                108,
                format!("not available: {other} is not supported by Herald ({why})"),
            )),
            None => Err(CentError::new(
                104,
                format!("not found: no API method {other:?}"),
            )),
        },
    }
}

/// `publish`: `{"offset", "epoch"}`. `broadcast`: `{"responses": [{"result"} or {"error"}]}`,
/// one per channel in the request's order.
async fn publish(app: &App, method: &str, body: &[u8]) -> CentResult {
    publishing::check_body_size(&app.ctx.config.limits, method, body.len())?;
    let cmd = command::decode(method, body)?;
    let done = publishing::execute(&app.ctx, &cmd, None).await?;
    let mut responses: Vec<Value> = done
        .results
        .into_iter()
        .map(|r| match r {
            Ok(p) => json!({"result": position(&p)}),
            Err(e) => json!({"error": CentError::from(e).body()}),
        })
        .collect();
    if method == "broadcast" {
        return Ok(json!({ "responses": responses }));
    }
    let one = responses.pop().unwrap_or(Value::Null);
    match one.get("error") {
        Some(e) => Err(CentError::new(
            e["code"].as_u64().unwrap_or(100) as u16,
            e["message"].as_str().unwrap_or_default(),
        )),
        None => Ok(one["result"].clone()),
    }
}

fn position(p: &StreamPosition) -> Value {
    json!({"offset": p.offset, "epoch": p.epoch})
}

/// `subscribe`, `unsubscribe` (a user's connections) and `disconnect` (a user's connections or
/// one client) on every node, and `history_remove` (the channel's stored publications; 108 on a
/// broker that cannot), decoded by [`command::action`] and run by [`command::Action::run`] as
/// the consumers run them: `{}`.
async fn control(app: &App, method: &str, body: &[u8]) -> CentResult {
    let action = command::action(method, body, &app.ctx.namespaces)?
        .ok_or_else(|| CentError::new(104, format!("not found: no API method {method:?}")))?;
    action.run(&app.ctx).await?;
    Ok(json!({}))
}

/// `presence`: `{"presence": {client: {"client", "user", "conn_info"?}}}`; `presence_stats`:
/// `{"num_clients", "num_users"}`.
async fn presence(app: &App, body: &[u8], stats: bool) -> CentResult {
    let name = if stats { "presence_stats" } else { "presence" };
    let mut f = Fields::parse(name, body)?;
    let channel: String = f.required("channel")?;
    f.finish(&[])?;
    let ns = app.ctx.namespaces.resolve(&channel)?;
    if !ns.presence {
        return Err(CentError::new(
            108,
            "not available: presence is off in this namespace",
        ));
    }
    if stats {
        let stats = app.ctx.hub.broker().presence_stats(&channel).await?;
        return Ok(json!({"num_clients": stats.num_clients, "num_users": stats.num_users}));
    }
    let clients = app.ctx.hub.broker().presence(&channel).await?;
    let presence: Map<String, Value> = clients
        .iter()
        .map(|c| {
            (
                c.client.clone(),
                client_info(&c.user, &c.client, c.info.as_deref()),
            )
        })
        .collect();
    Ok(json!({ "presence": presence }))
}

fn client_info(user: &str, client: &str, info: Option<&RawValue>) -> Value {
    let mut v = json!({"client": client, "user": user});
    if let Some(info) = info.and_then(|i| serde_json::from_str::<Value>(i.get()).ok()) {
        v["conn_info"] = info;
    }
    v
}

/// `history`: `{"publications": [{"data", "offset", "info"?}], "offset", "epoch"}`. As in
/// Centrifugo, no `limit` (or 0) answers the stream's position only, a negative `limit` every
/// kept publication; `since` a position no longer in history is error 112; `reverse` gives the
/// newest first (not with `since`).
async fn history(app: &App, body: &[u8]) -> CentResult {
    let mut f = Fields::parse("history", body)?;
    let channel: String = f.required("channel")?;
    let limit = f.take::<i64>("limit")?.unwrap_or(0);
    let since = match f.take::<Map<String, Value>>("since")? {
        Some(s) if !s.is_empty() => Some(StreamPosition {
            offset: s.get("offset").and_then(Value::as_u64).unwrap_or(0),
            epoch: s
                .get("epoch")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        }),
        _ => None,
    };
    let reverse = f.take::<bool>("reverse")?.unwrap_or(false);
    f.finish(&[])?;
    if reverse && since.is_some() {
        return Err(CentError::bad(
            "history: \"reverse\" with \"since\" is not supported by Herald",
        ));
    }
    let ns = app.ctx.namespaces.resolve(&channel)?;
    if ns.history_size == 0 {
        return Err(CentError::new(
            108,
            "not available: this namespace keeps no history",
        ));
    }
    let query = HistoryQuery {
        since: since.clone(),
        // Position only: ask for one publication (every broker answers that) and drop it.
        limit: match limit {
            0 => Some(1),
            n if n < 0 => None,
            n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        },
    };
    let h = app
        .ctx
        .hub
        .broker()
        .history(&channel, &query, &ns.stream_options())
        .await?;
    if since.is_some() && !h.continuous {
        return Err(CentError::new(112, "unrecoverable position"));
    }
    let mut publications: Vec<Value> = if limit == 0 {
        Vec::new()
    } else {
        h.publications
            .iter()
            .map(|p| {
                let data: Value = serde_json::from_slice(&p.data).unwrap_or(Value::Null);
                let mut v = json!({"data": data, "offset": p.offset});
                if let Some(i) = &p.info {
                    v["info"] = client_info(&i.user, &i.client, i.info.as_deref());
                }
                v
            })
            .collect()
    };
    if reverse {
        publications.reverse();
    }
    Ok(json!({
        "publications": publications,
        "offset": h.position.offset,
        "epoch": h.position.epoch,
    }))
}

/// `channels`: `{"channels": {name: {"num_clients"}}}`, the channels with subscribers on this
/// node, filtered by `pattern` (`*` any run of characters, `?` one character).
fn channels(app: &App, body: &[u8]) -> CentResult {
    let mut f = Fields::parse("channels", body)?;
    let pattern = f.string("pattern")?;
    f.finish(&[])?;
    let channels: Map<String, Value> = app
        .ctx
        .hub
        .channels()
        .into_iter()
        .filter(|(name, _)| pattern.is_empty() || glob(pattern.as_bytes(), name.as_bytes()))
        .map(|(name, n)| (name, json!({ "num_clients": n })))
        .collect();
    Ok(json!({ "channels": channels }))
}

/// Whether `text` matches `pattern` (`*`, `?`, other bytes literal).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// `info`: `{"nodes": [{"uid", "name", "version", "num_clients", "num_subs", "num_channels",
/// "uptime"}]}` from the nodes' reports (`num_users` is not counted by Herald: 0).
fn info(app: &App, body: &[u8]) -> CentResult {
    Fields::parse("info", body)?.finish(&[])?;
    let nodes: Vec<Value> = app
        .ctx
        .hub
        .nodes()
        .into_iter()
        .map(|n| {
            json!({
                "uid": n.name,
                "name": n.name,
                "version": format!("herald {}", n.version),
                "num_clients": n.connections,
                "num_subs": n.subscriptions,
                "num_channels": n.channels,
                "num_users": 0,
                "uptime": n.uptime_s,
            })
        })
        .collect();
    Ok(json!({ "nodes": nodes }))
}

/// `batch`: `{"commands": [{"<method>": {…}}, …], "parallel"?}` →
/// `{"replies": [{"<method>": result} or {"error"}, …]}`, in the commands' order; with
/// `parallel` the commands run concurrently. Parsed by [`crate::batch::parse`]: at most
/// `limits.max_batch_commands` commands (106), Herald's `{"method", "payload"}` taken too.
async fn batch(app: &App, body: &[u8]) -> CentResult {
    let batch = crate::batch::parse(body, &app.ctx.config.limits)?;
    let calls: Vec<_> = batch
        .commands
        .iter()
        .map(|command| async move {
            let command = command.as_ref().map_err(|e| CentError::from(e.clone()))?;
            let method = command.method.as_str();
            call(app, method, command.body()).await.map(|r| (method, r))
        })
        .collect();
    let replies: Vec<Value> = crate::batch::run(calls, batch.parallel)
        .await
        .into_iter()
        .map(|r| match r {
            Ok((method, v)) => Value::Object(Map::from_iter([(method.to_owned(), v)])),
            Err(e) => json!({"error": e.body()}),
        })
        .collect();
    Ok(json!({ "replies": replies }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_centrifugo_patterns() {
        assert!(glob(b"chat:*", b"chat:room1"));
        assert!(glob(b"*", b"x"));
        assert!(glob(b"a?c", b"abc"));
        assert!(!glob(b"a?c", b"abbc"));
        assert!(glob(b"*:room*", b"chat:room7"));
        assert!(!glob(b"chat:*", b"news:1"));
    }

    #[test]
    fn herald_codes_become_centrifugo_codes() {
        let down = CentError::from(PublishError::Unavailable("redis down".into()));
        assert_eq!(down.code, 100);
        assert!(down.message.contains("redis down"));
        let ns = CentError::from(NamespaceError::UnknownNamespace("x".into()));
        assert_eq!(ns.code, 102);
        assert_eq!(ns.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            CentError::new(112, "").status(),
            StatusCode::RANGE_NOT_SATISFIABLE
        );
    }

    #[test]
    fn sdk_headers_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!claims(&h));
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        assert!(!claims(&h));
        h.insert(header::AUTHORIZATION, "apikey k".parse().unwrap());
        assert!(claims(&h));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k".parse().unwrap());
        assert!(claims(&h));
    }
}
