//! The WebSocket opening handshake both WebSocket endpoints share (`/ws` for Herald's protocol,
//! `/app/{key}` for Pusher's): the checks every upgrade passes, the `101` answer, the codec
//! the upgraded socket is served with, and the closing handshake both end with.

use std::time::Duration;

use bytes::Bytes;
use herald_protocol::ErrorCode;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::upgrade::Upgraded;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_websockets::WebSocketStream;

use crate::guard::{check_origin, Door};
use crate::response::{error, HttpResponse};
use crate::state::App;

const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// An upgraded WebSocket.
pub(crate) type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// Check an upgrade request through `door` (upgrade headers, an allowed `Origin`, version 13, a
/// key): the `Sec-WebSocket-Accept` value to answer with, or the HTTP error that refuses it.
pub(crate) fn accept_key(
    app: &App,
    headers: &HeaderMap,
    door: Door,
) -> Result<String, Box<HttpResponse>> {
    let has = |name: header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(token))
    };
    if !has(header::UPGRADE, "websocket") || !has(header::CONNECTION, "upgrade") {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "expected a WebSocket upgrade",
        )));
    }
    if let Err(why) = check_origin(&app.ctx.config, headers, door) {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            why,
        )));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(|v| v.as_bytes())
        != Some(b"13")
    {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "Sec-WebSocket-Version must be 13",
        )));
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "missing Sec-WebSocket-Key",
        )));
    };
    Ok(accept_value(key.as_bytes()))
}

/// The `Sec-WebSocket-Accept` value for a `Sec-WebSocket-Key` (RFC 6455 4.2.2).
pub(crate) fn accept_value(key: &[u8]) -> String {
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key);
    sha.update(WS_GUID.as_bytes());
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes())
}

/// The permessage-deflate answer for this upgrade, when `limits.compression` allows it and the
/// client offers it (crate::compression).
pub(crate) fn compression(app: &App, headers: &HeaderMap) -> Option<&'static str> {
    match app.ctx.config.limits.compression {
        true => crate::compression::negotiate(headers),
        false => None,
    }
}

/// The `101 Switching Protocols` answer, with the permessage-deflate answer when negotiated.
pub(crate) fn switching_protocols(
    accept: &str,
    subprotocol: Option<&'static str>,
    extensions: Option<&'static str>,
) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(accept).expect("base64 is a header value"),
    );
    if let Some(p) = subprotocol {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    if let Some(e) = extensions {
        h.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static(e),
        );
    }
    response
}

/// Serve an upgraded connection. The codec's own frame limit sits far above
/// `limits.max_frame_bytes` so that the connection's check (close 4503) runs first; only absurd
/// frames hit the codec's limit (close 1009). With compression, the same limit bounds a message's
/// inflated size (a "zip bomb" is closed with 1009 once it inflates past it).
pub(crate) fn serve(upgraded: Upgraded, max_frame: usize, compression: bool) -> Ws {
    let limits =
        tokio_websockets::Limits::default().max_payload_len(Some(max_frame.saturating_mul(16)));
    tokio_websockets::ServerBuilder::new()
        .limits(limits)
        .config(tokio_websockets::Config::default().compression(compression))
        .serve(TokioIo::new(upgraded))
}

/// Send a close frame with `code` (1008 when it is not a valid close code) and `reason` (cut to
/// the 123 bytes a close frame holds), then read off what the peer still sends for up to a second,
/// so that it sees a clean closing handshake.
pub(crate) async fn close_and_wait<S>(ws: &mut S, code: u16, reason: &str, limit: Duration)
where
    S: futures_util::Sink<tokio_websockets::Message, Error = tokio_websockets::Error>
        + futures_util::Stream<Item = Result<tokio_websockets::Message, tokio_websockets::Error>>
        + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    let code = tokio_websockets::CloseCode::try_from(code)
        .unwrap_or(tokio_websockets::CloseCode::POLICY_VIOLATION);
    let mut reason = reason.to_owned();
    while reason.len() > 123 {
        reason.pop();
    }
    let close = tokio_websockets::Message::close(Some(code), &reason);
    if tokio::time::timeout(limit, ws.send(close)).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while ws.next().await.is_some() {}
    })
    .await;
}
