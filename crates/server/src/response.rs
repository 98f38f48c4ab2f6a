//! HTTP response helpers every handler shares, and the JSON error answer
//! (`{"error": {"code", "message"}}`) of the HTTP API, the upgrades and the route table.

use bytes::Bytes;
use herald_protocol::ErrorCode;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

/// A response with a body.
pub type HttpResponse = Response<Full<Bytes>>;

/// JSON response.
pub fn json(status: StatusCode, body: &serde_json::Value) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A response with `content_type` and `body`.
pub fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> HttpResponse {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A JSON error answer: `{"error": {"code", "message"}}` with `status`.
pub fn error(status: StatusCode, code: ErrorCode, message: &str) -> HttpResponse {
    json(
        status,
        &serde_json::json!({"error": {"code": code.as_u16(), "message": message}}),
    )
}
