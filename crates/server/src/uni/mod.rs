//! One-way transports for clients that cannot or need not hold a WebSocket: Server-Sent Events
//! (`GET /connection/sse`, for `EventSource` in browsers) and newline-delimited JSON streaming
//! (`POST /connection/stream`, for `curl -N` and scripts). Both run the same [`Session`] as a
//! WebSocket connection (tokens, limits, recovery, slow-consumer policy, drain); only the wire
//! differs. See docs/transports.md.
//!
//! - [`event_id`]: the SSE event id that lets `Last-Event-ID` resume every channel.
//! - [`format`]: Herald frames → SSE events or NDJSON lines.
//! - [`refusal`]: the HTTP status and body of a refused `connect`.
//! - [`run`]: the connection's task, writing into hyper's response body or onto the raw socket.
//! - [`direct`]: an SSE request that opens its connection, served on the raw socket without
//!   hyper, so that an idle stream keeps no HTTP connection state (docs/benchmarks.md, "SSE
//!   beside WebSocket").

pub mod direct;
pub mod event_id;
pub mod format;
mod refusal;
pub mod run;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use herald_core::proxy::ClientMeta;
use herald_core::{Outbound, Session};
use herald_protocol::command::{ConnectParams, Message, SubOptions};
use herald_protocol::{Command, ErrorCode, StreamPosition};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::guard::{check_origin, loopback_host, Door, IpSlot, PeerAddr};
use crate::state::App;
use format::{Encoder, Format};

/// A streamed response.
pub type StreamResponse = Response<BoxBody<Bytes, Infallible>>;

/// Chunks buffered between the connection's task and the socket.
const CHUNKS: usize = 16;

/// Whether `path` belongs to a one-way transport.
pub fn is_stream_path(path: &str) -> bool {
    path == "/connection/sse" || path == "/connection/stream"
}

pub(crate) fn error(status: StatusCode, code: u16, message: &str) -> StreamResponse {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn bad_request(message: &str) -> StreamResponse {
    error(
        StatusCode::BAD_REQUEST,
        ErrorCode::BadRequest.as_u16(),
        message,
    )
}

/// What a request asks for: connect params, the channels in their order, and where to resume.
struct Wanted {
    params: ConnectParams,
    channels: Vec<String>,
    since: Vec<Option<StreamPosition>>,
}

/// `GET /connection/sse?channel=a&channel=b&token=…` (also `channels=a,b`), resumed from the
/// `Last-Event-ID` header (or a `last_event_id` query parameter).
fn sse_request<B>(req: &Request<B>) -> Result<Wanted, &'static str> {
    let mut params = ConnectParams::default();
    let mut channels: Vec<String> = Vec::new();
    let mut last_event_id = req
        .headers()
        .get("last-event-id")
        .map(|v| v.to_str().map(str::to_owned))
        .transpose()
        .map_err(|_| "Last-Event-ID is not text")?;
    for (key, value) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "token" => params.token = Some(value.into_owned()),
            "channel" => channels.push(value.into_owned()),
            "channels" => channels.extend(
                value
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned),
            ),
            "last_event_id" => {
                last_event_id.get_or_insert(value.into_owned());
            }
            "name" => params.name = Some(value.into_owned()),
            _ => {
                return Err(
                    "unknown query parameter (token, channel, channels, last_event_id, name)",
                )
            }
        }
    }
    let since = match last_event_id.filter(|id| !id.is_empty()) {
        Some(id) => event_id::decode(&id, channels.len())?,
        None => vec![None; channels.len()],
    };
    Ok(Wanted {
        params,
        channels,
        since,
    })
}

/// `POST /connection/stream` with `{"token"?, "subs": {channel: {"since"?}}, "data"?}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamBodyParams {
    token: Option<String>,
    name: Option<String>,
    /// For the connect proxy, as `connect.data`.
    data: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    subs: std::collections::BTreeMap<String, StreamSub>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamSub {
    since: Option<StreamPosition>,
}

async fn ndjson_request(app: &App, req: Request<Incoming>) -> Result<Wanted, StreamResponse> {
    let limit = app.ctx.config.limits.max_api_body_bytes;
    let wait = Duration::from_millis(app.ctx.config.limits.handshake_timeout_ms);
    let body = http_body_util::Limited::new(req.into_body(), limit);
    let bytes = match tokio::time::timeout(wait, body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::LimitExceeded.as_u16(),
                "body too large",
            ))
        }
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::BadRequest.as_u16(),
                "body did not arrive in time",
            ))
        }
    };
    let body: StreamBodyParams = serde_json::from_slice(&bytes).map_err(|_| {
        bad_request(
            "body must be {\"token\"?, \"name\"?, \"subs\": {channel: {\"since\"?}}, \"data\"?}",
        )
    })?;
    let mut params = ConnectParams {
        token: body.token,
        name: body.name,
        data: body.data,
        ..ConnectParams::default()
    };
    let mut channels = Vec::new();
    let mut since = Vec::new();
    for (channel, sub) in body.subs {
        params.subs.insert(
            channel.clone(),
            SubOptions {
                since: sub.since.clone(),
                token: None,
            },
        );
        channels.push(channel);
        since.push(sub.since);
    }
    Ok(Wanted {
        params,
        channels,
        since,
    })
}

/// The checks every streamed connection passes before it opens, as WebSocket upgrades do: a
/// `--dev` node answers loopback hosts only, the `Origin` must be allowed, the node must not be
/// draining, and (for a request that opens a connection, `opens`) the per-IP handshake rate
/// holds. `Ok` carries the request's `Origin`, to echo in `Access-Control-Allow-Origin`.
pub(crate) fn admit<B>(
    app: &App,
    req: &Request<B>,
    opens: bool,
) -> Result<Option<String>, Box<StreamResponse>> {
    let config = &app.ctx.config;
    if config.dev {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !loopback_host(host) {
            return Err(Box::new(error(
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied.as_u16(),
                "a --dev node answers only requests to a loopback host",
            )));
        }
    }
    // Browsers: the same origin rule as WebSocket upgrades, and the CORS header EventSource needs.
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    if let Err(why) = check_origin(config, req.headers(), Door::Herald) {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied.as_u16(),
            why,
        )));
    }
    if *app.draining.borrow() {
        return Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TemporarilyUnavailable.as_u16(),
            "node is draining",
        )));
    }
    let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
    if opens && peer.is_some_and(|ip| !app.handshakes.admit(ip)) {
        app.ctx.hub.metrics().handshakes_refused.inc();
        return Err(Box::new(error(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyRequests.as_u16(),
            "too many connections from this address",
        )));
    }
    Ok(origin)
}

/// A streamed response fed by `rx`, with the headers every stream needs.
pub(crate) fn stream_response(
    rx: mpsc::Receiver<Bytes>,
    content_type: &'static str,
    origin: Option<String>,
) -> StreamResponse {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(Frame::data(chunk)), rx))
    });
    let mut response = Response::new(StreamBody::new(stream).boxed());
    stream_headers(&mut response, content_type, origin);
    response
}

/// The headers every stream's response carries.
pub(crate) fn stream_headers<B>(
    response: &mut Response<B>,
    content_type: &'static str,
    origin: Option<String>,
) {
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Ask reverse proxies (nginx) not to buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    allow_origin(response, origin);
}

/// Echo an allowed `Origin` so that a browser on another origin may read the response.
pub(crate) fn allow_origin<B>(response: &mut Response<B>, origin: Option<String>) {
    if let Some(o) = origin.and_then(|o| HeaderValue::from_str(&o).ok()) {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// A stream the node accepted: its session connected and its first chunk encoded.
pub(crate) struct Opened {
    /// What the stream's task runs.
    pub stream: run::Stream,
    /// The first chunk of the body (SSE: `retry`, `connected`, recovered publications, the id).
    pub first: Bytes,
    /// The request's allowed `Origin`, to echo.
    pub origin: Option<String>,
}

/// What is known of a request before its parameters are read: it passed [`admit`].
struct Admitted {
    origin: Option<String>,
    bearer: Option<String>,
    ip_slot: Option<Arc<IpSlot>>,
    meta: Option<ClientMeta>,
}

fn admitted<B>(
    app: &App,
    req: &Request<B>,
    format: Format,
) -> Result<Admitted, Box<StreamResponse>> {
    let config = &app.ctx.config;
    let origin = admit(app, req, true)?;
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned());
    let ip_slot = req.extensions().get::<Arc<IpSlot>>().cloned();
    let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
    let meta = config.proxy.enabled().then(|| {
        let transport = match format {
            Format::Sse => "sse",
            Format::Ndjson => "stream",
        };
        crate::proxy::client_meta(&config.proxy, req.headers(), peer, transport)
    });
    Ok(Admitted {
        origin,
        bearer,
        ip_slot,
        meta,
    })
}

/// Admit and connect an SSE request (`GET /connection/sse`), whatever carried it: hyper, or
/// [`direct`] on a connection whose first request it was.
pub(crate) async fn open_sse<B>(
    app: &Arc<App>,
    req: &Request<B>,
) -> Result<Opened, StreamResponse> {
    let admitted = admitted(app, req, Format::Sse).map_err(|refused| *refused)?;
    let wanted = sse_request(req).map_err(bad_request)?;
    Box::pin(open(app, admitted, wanted, Format::Sse)).await
}

/// Serve a one-way transport request that came through hyper: the body is fed to hyper through
/// a channel. (An SSE request that opens its connection is served by [`direct`] instead.)
pub async fn serve(app: Arc<App>, req: Request<Incoming>) -> StreamResponse {
    let opened = match (req.method(), req.uri().path()) {
        (&Method::GET, "/connection/sse") => open_sse(&app, &req).await,
        (&Method::POST, "/connection/stream") => match admitted(&app, &req, Format::Ndjson) {
            Ok(admitted) => match ndjson_request(&app, req).await {
                Ok(wanted) => Box::pin(open(&app, admitted, wanted, Format::Ndjson)).await,
                Err(response) => Err(response),
            },
            Err(refused) => Err(*refused),
        },
        _ => Err(error(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BadRequest.as_u16(),
            "use GET /connection/sse or POST /connection/stream",
        )),
    };
    let opened = match opened {
        Ok(opened) => opened,
        Err(response) => return response,
    };
    let content_type = opened.stream.format.content_type();
    let (tx, rx) = mpsc::channel::<Bytes>(CHUNKS);
    let _ = tx.try_send(opened.first);
    let write_limit = Duration::from_millis(app.ctx.config.limits.write_timeout_ms);
    tokio::spawn(run::run(
        app,
        opened.stream,
        run::Channel::new(tx, write_limit),
    ));
    stream_response(rx, content_type, opened.origin)
}

/// Connect the session before answering, so that a refused token is an HTTP error, not a
/// stream that ends.
async fn open(
    app: &Arc<App>,
    admitted: Admitted,
    mut wanted: Wanted,
    format: Format,
) -> Result<Opened, StreamResponse> {
    let config = app.ctx.config.get();
    if wanted.params.token.is_none() {
        wanted.params.token = admitted.bearer;
    }
    if wanted.channels.len() > config.limits.max_channels_per_connection {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::LimitExceeded.as_u16(),
            "too many channels",
        ));
    }
    if format == Format::Sse {
        for (i, (channel, since)) in wanted.channels.iter().zip(&wanted.since).enumerate() {
            if wanted.channels[..i].contains(channel) {
                return Err(bad_request("a channel is named twice"));
            }
            wanted.params.subs.insert(
                channel.clone(),
                SubOptions {
                    since: since.clone(),
                    token: None,
                },
            );
        }
    }

    let out = Arc::new(Outbound::new(config.limits.outbound_queue_bytes));
    let mut session = Session::new(app.ctx.clone(), out.clone());
    if let Some(meta) = admitted.meta {
        session.set_client_meta(meta);
    }
    let connect = Message::Command {
        id: 1,
        command: Ok(Command::Connect(wanted.params)),
    };
    let refused = session.handle(connect).await;
    let drained = out.drain();
    if let Some(close) = refused {
        return Err(refusal::refused(
            drained.frames.first().map(|f| &f[..]),
            &close,
        ));
    }
    let limits = &config.limits;
    if limits.max_connections > 0 && app.ctx.hub.connection_count() > limits.max_connections {
        session.end().await;
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::LimitExceeded.as_u16(),
            "connection limit reached",
        ));
    }

    let mut encoder = Encoder::new(format, wanted.channels, wanted.since);
    let mut first = BytesMut::new();
    first.extend_from_slice(&encoder.preamble());
    let mut frames = drained.frames.into_iter();
    if let Some(reply) = frames.next() {
        encoder.connect_reply(&reply, &mut first);
    }
    let mut end = None;
    for frame in frames {
        end = end.or(encoder.push(&frame, &mut first));
    }
    Ok(Opened {
        stream: run::Stream {
            session,
            out,
            encoder,
            end,
            format,
            ip_slot: admitted.ip_slot,
        },
        first: first.freeze(),
        origin: admitted.origin,
    })
}
