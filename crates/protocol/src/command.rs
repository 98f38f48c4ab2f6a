//! Parsing client frames into commands.
//!
//! # Format
//! ```text
//! {"id": 1, "subscribe": {"channel": "news", "since": {"epoch": "x1", "offset": 7}}}
//! {}                      <- pong (answer to the server's ping)
//! ```
//! A frame may hold several messages separated by `\n`; [`parse_frame`] splits them.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::codes::ErrorCode;
use crate::types::StreamPosition;

/// One message from a client.
#[derive(Debug)]
pub enum Message {
    /// `{}`: the answer to a ping.
    Pong,
    /// A command with its id; the command itself may be invalid, in which case the error is replied.
    Command {
        /// The client's id for the command, echoed in the reply.
        id: u64,
        /// The parsed command, or the error to reply with.
        command: Result<Command, CommandError>,
    },
}

/// Why a message could not be understood at all. The connection is closed with 4500, because
/// there is no id to reply to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedFrame(pub String);

/// Why a well-framed command is rejected; replied as `{"id", "error": {code, message}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    /// The protocol error code.
    pub code: ErrorCode,
    /// A human-readable explanation.
    pub message: String,
}

impl CommandError {
    /// An error with a specific message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CommandError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (error {})", self.message, self.code.as_u16())
    }
}

impl std::error::Error for CommandError {}

/// What is wrong with a JSON text, fit to send to whoever sent it: where a malformed text breaks
/// (never the parser's own wording), or for well-formed JSON that does not fit, serde's
/// field-level reason (it names only the protocol's own fields and types).
pub fn json_error_reason(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => {
            let text = e.to_string();
            text.split(" at line ")
                .next()
                .unwrap_or("does not fit")
                .to_owned()
        }
        Category::Eof => "the JSON text ends too early".into(),
        Category::Syntax | Category::Io => {
            format!("malformed JSON at line {}, column {}", e.line(), e.column())
        }
    }
}

impl From<ErrorCode> for CommandError {
    fn from(code: ErrorCode) -> Self {
        CommandError::new(code, code.default_message())
    }
}

/// The protocol's methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `connect`
    Connect,
    /// `subscribe`
    Subscribe,
    /// `unsubscribe`
    Unsubscribe,
    /// `publish`
    Publish,
    /// `history`
    History,
    /// `presence`
    Presence,
    /// `presence_stats`
    PresenceStats,
    /// `refresh`
    Refresh,
    /// `sub_refresh`
    SubRefresh,
    /// `rpc`
    Rpc,
}

impl Method {
    /// The method's name on the wire, used as the reply's key.
    pub fn name(self) -> &'static str {
        match self {
            Method::Connect => "connect",
            Method::Subscribe => "subscribe",
            Method::Unsubscribe => "unsubscribe",
            Method::Publish => "publish",
            Method::History => "history",
            Method::Presence => "presence",
            Method::PresenceStats => "presence_stats",
            Method::Refresh => "refresh",
            Method::SubRefresh => "sub_refresh",
            Method::Rpc => "rpc",
        }
    }

    fn from_name(name: &str) -> Option<Method> {
        Some(match name {
            "connect" => Method::Connect,
            "subscribe" => Method::Subscribe,
            "unsubscribe" => Method::Unsubscribe,
            "publish" => Method::Publish,
            "history" => Method::History,
            "presence" => Method::Presence,
            "presence_stats" => Method::PresenceStats,
            "refresh" => Method::Refresh,
            "sub_refresh" => Method::SubRefresh,
            "rpc" => Method::Rpc,
            _ => return None,
        })
    }
}

/// A parsed command.
#[derive(Debug)]
pub enum Command {
    /// First command on a connection.
    Connect(ConnectParams),
    /// Subscribe to a channel, optionally recovering from a position.
    Subscribe(SubscribeParams),
    /// Leave a channel.
    Unsubscribe(ChannelParams),
    /// Publish from the client (where the namespace allows it).
    Publish(PublishParams),
    /// Read a channel's history.
    History(HistoryParams),
    /// Who is subscribed to a channel (all, or one page).
    Presence(PresenceParams),
    /// How many clients and users are subscribed to a channel.
    PresenceStats(ChannelParams),
    /// Replace the connection token before it expires.
    Refresh(RefreshParams),
    /// Extend a subscription granted by a subscription token.
    SubRefresh(SubRefreshParams),
    /// A call answered by the application's backend (the RPC proxy).
    Rpc(RpcParams),
}

impl Command {
    /// The command's method.
    pub fn method(&self) -> Method {
        match self {
            Command::Connect(_) => Method::Connect,
            Command::Subscribe(_) => Method::Subscribe,
            Command::Unsubscribe(_) => Method::Unsubscribe,
            Command::Publish(_) => Method::Publish,
            Command::History(_) => Method::History,
            Command::Presence(_) => Method::Presence,
            Command::PresenceStats(_) => Method::PresenceStats,
            Command::Refresh(_) => Method::Refresh,
            Command::SubRefresh(_) => Method::SubRefresh,
            Command::Rpc(_) => Method::Rpc,
        }
    }
}

/// `connect` params.
#[derive(Debug, Default, Deserialize)]
pub struct ConnectParams {
    /// Connection JWT.
    pub token: Option<String>,
    /// Client name (informational).
    pub name: Option<String>,
    /// Client version (informational).
    pub version: Option<String>,
    /// Channels to subscribe in the same round trip.
    #[serde(default)]
    pub subs: HashMap<String, SubOptions>,
    /// Any JSON value, forwarded to the connect proxy (ignored without one).
    pub data: Option<Box<RawValue>>,
}

/// Per-channel options inside `connect.subs`.
#[derive(Debug, Default, Deserialize)]
pub struct SubOptions {
    /// Recover from this position.
    pub since: Option<StreamPosition>,
    /// Subscription token for private channels.
    pub token: Option<String>,
}

/// `subscribe` params.
#[derive(Debug, Deserialize)]
pub struct SubscribeParams {
    /// The channel.
    pub channel: String,
    /// Subscription JWT for token-only namespaces.
    pub token: Option<String>,
    /// Recover everything after this position.
    pub since: Option<StreamPosition>,
    /// Any JSON value, forwarded to the subscribe proxy (ignored without one).
    pub data: Option<Box<RawValue>>,
    /// Delta compression for this subscription's live publications (the namespace must allow
    /// it): each is sent as a delta against the previous one the client holds.
    pub delta: Option<DeltaType>,
    /// A tag filter (the namespace must allow it): only publications whose tags match it are
    /// delivered (see [`crate::tags`]). Centrifugo's name; `tags_filter` is accepted too.
    #[serde(alias = "tags_filter")]
    pub tf: Option<Box<crate::tags::FilterSpec>>,
}

/// The delta encodings a subscription may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaType {
    /// Fossil's delta format (as Centrifugo uses): ASCII commands and the new bytes verbatim.
    Fossil,
}

/// Params that name only a channel.
#[derive(Debug, Deserialize)]
pub struct ChannelParams {
    /// The channel.
    pub channel: String,
}

/// `publish` params.
#[derive(Debug, Deserialize)]
pub struct PublishParams {
    /// The channel.
    pub channel: String,
    /// Any JSON value, kept as raw text.
    pub data: Box<RawValue>,
    /// The publication's tags, which subscribers' tag filters select on.
    #[serde(default)]
    pub tags: crate::tags::Tags,
}

/// `history` params.
#[derive(Debug, Deserialize)]
pub struct HistoryParams {
    /// The channel.
    pub channel: String,
    /// Only publications after this position.
    pub since: Option<StreamPosition>,
    /// At most this many publications (the newest when `since` is absent).
    pub limit: Option<usize>,
}

/// `presence` params. Without `limit` the reply lists every client; with it, one page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceParams {
    /// The channel.
    pub channel: String,
    /// At most this many clients, in client-id order.
    pub limit: Option<usize>,
    /// The previous page's `cursor`: this page starts after it. Only with `limit`.
    pub cursor: Option<String>,
}

/// `refresh` params.
#[derive(Debug, Deserialize)]
pub struct RefreshParams {
    /// The new connection token.
    pub token: String,
}

/// `sub_refresh` params.
#[derive(Debug, Deserialize)]
pub struct SubRefreshParams {
    /// The subscribed channel.
    pub channel: String,
    /// A new subscription token for it.
    pub token: String,
}

/// `rpc` params.
#[derive(Debug, Deserialize)]
pub struct RpcParams {
    /// The application's name for the call (may be empty).
    #[serde(default)]
    pub method: String,
    /// Any JSON value, forwarded as it is.
    pub data: Option<Box<RawValue>>,
}

/// Split a text frame on `\n` and parse each non-empty line.
pub fn parse_frame(text: &str) -> impl Iterator<Item = Result<Message, MalformedFrame>> + '_ {
    text.split('\n')
        .map(|line| line.trim_end_matches('\r'))
        .filter(|line| !line.trim().is_empty())
        .map(parse_message)
}

/// Parse one JSON message.
pub fn parse_message(text: &str) -> Result<Message, MalformedFrame> {
    let fields: HashMap<&str, &RawValue> = serde_json::from_str(text)
        .map_err(|e| MalformedFrame(format!("not a JSON object: {}", json_error_reason(&e))))?;
    if fields.is_empty() {
        return Ok(Message::Pong);
    }
    let id = match fields.get("id") {
        Some(raw) => serde_json::from_str::<u64>(raw.get())
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| MalformedFrame("\"id\" must be a positive integer".into()))?,
        None => return Err(MalformedFrame("command without \"id\"".into())),
    };
    let mut methods = fields.iter().filter(|(k, _)| **k != "id");
    let command = match (methods.next(), methods.next()) {
        (None, _) => Err(CommandError::new(
            ErrorCode::BadRequest,
            "command without a method",
        )),
        (Some(_), Some(_)) => Err(CommandError::new(
            ErrorCode::BadRequest,
            "a command must have exactly one method",
        )),
        (Some((name, params)), None) => parse_command(name, params),
    };
    Ok(Message::Command { id, command })
}

fn parse_command(name: &str, params: &RawValue) -> Result<Command, CommandError> {
    let method = Method::from_name(name).ok_or_else(|| {
        CommandError::new(ErrorCode::UnknownMethod, format!("unknown method {name:?}"))
    })?;
    fn params_of<'a, T: Deserialize<'a>>(m: Method, raw: &'a RawValue) -> Result<T, CommandError> {
        serde_json::from_str(raw.get()).map_err(|e| {
            CommandError::new(
                ErrorCode::BadRequest,
                format!("bad {} params: {}", m.name(), json_error_reason(&e)),
            )
        })
    }
    Ok(match method {
        Method::Connect => Command::Connect(params_of(method, params)?),
        Method::Subscribe => Command::Subscribe(params_of(method, params)?),
        Method::Unsubscribe => Command::Unsubscribe(params_of(method, params)?),
        Method::Publish => Command::Publish(params_of(method, params)?),
        Method::History => Command::History(params_of(method, params)?),
        Method::Presence => Command::Presence(params_of(method, params)?),
        Method::PresenceStats => Command::PresenceStats(params_of(method, params)?),
        Method::Refresh => Command::Refresh(params_of(method, params)?),
        Method::SubRefresh => Command::SubRefresh(params_of(method, params)?),
        Method::Rpc => Command::Rpc(params_of(method, params)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Message {
        parse_message(text).expect("well-framed")
    }

    #[test]
    fn empty_object_is_pong() {
        assert!(matches!(one("{}"), Message::Pong));
    }

    #[test]
    fn parses_subscribe_with_since() {
        let m = one(r#"{"id":3,"subscribe":{"channel":"news","since":{"epoch":"e","offset":7}}}"#);
        let Message::Command {
            id,
            command: Ok(Command::Subscribe(p)),
        } = m
        else {
            panic!("not a subscribe: {m:?}")
        };
        assert_eq!(id, 3);
        assert_eq!(p.channel, "news");
        assert_eq!(p.since.unwrap().offset, 7);
    }

    #[test]
    fn publish_keeps_data_raw() {
        let m = one(r#"{"id":1,"publish":{"channel":"c","data":{"b": [1, 2.50]}}}"#);
        let Message::Command {
            command: Ok(Command::Publish(p)),
            ..
        } = m
        else {
            panic!()
        };
        assert_eq!(p.data.get(), r#"{"b": [1, 2.50]}"#);
    }

    #[test]
    fn unknown_method_is_a_reply_error() {
        let Message::Command {
            id,
            command: Err(e),
        } = one(r#"{"id":9,"explode":{}}"#)
        else {
            panic!()
        };
        assert_eq!((id, e.code), (9, ErrorCode::UnknownMethod));
    }

    #[test]
    fn bad_params_are_bad_request() {
        let Message::Command {
            command: Err(e), ..
        } = one(r#"{"id":9,"subscribe":{"chan":1}}"#)
        else {
            panic!()
        };
        assert_eq!(e.code, ErrorCode::BadRequest);
    }

    #[test]
    fn two_methods_are_bad_request() {
        let Message::Command {
            command: Err(e), ..
        } = one(r#"{"id":9,"subscribe":{"channel":"a"},"publish":{"channel":"a","data":1}}"#)
        else {
            panic!()
        };
        assert_eq!(e.code, ErrorCode::BadRequest);
    }

    #[test]
    fn malformed_frames_are_rejected() {
        for bad in [
            "nope",
            "[1]",
            r#"{"id":0,"presence":{}}"#,
            r#"{"presence":{}}"#,
            r#"{"id":"1"}"#,
        ] {
            assert!(parse_message(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn presence_takes_a_page_and_refuses_unknown_fields() {
        let Message::Command {
            command: Ok(Command::Presence(p)),
            ..
        } = one(r#"{"id":1,"presence":{"channel":"a","limit":50,"cursor":"c7"}}"#)
        else {
            panic!()
        };
        assert_eq!((p.limit, p.cursor.as_deref()), (Some(50), Some("c7")));
        let Message::Command {
            command: Ok(Command::PresenceStats(p)),
            ..
        } = one(r#"{"id":2,"presence_stats":{"channel":"a"}}"#)
        else {
            panic!()
        };
        assert_eq!(p.channel, "a");
        let Message::Command {
            command: Err(e), ..
        } = one(r#"{"id":3,"presence":{"channel":"a","limt":5}}"#)
        else {
            panic!()
        };
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(e.message.contains("limt"), "{}", e.message);
    }

    #[test]
    fn splits_newline_batches() {
        let text = "{}\n{\"id\":1,\"presence\":{\"channel\":\"a\"}}\n\n";
        let all: Vec<_> = parse_frame(text).collect();
        assert_eq!(all.len(), 2);
        assert!(matches!(all[0], Ok(Message::Pong)));
    }
}
