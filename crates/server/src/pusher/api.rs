//! The Pusher HTTP API under `/apps/{id}/`: signed requests (see [`super::auth`]), events,
//! batches and channel queries (answered for the cluster: see [`super::census`]). Errors are
//! plain text with Pusher's statuses: 400 bad request (or over an app's limit), 401 bad
//! signature or stale timestamp, 403 an origin not in `pusher.cors_allowed_origins`, 404 unknown
//! app or path, 413 oversized event, 429 over an app's rate. `info` on a trigger is answered with
//! the channels' attributes.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use herald_broker::{ControlMessage, PublishOptions};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::apps::{take, valid_channel, Apps, ChannelKind, PusherApp};
use super::auth::check_request;
use super::census::Census;
use super::limits::check_event_name;
use super::wire::Envelope;
use super::Node;
use crate::guard::origin_listed;
use crate::response::HttpResponse;
use crate::state::App;

/// Channels one event may go to (an app's `max_event_channels_at_once` overrides it).
const MAX_EVENT_CHANNELS: usize = 100;
/// Events in one batch (an app's `max_event_batch_size` overrides it).
const MAX_BATCH: usize = 10;
/// The close code `terminate_connections` ends connections with (Pusher's "unauthorized").
const TERMINATED: u16 = super::codes::UNAUTHORIZED;

/// A refused request: status and plain-text message.
#[derive(Debug)]
struct Refused(StatusCode, String);

fn refused(status: StatusCode, message: impl Into<String>) -> Refused {
    Refused(status, message.into())
}

fn text(status: StatusCode, body: String) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn ok(body: serde_json::Value) -> Result<HttpResponse, Refused> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// Handle a request under `/apps/`. With `pusher.cors_allowed_origins` set, a browser's
/// request (one with `Origin`) is served to listed origins only (403 otherwise), its preflight
/// (`OPTIONS`) is answered without a signature, and the answer names the origin (CORS).
pub async fn handle(node: Arc<Node>, req: Request<Incoming>) -> HttpResponse {
    let allowed = &node.apps.settings.cors_allowed_origins;
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned)
        .filter(|_| !allowed.is_empty());
    if let Some(origin) = &origin {
        if !origin_listed(allowed, origin) {
            return text(
                StatusCode::FORBIDDEN,
                "Cross-origin calls from this origin are refused (pusher.cors_allowed_origins)"
                    .into(),
            );
        }
        if req.method() == Method::OPTIONS {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            let h = r.headers_mut();
            h.insert(
                "access-control-allow-methods",
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            h.insert(
                "access-control-allow-headers",
                HeaderValue::from_static("content-type, x-requested-with"),
            );
            h.insert("access-control-max-age", HeaderValue::from_static("600"));
            return with_cors(r, origin);
        }
    }
    let response = match dispatch(&node.state, &node.apps, req).await {
        Ok(r) => r,
        Err(Refused(status, message)) => text(status, message),
    };
    match &origin {
        Some(origin) => with_cors(response, origin),
        None => response,
    }
}

/// The CORS headers of an answer to `origin`.
fn with_cors(mut response: HttpResponse, origin: &str) -> HttpResponse {
    if let Ok(v) = HeaderValue::from_str(origin) {
        let h = response.headers_mut();
        h.insert("access-control-allow-origin", v);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn dispatch(app: &App, apps: &Apps, req: Request<Incoming>) -> Result<HttpResponse, Refused> {
    let path = req.uri().path().to_owned();
    let rest = path.strip_prefix("/apps/").unwrap_or("");
    let (id, route) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(pusher_app) = apps.by_id(id) else {
        return Err(refused(StatusCode::NOT_FOUND, format!("Unknown app {id}")));
    };
    let method = req.method().clone();
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let body = read_body(app, req).await?;
    let config = &pusher_app.config;
    check_request(
        &config.key,
        &config.secret,
        method.as_str(),
        &path,
        &query,
        &body,
        unix_now(),
    )
    .map_err(|e| refused(StatusCode::UNAUTHORIZED, e.0))?;
    if !pusher_app.enabled {
        return Err(refused(
            StatusCode::FORBIDDEN,
            format!("App {id} is disabled"),
        ));
    }
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let segments: Vec<&str> = route.split('/').collect();
    if method == Method::GET && !take(&pusher_app.reads, 1) {
        return Err(too_many("max_read_requests_per_second"));
    }
    let limits = Limits::of(apps, &pusher_app);
    match (&method, segments.as_slice()) {
        (&Method::POST, ["events"]) => {
            let event: EventBody = parse(&body)?;
            let channels = event.channels(limits.channels)?;
            let checked = event.event(&channels, &limits)?;
            if !take(&pusher_app.backend_events, 1) {
                return Err(too_many("max_backend_events_per_second"));
            }
            publish(app, apps, &pusher_app, &checked).await?;
            let Some(info) = event.info.as_deref().filter(|i| !i.is_empty()) else {
                return ok(json!({}));
            };
            let mut answer = serde_json::Map::new();
            for channel in &channels {
                let attributes = attributes(app, apps, &pusher_app, channel, info).await?;
                answer.insert(channel.clone(), attributes.into());
            }
            ok(json!({ "channels": answer }))
        }
        (&Method::POST, ["batch_events"]) => {
            let batch: BatchBody = parse(&body)?;
            if batch.batch.len() > limits.batch {
                return Err(refused(
                    StatusCode::BAD_REQUEST,
                    format!("Batch too large: at most {} events", limits.batch),
                ));
            }
            let mut events = Vec::with_capacity(batch.batch.len());
            for e in &batch.batch {
                let channels = e.channels(limits.channels)?;
                if channels.len() != 1 {
                    return Err(refused(
                        StatusCode::BAD_REQUEST,
                        "Each batch event names one channel",
                    ));
                }
                events.push(e.event(&channels, &limits)?);
            }
            if !take(&pusher_app.backend_events, events.len()) {
                return Err(too_many("max_backend_events_per_second"));
            }
            for e in &events {
                publish(app, apps, &pusher_app, e).await?;
            }
            let mut answers = Vec::with_capacity(events.len());
            for (body, checked) in batch.batch.iter().zip(&events) {
                answers.push(match body.info.as_deref().filter(|i| !i.is_empty()) {
                    Some(info) => {
                        let channel = &checked.channels[0];
                        attributes(app, apps, &pusher_app, channel, info)
                            .await?
                            .into()
                    }
                    None => json!({}),
                });
            }
            ok(json!({ "batch": answers }))
        }
        (&Method::GET, ["channels"]) => {
            channels(
                app,
                apps,
                &pusher_app,
                param("filter_by_prefix"),
                param("info"),
            )
            .await
        }
        (&Method::GET, ["channels", name]) => {
            channel(app, apps, &pusher_app, name, param("info")).await
        }
        (&Method::GET, ["channels", name, "users"]) => users(app, &pusher_app, name).await,
        (&Method::POST, ["users", user, "terminate_connections"]) => {
            terminate(app, &pusher_app, user).await
        }
        (
            _,
            ["events"]
            | ["batch_events"]
            | ["channels"]
            | ["channels", _]
            | ["channels", _, "users"]
            | ["users", _, "terminate_connections"],
        ) => Err(refused(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
        )),
        _ => Err(refused(
            StatusCode::NOT_FOUND,
            format!("No such endpoint {path}"),
        )),
    }
}

async fn read_body(app: &App, req: Request<Incoming>) -> Result<Bytes, Refused> {
    let limits = &app.ctx.config.limits;
    let limit = limits.max_api_body_bytes;
    let read = tokio::time::timeout(
        Duration::from_millis(limits.handshake_timeout_ms),
        Limited::new(req.into_body(), limit).collect(),
    );
    match read.await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body over {limit} bytes"),
        )),
        Ok(Err(_)) => Err(refused(
            StatusCode::BAD_REQUEST,
            "The body could not be read",
        )),
        Err(_) => Err(refused(
            StatusCode::REQUEST_TIMEOUT,
            "The body did not arrive in time",
        )),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refused> {
    serde_json::from_slice(body)
        .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("Invalid JSON body: {e}")))
}

/// One event of `/events` or of a batch.
#[derive(Deserialize)]
struct EventBody {
    name: String,
    data: Box<RawValue>,
    #[serde(default)]
    channels: Option<Vec<String>>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    socket_id: Option<String>,
    /// Attributes to answer for each channel (`user_count`, `subscription_count`).
    #[serde(default)]
    info: Option<String>,
}

/// The limits an app's events are checked against.
struct Limits {
    /// Channels per event.
    channels: usize,
    /// Events per batch.
    batch: usize,
    /// Bytes of event data.
    data_bytes: usize,
    /// Characters of an event name.
    name_chars: usize,
}

impl Limits {
    fn of(apps: &Apps, app: &PusherApp) -> Limits {
        let config = &app.config;
        Limits {
            channels: config
                .max_event_channels_at_once
                .unwrap_or(MAX_EVENT_CHANNELS),
            batch: config.max_event_batch_size.unwrap_or(MAX_BATCH),
            data_bytes: app.max_event_bytes(apps.settings.max_event_bytes),
            name_chars: app.max_event_name_chars(),
        }
    }
}

/// 429 for the app's limit `name`.
fn too_many(name: &str) -> Refused {
    refused(
        StatusCode::TOO_MANY_REQUESTS,
        format!("Too many requests: over the app's {name}"),
    )
}

/// The `info` attributes of one channel an event went to: `user_count` (presence channels)
/// and `subscription_count`, for the cluster.
async fn attributes(
    app: &App,
    apps: &Apps,
    pusher_app: &PusherApp,
    channel: &str,
    info: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, Refused> {
    let mut attributes = serde_json::Map::new();
    let presence = ChannelKind::of(channel) == ChannelKind::Presence;
    if presence && wants(Some(info), "user_count") {
        let n = user_ids(app, &pusher_app.internal(channel)).await?.len();
        attributes.insert("user_count".into(), json!(n));
    }
    if wants(Some(info), "subscription_count") {
        let n = census(apps)?
            .channel(pusher_app, channel)
            .await
            .map_err(|e| {
                tracing::warn!(app = %pusher_app.config.id, cause = %e, "channel count not read");
                refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
            })?;
        attributes.insert("subscription_count".into(), json!(n));
    }
    Ok(attributes)
}

#[derive(Deserialize)]
struct BatchBody {
    batch: Vec<EventBody>,
}

/// An event checked and ready to publish.
struct Checked {
    channels: Vec<String>,
    envelope: Bytes,
}

impl EventBody {
    fn channels(&self, max: usize) -> Result<Vec<String>, Refused> {
        let channels: Vec<String> = match (&self.channels, &self.channel) {
            (Some(list), None) => list.clone(),
            (None, Some(one)) => vec![one.clone()],
            _ => {
                return Err(refused(
                    StatusCode::BAD_REQUEST,
                    "Give either channels or channel",
                ))
            }
        };
        if channels.is_empty() || channels.len() > max {
            return Err(refused(
                StatusCode::BAD_REQUEST,
                format!("An event goes to 1 to {max} channels"),
            ));
        }
        if let Some(bad) = channels.iter().find(|c| !valid_channel(c)) {
            return Err(refused(
                StatusCode::BAD_REQUEST,
                format!("Invalid channel name {bad:?}"),
            ));
        }
        Ok(channels)
    }

    fn event(&self, channels: &[String], limits: &Limits) -> Result<Checked, Refused> {
        let max_data_bytes = limits.data_bytes;
        check_event_name(&self.name, limits.name_chars)
            .map_err(|e| refused(StatusCode::BAD_REQUEST, e.to_string()))?;
        if let Some(socket_id) = &self.socket_id {
            if !valid_socket_id(socket_id) {
                return Err(refused(StatusCode::BAD_REQUEST, "Invalid socket_id"));
            }
        }
        // Pusher's `data` is a string; other JSON is accepted as the string of its text.
        let text: String =
            serde_json::from_str(self.data.get()).unwrap_or_else(|_| self.data.get().to_owned());
        if text.len() > max_data_bytes {
            return Err(refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("Event data is over {max_data_bytes} bytes"),
            ));
        }
        let data = serde_json::value::to_raw_value(&text).expect("a string is JSON");
        let envelope = Envelope {
            event: self.name.as_str().into(),
            data: &data,
            user_id: None,
            exclude: self.socket_id.as_deref().map(Into::into),
        }
        .to_bytes();
        Ok(Checked {
            channels: channels.to_vec(),
            envelope,
        })
    }
}

/// `digits.digits`, as this server and Pusher hand them out.
fn valid_socket_id(s: &str) -> bool {
    s.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

async fn publish(
    app: &App,
    apps: &Apps,
    pusher_app: &PusherApp,
    event: &Checked,
) -> Result<(), Refused> {
    for channel in &event.channels {
        let opts = PublishOptions {
            stream: apps.namespace_for(channel).stream_options(),
            idempotency_key: None,
            traceparent: None,
            tags: Default::default(),
            skip_history: false,
        };
        let internal = pusher_app.internal(channel);
        app.ctx
            .hub
            .publish(&internal, event.envelope.clone(), None, &opts)
            .await
            .map_err(|e| {
                tracing::warn!(channel = %internal, cause = %e, "pusher event not published");
                refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
            })?;
    }
    Ok(())
}

/// Distinct user ids of a presence channel (cluster-wide, from the broker).
async fn user_ids(app: &App, internal: &str) -> Result<Vec<String>, Refused> {
    let clients = app.ctx.hub.broker().presence(internal).await.map_err(|e| {
        tracing::warn!(channel = %internal, cause = %e, "presence not read");
        refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
    })?;
    let mut seen = HashSet::new();
    Ok(clients
        .into_iter()
        .filter_map(|c| seen.insert(c.user.clone()).then_some(c.user))
        .collect())
}

fn wants(info: Option<&str>, attribute: &str) -> bool {
    info.is_some_and(|i| i.split(',').any(|a| a.trim() == attribute))
}

async fn channels(
    app: &App,
    apps: &Apps,
    pusher_app: &PusherApp,
    prefix: Option<&str>,
    info: Option<&str>,
) -> Result<HttpResponse, Refused> {
    let user_count = wants(info, "user_count");
    if user_count && !prefix.is_some_and(|p| p.starts_with("presence-")) {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "info=user_count needs filter_by_prefix=presence-",
        ));
    }
    let subscription_count = wants(info, "subscription_count");
    let counts = census(apps)?.channels(pusher_app).await.map_err(|e| {
        tracing::warn!(app = %pusher_app.config.id, cause = %e, "channel counts not read");
        refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
    })?;
    let mut map = serde_json::Map::new();
    for (name, subscriptions) in counts {
        if prefix.is_some_and(|p| !name.starts_with(p)) {
            continue;
        }
        let mut attributes = serde_json::Map::new();
        if user_count {
            let internal = pusher_app.internal(&name);
            attributes.insert(
                "user_count".into(),
                json!(user_ids(app, &internal).await?.len()),
            );
        }
        if subscription_count {
            attributes.insert("subscription_count".into(), json!(subscriptions));
        }
        map.insert(name, attributes.into());
    }
    ok(json!({ "channels": map }))
}

/// The node's cluster-wide subscription counts (started with the node's first app).
fn census(apps: &Apps) -> Result<&Census, Refused> {
    apps.census.as_deref().ok_or_else(|| {
        tracing::warn!("pusher channel counts asked for before they were started");
        refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
    })
}

async fn channel(
    app: &App,
    apps: &Apps,
    pusher_app: &PusherApp,
    name: &str,
    info: Option<&str>,
) -> Result<HttpResponse, Refused> {
    if !valid_channel(name) {
        return Err(refused(StatusCode::BAD_REQUEST, "Invalid channel name"));
    }
    let presence = ChannelKind::of(name) == ChannelKind::Presence;
    if wants(info, "user_count") && !presence {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "info=user_count is only for presence channels",
        ));
    }
    let subscribers = census(apps)?.channel(pusher_app, name).await.map_err(|e| {
        tracing::warn!(app = %pusher_app.config.id, cause = %e, "channel count not read");
        refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
    })?;
    let internal = pusher_app.internal(name);
    let mut body = serde_json::Map::new();
    let users = match presence {
        true => Some(user_ids(app, &internal).await?.len()),
        false => None,
    };
    let occupied = subscribers > 0 || users.is_some_and(|n| n > 0);
    body.insert("occupied".into(), json!(occupied));
    if let (true, Some(n)) = (wants(info, "user_count"), users) {
        body.insert("user_count".into(), json!(n));
    }
    if wants(info, "subscription_count") {
        body.insert("subscription_count".into(), json!(subscribers));
    }
    ok(body.into())
}

async fn users(app: &App, pusher_app: &PusherApp, name: &str) -> Result<HttpResponse, Refused> {
    if !valid_channel(name) || ChannelKind::of(name) != ChannelKind::Presence {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "Users are listed for presence channels only",
        ));
    }
    let ids = user_ids(app, &pusher_app.internal(name)).await?;
    let users: Vec<_> = ids.iter().map(|id| json!({ "id": id })).collect();
    ok(json!({ "users": users }))
}

/// Close every connection signed in as `user`, on every node (close code 4009).
async fn terminate(app: &App, pusher_app: &PusherApp, user: &str) -> Result<HttpResponse, Refused> {
    if user.is_empty() {
        return Err(refused(StatusCode::BAD_REQUEST, "Missing user id"));
    }
    let message = ControlMessage::Disconnect {
        user: Some(pusher_app.internal(user)),
        client: None,
        code: TERMINATED,
    };
    app.ctx
        .hub
        .broker()
        .publish_control(&message)
        .await
        .map_err(|e| {
            tracing::warn!(cause = %e, "terminate_connections not published");
            refused(StatusCode::SERVICE_UNAVAILABLE, "Temporarily unavailable")
        })?;
    ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_ids() {
        assert!(valid_socket_id("123.456"));
        assert!(!valid_socket_id("123."));
        assert!(!valid_socket_id("abc.1"));
        assert!(!valid_socket_id("1"));
    }

    #[test]
    fn event_data_stays_a_string_and_socket_is_excluded() {
        let body: EventBody = serde_json::from_str(
            r#"{"name":"e","data":"{\"a\":1}","channel":"c","socket_id":"1.2"}"#,
        )
        .unwrap();
        let channels = body.channels(100).unwrap();
        let limits = |data_bytes| Limits {
            channels: 100,
            batch: 10,
            data_bytes,
            name_chars: 200,
        };
        let checked = body.event(&channels, &limits(100)).unwrap();
        assert!(
            body.event(&channels, &limits(3)).is_err(),
            "over the data limit"
        );
        let v: serde_json::Value = serde_json::from_slice(&checked.envelope).unwrap();
        assert_eq!(
            v,
            json!({"event": "e", "data": "{\"a\":1}", "exclude": "1.2"})
        );
        let both: EventBody =
            serde_json::from_str(r#"{"name":"e","data":"x","channel":"c","channels":["d"]}"#)
                .unwrap();
        assert!(both.channels(100).is_err());
    }
}
