//! The HTTP API: `Authorization: Bearer <api_key>`, JSON in and out, errors as
//! `{"error": {"code", "message"}}` with a fitting status.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herald_broker::{BrokerError, ControlMessage, HistoryQuery};
use herald_core::namespace::NamespaceError;
use herald_core::session::{history_body, presence_stats_body, PresenceQuery};
use herald_protocol::command::json_error_reason;
use herald_protocol::{CloseCode, CommandError, ErrorCode, StreamPosition};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{header, Method, Request, StatusCode};
use opentelemetry::Context;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use crate::guard::origin_listed;
use crate::otel::PublishSpans;
use crate::publishing::{self, Command, PublishError};
use crate::response::{error, json, HttpResponse};
use crate::state::App;

/// An API error: what went wrong ([`ErrorCode`], which says whose fault it is and whether a
/// retry can help), the HTTP status it is answered with, and a message for the caller.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl ApiError {
    /// An error answered with the code's own status.
    pub fn code(code: ErrorCode, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        ApiError::with_status(status, code, message)
    }

    /// An error answered with another status than the code's own (405, 404 for a path).
    pub fn with_status(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What went wrong.
    pub fn error_code(&self) -> ErrorCode {
        self.code
    }

    /// The message for the caller.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code.as_u16())
    }
}

impl std::error::Error for ApiError {}

/// The one place a publish error becomes an HTTP answer: the code's own status (106 → 413,
/// 108 → 503, …) and its message.
impl From<PublishError> for ApiError {
    fn from(e: PublishError) -> Self {
        ApiError::code(e.error_code(), e.message())
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::Unavailable { message: m, .. } => {
                ApiError::code(ErrorCode::TemporarilyUnavailable, m)
            }
            BrokerError::Internal { message: m, .. } => {
                tracing::error!(cause = %m, "broker error in API call");
                ApiError::code(ErrorCode::Internal, "internal error")
            }
        }
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        ApiError::code(e.code, e.message)
    }
}

impl From<NamespaceError> for ApiError {
    fn from(e: NamespaceError) -> Self {
        ApiError::code(e.code(), e.to_string())
    }
}

type ApiResult = Result<serde_json::Value, ApiError>;

/// Authenticate, parse, dispatch.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> HttpResponse {
    // Browsers send `Origin` on cross-site calls; only listed origins may use the API (CORS).
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    if let Some(origin) = &origin {
        if !origin_listed(&app.ctx.config.api_allowed_origins, origin) {
            return error(
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied,
                "cross-origin API calls are refused (api_allowed_origins)",
            );
        }
        if req.method() == Method::OPTIONS {
            let mut r = json(StatusCode::NO_CONTENT, &json!(null));
            *r.body_mut() = Default::default();
            let h = r.headers_mut();
            h.insert(
                "access-control-allow-methods",
                HeaderValue::from_static("GET, POST"),
            );
            h.insert(
                "access-control-allow-headers",
                HeaderValue::from_static("authorization, content-type"),
            );
            h.insert("access-control-max-age", HeaderValue::from_static("600"));
            return with_cors(r, origin);
        }
    }
    let response = match dispatch(app, req).await {
        Ok(body) => json(StatusCode::OK, &body),
        Err(e) => error(e.status, e.code, &e.message),
    };
    match &origin {
        Some(origin) => with_cors(response, origin),
        None => response,
    }
}

fn with_cors(mut response: HttpResponse, origin: &str) -> HttpResponse {
    if let Ok(v) = HeaderValue::from_str(origin) {
        response
            .headers_mut()
            .insert("access-control-allow-origin", v);
        response
            .headers_mut()
            .insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

async fn dispatch(app: Arc<App>, req: Request<Incoming>) -> ApiResult {
    authorize(&app, &req)?;
    // Off, tracing costs this one load; on, a bad `traceparent` is refused before the body.
    let trace = match crate::otel::enabled() {
        true => Some(
            crate::otel::request_parent(req.headers())
                .map_err(|why| ApiError::code(ErrorCode::BadRequest, why))?,
        ),
        false => None,
    };
    let method = req.method().clone();
    let path = req.uri().path().trim_start_matches("/api/").to_owned();
    match (method, path.as_str()) {
        (Method::GET, "channels") => Ok(channels(&app)),
        (Method::GET, "info") => Ok(json!({ "nodes": app.ctx.hub.nodes() })),
        (Method::POST, "publish") => {
            let limit = publishing::max_body_bytes(&app.ctx.config.limits, "publish");
            publish(&app, &raw_body(&app, req, limit).await?, trace).await
        }
        (Method::POST, "broadcast") => {
            let limit = publishing::max_body_bytes(&app.ctx.config.limits, "broadcast");
            broadcast(&app, &raw_body(&app, req, limit).await?, trace).await
        }
        (Method::POST, "batch") => {
            let limit = publishing::max_body_bytes(&app.ctx.config.limits, "batch");
            batch(&app, &raw_body(&app, req, limit).await?).await
        }
        (Method::POST, "history") => history(&app, body(&app, req).await?).await,
        (Method::POST, "presence") => presence(&app, body(&app, req).await?).await,
        (Method::POST, "presence_stats") => presence_stats(&app, body(&app, req).await?).await,
        (Method::POST, "subscribe") => user_channel(&app, body(&app, req).await?, true).await,
        (Method::POST, "unsubscribe") => user_channel(&app, body(&app, req).await?, false).await,
        (Method::POST, "disconnect") => disconnect(&app, body(&app, req).await?).await,
        (
            _,
            "channels" | "info" | "publish" | "broadcast" | "batch" | "history" | "presence"
            | "presence_stats" | "subscribe" | "unsubscribe" | "disconnect",
        ) => Err(ApiError::with_status(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BadRequest,
            "method not allowed",
        )),
        _ => Err(ApiError::with_status(
            StatusCode::NOT_FOUND,
            ErrorCode::BadRequest,
            format!("no API endpoint /api/{path}"),
        )),
    }
}

fn authorize(app: &App, req: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(key) = &app.api_key else {
        return Ok(());
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    // Constant-time comparison: the key is a secret.
    let ok = given.is_some_and(|g| {
        g.len() == key.len()
            && g.bytes()
                .zip(key.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::code(
            ErrorCode::Unauthorized,
            "missing or wrong API key (Authorization: Bearer <key>)",
        ))
    }
}

pub(crate) async fn body<T: DeserializeOwned>(
    app: &App,
    req: Request<Incoming>,
) -> Result<T, ApiError> {
    let bytes = raw_body(app, req, app.ctx.config.limits.max_api_body_bytes).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::code(
            ErrorCode::BadRequest,
            format!("bad JSON body: {}", json_error_reason(&e)),
        )
    })
}

/// The request body, at most `limit` bytes (413 beyond), cut off if it trickles in.
pub(crate) async fn raw_body(
    app: &App,
    req: Request<Incoming>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let limits = &app.ctx.config.limits;
    // A body that trickles in is cut off like a slow handshake.
    let read = tokio::time::timeout(
        Duration::from_millis(limits.handshake_timeout_ms),
        Limited::new(req.into_body(), limit).collect(),
    );
    let bytes: Bytes = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::code(
                ErrorCode::LimitExceeded,
                format!("request body over {limit} bytes"),
            ))
        }
        Ok(Err(_)) => {
            return Err(ApiError::code(
                ErrorCode::BadRequest,
                "the request body could not be read",
            ))
        }
        Err(_) => {
            return Err(ApiError::with_status(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::BadRequest,
                "the request body did not arrive in time",
            ))
        }
    };
    Ok(bytes)
}

async fn publish(app: &App, body: &[u8], trace: Option<Context>) -> ApiResult {
    let cmd = Command::parse("publish", body)?;
    let mut done = execute(app, &cmd, "/api/publish", trace).await?;
    let position = done.results.pop().expect("one result per channel")?;
    Ok(json!(position))
}

/// Run `cmd`; with tracing on (`trace`: the request's parent context), under the `publish` and
/// `broker.publish` spans, the publications carrying the latter's context when it is sampled.
async fn execute(
    app: &App,
    cmd: &Command,
    endpoint: &'static str,
    trace: Option<Context>,
) -> Result<publishing::Executed, PublishError> {
    let Some(parent) = trace else {
        return publishing::execute(&app.ctx, cmd, None).await;
    };
    let spans = PublishSpans::start(&parent, endpoint, cmd.channels(), app.ctx.hub.node_name());
    let traceparent = spans.traceparent();
    let done = publishing::execute_traced(&app.ctx, cmd, None, traceparent.as_deref()).await;
    let failure = match &done {
        Err(e) => Some(e.message().to_owned()),
        Ok(done) => done.failed(cmd).next().map(|(_, e)| e.message().to_owned()),
    };
    spans.end(failure.as_deref());
    done
}

/// Each channel's position or error, in the request's order; `published` and `failed` count
/// them. Partial failure still answers 200: retrying with the same `idempotency_key` publishes
/// the failed channels and no other twice.
pub(crate) async fn broadcast(app: &App, body: &[u8], trace: Option<Context>) -> ApiResult {
    let cmd = Command::parse("broadcast", body)?;
    let done = execute(app, &cmd, "/api/broadcast", trace).await?;
    let published = done.published();
    let failed = done.results.len() - published;
    let results: Vec<serde_json::Value> = done
        .results
        .into_iter()
        .map(|r| match r {
            Ok(position) => json!(position),
            Err(e) => {
                let e = ApiError::from(e);
                json!({"error": {"code": e.code.as_u16(), "message": e.message}})
            }
        })
        .collect();
    Ok(json!({ "results": results, "published": published, "failed": failed }))
}

/// `{"commands": [{"method", "payload"} or {"<method>": payload}, …], "parallel"?}` →
/// `{"replies": [{"result": …} or {"error": {"code", "message"}}, …]}`, one reply per command in
/// the request's order, each what the method's own endpoint answers (crate::batch has the
/// shape and the limits). A batch that cannot be read at all is an error of its own (400, 413).
async fn batch(app: &App, body: &[u8]) -> ApiResult {
    let batch = crate::batch::parse(body, &app.ctx.config.limits)?;
    let calls: Vec<_> = batch
        .commands
        .iter()
        .map(|command| async move {
            let command = command.as_ref().map_err(|e| ApiError::from(e.clone()))?;
            call(app, &command.method, command.body()).await
        })
        .collect();
    let replies: Vec<serde_json::Value> = crate::batch::run(calls, batch.parallel)
        .await
        .into_iter()
        .map(|r| match r {
            Ok(result) => json!({ "result": result }),
            Err(e) => json!({"error": {"code": e.code.as_u16(), "message": e.message}}),
        })
        .collect();
    Ok(json!({ "replies": replies }))
}

/// One command of a batch: a POST endpoint's method on its body.
async fn call(app: &App, method: &str, payload: &[u8]) -> ApiResult {
    fn parse<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ApiError> {
        serde_json::from_slice(payload).map_err(|e| {
            ApiError::code(
                ErrorCode::BadRequest,
                format!("bad JSON body: {}", json_error_reason(&e)),
            )
        })
    }
    publishing::check_body_size(&app.ctx.config.limits, method, payload.len())?;
    match method {
        "publish" => publish(app, payload, None).await,
        "broadcast" => broadcast(app, payload, None).await,
        "history" => history(app, parse(payload)?).await,
        "presence" => presence(app, parse(payload)?).await,
        "presence_stats" => presence_stats(app, parse(payload)?).await,
        "subscribe" => user_channel(app, parse(payload)?, true).await,
        "unsubscribe" => user_channel(app, parse(payload)?, false).await,
        "disconnect" => disconnect(app, parse(payload)?).await,
        other => Err(ApiError::code(
            ErrorCode::UnknownMethod,
            format!(
                "unknown method {other:?} in a batch (publish, broadcast, history, presence, \
                 presence_stats, subscribe, unsubscribe, disconnect)"
            ),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryBody {
    channel: String,
    since: Option<StreamPosition>,
    limit: Option<usize>,
}

async fn history(app: &App, b: HistoryBody) -> ApiResult {
    let ns = app.ctx.namespaces.resolve(&b.channel)?;
    if ns.history_size == 0 {
        return Err(ApiError::code(
            ErrorCode::NotAvailable,
            "this namespace keeps no history",
        ));
    }
    let query = HistoryQuery {
        since: b.since,
        limit: b.limit,
    };
    let h = app
        .ctx
        .hub
        .broker()
        .history(&b.channel, &query, &ns.stream_options())
        .await?;
    history_body(&h).map_err(|e| {
        tracing::error!(channel = %b.channel, cause = %e, "stored history cannot be encoded");
        ApiError::code(ErrorCode::Internal, "internal error")
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelBody {
    channel: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresenceBody {
    channel: String,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn presence(app: &App, b: PresenceBody) -> ApiResult {
    let query = PresenceQuery::new(b.limit, b.cursor)?;
    presence_on(app, &b.channel)?;
    Ok(query.run(app.ctx.hub.broker().as_ref(), &b.channel).await?)
}

async fn presence_stats(app: &App, b: ChannelBody) -> ApiResult {
    presence_on(app, &b.channel)?;
    let stats = app.ctx.hub.broker().presence_stats(&b.channel).await?;
    Ok(presence_stats_body(&stats))
}

/// The channel's namespace keeps presence (404, error 108 otherwise).
fn presence_on(app: &App, channel: &str) -> Result<(), ApiError> {
    let ns = app.ctx.namespaces.resolve(channel)?;
    if !ns.presence {
        return Err(ApiError::code(
            ErrorCode::NotAvailable,
            "presence is off in this namespace",
        ));
    }
    Ok(())
}

/// `subscribe` and `unsubscribe`'s body: the API's and the admin UI's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserChannelBody {
    pub(crate) user: String,
    pub(crate) channel: String,
}

/// Subscribe (or unsubscribe) every connection of a user on every node: a control message.
pub(crate) async fn user_channel(app: &App, b: UserChannelBody, subscribe: bool) -> ApiResult {
    app.ctx.namespaces.resolve(&b.channel)?;
    let message = if subscribe {
        ControlMessage::Subscribe {
            user: b.user,
            channel: b.channel,
        }
    } else {
        ControlMessage::Unsubscribe {
            user: b.user,
            channel: b.channel,
        }
    };
    app.ctx.hub.broker().publish_control(&message).await?;
    Ok(json!({}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DisconnectBody {
    user: Option<String>,
    client: Option<String>,
    code: Option<u16>,
}

async fn disconnect(app: &App, b: DisconnectBody) -> ApiResult {
    disconnect_everywhere(app, b.user, b.client, b.code).await
}

/// Close the connections of `user` or of `client` on every node, with `code` (4000–4999;
/// default 4502): the API's `disconnect` and the admin UI's.
pub(crate) async fn disconnect_everywhere(
    app: &App,
    user: Option<String>,
    client: Option<String>,
    code: Option<u16>,
) -> ApiResult {
    if user.is_none() && client.is_none() {
        return Err(ApiError::code(
            ErrorCode::BadRequest,
            "give \"user\" or \"client\"",
        ));
    }
    let code = code.unwrap_or(CloseCode::DISCONNECTED_BY_API.0);
    if !(4000..5000).contains(&code) {
        return Err(ApiError::code(
            ErrorCode::BadRequest,
            "code must be within 4000–4999",
        ));
    }
    let message = ControlMessage::Disconnect { user, client, code };
    app.ctx.hub.broker().publish_control(&message).await?;
    Ok(json!({}))
}

fn channels(app: &App) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = app
        .ctx
        .hub
        .channels()
        .into_iter()
        .map(|(name, n)| (name, json!({ "subscribers": n })))
        .collect();
    json!({ "channels": map })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_errors_answer_with_their_codes_status() {
        let big = ApiError::from(PublishError::refused(ErrorCode::LimitExceeded, "too big"));
        assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(big.message(), "too big");
        let down = ApiError::from(PublishError::from(BrokerError::unavailable("down")));
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(down.error_code(), ErrorCode::TemporarilyUnavailable);
        assert_eq!(down.message(), "down");
    }
}
