//! The HTTP answer to an SSE or NDJSON request whose `connect` the session refused: the status
//! says what a WebSocket client would learn from the error reply and the close code, so that a
//! script or a load balancer can tell "sign in" from "try again later" (docs/transports.md,
//! "Errors before the stream starts").

use herald_core::outbound::CloseRequest;
use herald_protocol::codes::APP_ERROR_CODES;
use herald_protocol::{CloseCode, ErrorCode};
use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::StatusCode;
use serde::Deserialize;

use super::{error, StreamResponse};

/// Seconds a `503` asks the client to wait: the SSE reconnect delay, rounded up.
const RETRY_AFTER_S: u64 = super::format::RETRY_MS.div_ceil(1000);

/// Protocol codes a `connect` may be refused with, for their HTTP status.
const PROTOCOL_CODES: [ErrorCode; 13] = [
    ErrorCode::Internal,
    ErrorCode::Unauthorized,
    ErrorCode::UnknownNamespace,
    ErrorCode::PermissionDenied,
    ErrorCode::UnknownMethod,
    ErrorCode::AlreadySubscribed,
    ErrorCode::LimitExceeded,
    ErrorCode::BadRequest,
    ErrorCode::NotAvailable,
    ErrorCode::TokenExpired,
    ErrorCode::TooManyRequests,
    ErrorCode::TemporarilyUnavailable,
    ErrorCode::BackendUnavailable,
];

/// The status for a refusal's `code`, as a WebSocket client would read its error reply and close:
/// - a protocol error code: the status the HTTP API gives it (101/109 → 401, 112 → 503, …),
///   except 100 after the connect hook failed (close 4005), which is the backend's fault: 502;
/// - an application code (connect hook `error`, 1000–1999): 1400–1499 are HTTP statuses plus
///   1000 (1401 → 401, 1403 → 403, 1429 → 429), any other is 403;
/// - a close code with no error reply (the connect hook's `disconnect`): 4000–4499 (the client
///   should come back) 503, 4500–4999 (it should not) 403.
fn status(code: u16, close: CloseCode) -> StatusCode {
    let status = if let Some(e) = PROTOCOL_CODES.iter().find(|e| e.as_u16() == code) {
        match (e, close) {
            (ErrorCode::Internal, CloseCode::BACKEND_ERROR) => 502,
            _ => e.http_status(),
        }
    } else if APP_ERROR_CODES.contains(&code) {
        match code - 1000 {
            s @ 400..=499 => s,
            _ => 403,
        }
    } else if CloseCode(code).reconnect() {
        503
    } else {
        403
    };
    StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN)
}

/// The answer to a refused `connect`: `first` is the first frame the session queued (its error
/// reply, when it sent one), `close` how the session ended. The body is
/// `{"error": {"code", "message"}}` with the error reply's code and message, or the close's code
/// and reason when there was no reply (a backend `disconnect`: `{"code": 4601, "message":
/// "banned"}`). A 503 carries `Retry-After`.
pub(crate) fn refused(first: Option<&[u8]>, close: &CloseRequest) -> StreamResponse {
    #[derive(Deserialize)]
    struct Reply {
        error: Failure,
    }
    #[derive(Deserialize)]
    struct Failure {
        code: u16,
        message: String,
    }
    let (code, message) = first
        .and_then(|f| serde_json::from_slice::<Reply>(f).ok())
        .map_or_else(
            || (close.code.0, close.reason.clone()),
            |r| (r.error.code, r.error.message),
        );
    let status = status(code, close.code);
    let mut response = error(status, code, &message);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(code: u16) -> CloseRequest {
        CloseRequest {
            code: CloseCode(code),
            reason: "why".into(),
            after_ms: None,
        }
    }

    fn answer(first: Option<&str>, code: u16) -> (u16, Option<String>, serde_json::Value) {
        use http_body_util::BodyExt;
        let r = refused(first.map(str::as_bytes), &close(code));
        let retry = r
            .headers()
            .get(RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let status = r.status().as_u16();
        let body = futures_util::FutureExt::now_or_never(r.into_body().collect())
            .expect("a full body")
            .unwrap()
            .to_bytes();
        (status, retry, serde_json::from_slice(&body).unwrap())
    }

    #[test]
    fn statuses_follow_the_reply_and_the_close() {
        let reply = |code: u16| format!(r#"{{"id":1,"error":{{"code":{code},"message":"m"}}}}"#);
        let cases = [
            (Some(reply(101)), 3501, 401),
            (Some(reply(109)), 4004, 401),
            (Some(reply(112)), 4005, 503),
            (Some(reply(100)), 4005, 502),
            (Some(reply(100)), 4500, 500),
            (Some(reply(1401)), 4505, 401),
            (Some(reply(1403)), 4505, 403),
            (Some(reply(1429)), 4505, 429),
            (Some(reply(1500)), 4505, 403),
            (Some(reply(1999)), 4505, 403),
            (None, 4601, 403),
            (None, 4401, 503),
        ];
        for (first, close, want) in cases {
            let (status, retry, _) = answer(first.as_deref(), close);
            assert_eq!(status, want, "{first:?} {close}");
            assert_eq!(retry.is_some(), want == 503, "{first:?} {close}");
        }
        let (_, retry, body) = answer(Some(&reply(112)), 4005);
        assert_eq!(retry.as_deref(), Some("2"));
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": 112, "message": "m"}})
        );
        let (_, _, body) = answer(None, 4601);
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": 4601, "message": "why"}})
        );
    }
}
