//! Reply error codes (`error.code`) and WebSocket close codes, with their meaning and retry rule.

/// Error code carried in a reply's `error` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// 100: a bug or an unexpected condition on the server.
    Internal = 100,
    /// 101: missing or invalid credentials.
    Unauthorized = 101,
    /// 102: the channel's namespace is not configured.
    UnknownNamespace = 102,
    /// 103: the namespace does not allow this for this client.
    PermissionDenied = 103,
    /// 104: the method is not part of the protocol.
    UnknownMethod = 104,
    /// 105: the connection is already subscribed to the channel.
    AlreadySubscribed = 105,
    /// 106: a configured limit (channels per connection, …) would be exceeded.
    LimitExceeded = 106,
    /// 107: params are missing or malformed.
    BadRequest = 107,
    /// 108: the feature is not available here (e.g. the namespace keeps no history).
    NotAvailable = 108,
    /// 109: the token has expired.
    TokenExpired = 109,
    /// 110: the connection sends commands faster than allowed.
    TooManyRequests = 110,
    /// 111: temporarily unavailable (e.g. the broker is down); retry later.
    TemporarilyUnavailable = 111,
    /// 112: the application's backend (a proxy hook) did not answer in time or could not be
    /// reached; retry later.
    BackendUnavailable = 112,
}

impl ErrorCode {
    /// The numeric code on the wire.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// A short default message for the code.
    pub fn default_message(self) -> &'static str {
        match self {
            ErrorCode::Internal => "internal error",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::UnknownNamespace => "unknown namespace",
            ErrorCode::PermissionDenied => "permission denied",
            ErrorCode::UnknownMethod => "unknown method",
            ErrorCode::AlreadySubscribed => "already subscribed",
            ErrorCode::LimitExceeded => "limit exceeded",
            ErrorCode::BadRequest => "bad request",
            ErrorCode::NotAvailable => "not available",
            ErrorCode::TokenExpired => "token expired",
            ErrorCode::TooManyRequests => "too many requests",
            ErrorCode::TemporarilyUnavailable => "temporarily unavailable",
            ErrorCode::BackendUnavailable => "backend unavailable",
        }
    }

    /// The HTTP status the API answers with for this code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::Internal => 500,
            ErrorCode::Unauthorized | ErrorCode::TokenExpired => 401,
            ErrorCode::UnknownNamespace => 404,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::UnknownMethod => 404,
            ErrorCode::AlreadySubscribed => 409,
            ErrorCode::LimitExceeded => 413,
            ErrorCode::BadRequest => 400,
            ErrorCode::NotAvailable => 404,
            ErrorCode::TooManyRequests => 429,
            ErrorCode::TemporarilyUnavailable | ErrorCode::BackendUnavailable => 503,
        }
    }
}

/// WebSocket close code. 4000–4499: the client reconnects; 4500–4999: it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// 4000: server shutdown or drain.
    pub const SHUTDOWN: CloseCode = CloseCode(4000);
    /// 4001: slow consumer, its outbound queue overflowed.
    pub const SLOW_CONSUMER: CloseCode = CloseCode(4001);
    /// 4002: no pong in time.
    pub const NO_PONG: CloseCode = CloseCode(4002);
    /// 4003: the server cannot guarantee continuity; the client recovers.
    pub const INSUFFICIENT_STATE: CloseCode = CloseCode(4003);
    /// 4004: token expired; refresh and reconnect.
    pub const TOKEN_EXPIRED: CloseCode = CloseCode(4004);
    /// 4005: the application's backend (connect or refresh proxy) could not be reached, did
    /// not answer in time, or answered something unusable; reconnect later.
    pub const BACKEND_ERROR: CloseCode = CloseCode(4005);
    /// 4500: bad request or protocol violation.
    pub const BAD_REQUEST: CloseCode = CloseCode(4500);
    /// 4501: unauthorized (bad token).
    pub const UNAUTHORIZED: CloseCode = CloseCode(4501);
    /// 4502: disconnected by the server API.
    pub const DISCONNECTED_BY_API: CloseCode = CloseCode(4502);
    /// 4503: message too large.
    pub const MESSAGE_TOO_LARGE: CloseCode = CloseCode(4503);
    /// 4504: connection limit reached.
    pub const CONNECTION_LIMIT: CloseCode = CloseCode(4504);
    /// 4505: the application's backend refused the connection (connect proxy `error`) or its
    /// proxy answer was unusable.
    pub const REFUSED_BY_BACKEND: CloseCode = CloseCode(4505);

    /// Whether a client should reconnect after this code (4000–4499).
    pub fn reconnect(self) -> bool {
        (4000..4500).contains(&self.0)
    }
}

/// Error codes a proxy backend may answer with (`{"error": {"code"}}`); they reach the client
/// as they are. Other codes become [`ErrorCode::Internal`].
pub const APP_ERROR_CODES: std::ops::RangeInclusive<u16> = 1000..=1999;

/// `unsub` push code: the server ended the subscription for good (API unsubscribe).
pub const UNSUB_SERVER: u16 = 2000;
/// `unsub` push code: the node lost continuity on the channel; resubscribe with `since` to recover.
/// Codes 4000–4499 in an `unsub` mean "resubscribe", as they mean "reconnect" in a close.
pub const UNSUB_RESUBSCRIBE: u16 = 4003;
/// `unsub` push code: the subscription token expired without `sub_refresh`; subscribe again with
/// a new token (and `since` to recover).
pub const UNSUB_TOKEN_EXPIRED: u16 = 4004;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_rule_follows_ranges() {
        assert!(CloseCode::SHUTDOWN.reconnect());
        assert!(CloseCode::TOKEN_EXPIRED.reconnect());
        assert!(CloseCode(4499).reconnect());
        assert!(!CloseCode::BAD_REQUEST.reconnect());
        assert!(!CloseCode::CONNECTION_LIMIT.reconnect());
    }
}
