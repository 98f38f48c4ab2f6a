//! Publish and broadcast commands in the HTTP API's shape, run against the hub.
//!
//! `/api/publish` and `/api/broadcast` use this, and so do the consumers that take the same
//! commands from a PostgreSQL outbox or a Kafka topic. A broadcast publishes to its channels
//! concurrently (at most `limits.broadcast_concurrency` at once, so a Redis Cluster or several
//! NATS stream leaders work in parallel), in calls of several channels to the broker (one script
//! call on Redis), reports each channel's outcome, and carries one
//! idempotency key to every channel's publication: brokers remember keys per channel, so a
//! retry with the same key completes the channels that failed and publishes the others no
//! second time.
//!
//! Errors are [`PublishError`]s, which know nothing of HTTP: the API turns them into a status
//! and an error body (`impl From<PublishError> for ApiError`, api.rs), the consumers into a
//! retry or a dead letter ([`PublishError::is_retryable`]).

use bytes::Bytes;
use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use herald_broker::BrokerError;
use herald_broker::{PublishOptions, PublishTarget};
use herald_core::config::Limits;
use herald_core::namespace::NamespaceError;
use herald_core::session::{check_data_depth, NodeContext};
use herald_protocol::command::json_error_reason;
use herald_protocol::tags::Tags;
use herald_protocol::{CommandError, ErrorCode, StreamPosition};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Why a command was not run or a channel not published. Shown as `<message> (<code>)`, the
/// text consumers log and write into dead letters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The command, or the channel, is refused for good: malformed, over a limit, no such
    /// namespace. Running it again changes nothing.
    #[error("{message} ({})", .code.as_u16())]
    Refused {
        /// What is wrong.
        code: ErrorCode,
        /// For the caller.
        message: String,
    },
    /// The broker could not take it now: the same command with the same idempotency key may
    /// succeed later.
    #[error("{0} ({code})", code = ErrorCode::TemporarilyUnavailable.as_u16())]
    Unavailable(String),
    /// The broker failed otherwise (logged where it happened, its details kept from callers).
    #[error("internal error ({code})", code = ErrorCode::Internal.as_u16())]
    Internal,
}

impl PublishError {
    /// A refusal with `code`.
    pub fn refused(code: ErrorCode, message: impl Into<String>) -> Self {
        PublishError::Refused {
            code,
            message: message.into(),
        }
    }

    /// The protocol's error code for it.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            PublishError::Refused { code, .. } => *code,
            PublishError::Unavailable(_) => ErrorCode::TemporarilyUnavailable,
            PublishError::Internal => ErrorCode::Internal,
        }
    }

    /// The message for the caller, without the code.
    pub fn message(&self) -> &str {
        match self {
            PublishError::Refused { message, .. } | PublishError::Unavailable(message) => message,
            PublishError::Internal => "internal error",
        }
    }

    /// Whether running the command again (with the same key) can succeed: consumers retry
    /// these and dead-letter the others.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PublishError::Unavailable(_))
    }
}

impl From<BrokerError> for PublishError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::Unavailable { message, .. } => PublishError::Unavailable(message),
            BrokerError::Internal { message, .. } => {
                tracing::error!(cause = %message, "broker error publishing");
                PublishError::Internal
            }
        }
    }
}

impl From<CommandError> for PublishError {
    fn from(e: CommandError) -> Self {
        PublishError::refused(e.code, e.message)
    }
}

impl From<NamespaceError> for PublishError {
    fn from(e: NamespaceError) -> Self {
        PublishError::refused(e.code(), e.to_string())
    }
}

/// The longest idempotency key accepted.
const MAX_IDEMPOTENCY_KEY: usize = 128;

/// A publish or broadcast command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Publish `data` to one channel.
    Publish {
        /// The channel.
        channel: String,
        /// The publication's data (JSON text).
        data: Bytes,
        /// The caller's own idempotency key, if the payload carried one.
        idempotency_key: Option<String>,
        /// The publication's tags (checked against [`herald_protocol::tags`]'s bounds).
        tags: Tags,
        /// Deliver it live only, without storing it (on a channel with history).
        skip_history: bool,
    },
    /// Publish the same `data` to many channels.
    Broadcast {
        /// The channels, in the caller's order (results come back in it).
        channels: Vec<String>,
        /// The publication's data (JSON text).
        data: Bytes,
        /// The caller's own idempotency key, if the payload carried one.
        idempotency_key: Option<String>,
        /// Each publication's tags.
        tags: Tags,
        /// Deliver them live only, without storing them (on channels with history).
        skip_history: bool,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    channel: String,
    #[serde(default, deserialize_with = "present")]
    data: Option<Box<RawValue>>,
    b64data: Option<String>,
    idempotency_key: Option<String>,
    #[serde(default)]
    tags: Tags,
    #[serde(default)]
    skip_history: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BroadcastBody {
    channels: Vec<String>,
    #[serde(default, deserialize_with = "present")]
    data: Option<Box<RawValue>>,
    b64data: Option<String>,
    idempotency_key: Option<String>,
    #[serde(default)]
    tags: Tags,
    #[serde(default)]
    skip_history: bool,
}

/// Tags within [`herald_protocol::tags`]'s bounds, or error 107 saying which one they pass.
pub fn check_tags(tags: &Tags) -> Result<(), PublishError> {
    herald_protocol::tags::check_tags(tags)
        .map_err(|why| PublishError::refused(ErrorCode::BadRequest, why))
}

/// A field that is there, `null` included (`"data": null` is data; only an absent one is not).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// The publication's data from `data` or `b64data` (exactly one of them): `data` as its JSON
/// text; `b64data` (standard base64, as Centrifugo's API takes it) decoded, which must be one
/// JSON value: Herald publications are JSON, and reach subscribers as the decoded JSON.
pub fn data_or_b64(data: Option<&RawValue>, b64data: Option<&str>) -> Result<Bytes, PublishError> {
    use base64::Engine;
    let bad = |m: String| PublishError::refused(ErrorCode::BadRequest, m);
    let text = match (data, b64data) {
        (Some(_), Some(_)) => return Err(bad("give \"data\" or \"b64data\", not both".into())),
        (None, None) => {
            return Err(bad(
                "bad JSON body: missing field \"data\" (or \"b64data\")".into(),
            ))
        }
        (Some(raw), None) => raw.get().as_bytes().to_vec(),
        (None, Some(b64)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| bad(format!("b64data is not base64: {e}")))?;
            let value: Box<RawValue> =
                serde_json::from_slice(&bytes).map_err(|_| {
                    bad("b64data must decode to JSON text: Herald publications are JSON, not binary"
                    .into())
                })?;
            value.get().trim().as_bytes().to_vec()
        }
    };
    check_data_depth(std::str::from_utf8(&text).unwrap_or_default())?;
    Ok(Bytes::from(text))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    method: String,
    #[serde(borrow)]
    payload: &'a RawValue,
}

impl Command {
    /// A command from its method (`publish` or `broadcast`) and its payload, the HTTP API's
    /// request body for that method.
    pub fn parse(method: &str, payload: &[u8]) -> Result<Command, PublishError> {
        match method {
            "publish" => {
                let b: PublishBody = from_json(payload)?;
                let data = data_or_b64(b.data.as_deref(), b.b64data.as_deref())?;
                check(b.idempotency_key.as_deref())?;
                check_tags(&b.tags)?;
                Ok(Command::Publish {
                    channel: b.channel,
                    data,
                    idempotency_key: b.idempotency_key,
                    tags: b.tags,
                    skip_history: b.skip_history,
                })
            }
            "broadcast" => {
                let b: BroadcastBody = from_json(payload)?;
                let data = data_or_b64(b.data.as_deref(), b.b64data.as_deref())?;
                check(b.idempotency_key.as_deref())?;
                check_tags(&b.tags)?;
                Ok(Command::Broadcast {
                    channels: b.channels,
                    data,
                    idempotency_key: b.idempotency_key,
                    tags: b.tags,
                    skip_history: b.skip_history,
                })
            }
            other => Err(PublishError::refused(
                ErrorCode::UnknownMethod,
                format!("unknown method {other:?} (publish or broadcast)"),
            )),
        }
    }

    /// A command from `{"method": "publish" | "broadcast", "payload": {…}}`, the shape a Kafka
    /// record's value has; a payload over [`max_body_bytes`] is refused (error 106).
    pub fn parse_envelope(value: &[u8], limits: &Limits) -> Result<Command, PublishError> {
        let e: Envelope<'_> = from_json(value)?;
        let payload = e.payload.get().as_bytes();
        check_body_size(limits, &e.method, payload.len())?;
        Command::parse(&e.method, payload)
    }

    /// The command's channels.
    pub fn channels(&self) -> &[String] {
        match self {
            Command::Publish { channel, .. } => std::slice::from_ref(channel),
            Command::Broadcast { channels, .. } => channels,
        }
    }

    fn data(&self) -> &Bytes {
        match self {
            Command::Publish { data, .. } | Command::Broadcast { data, .. } => data,
        }
    }

    fn tags(&self) -> &Tags {
        match self {
            Command::Publish { tags, .. } | Command::Broadcast { tags, .. } => tags,
        }
    }

    fn skips_history(&self) -> bool {
        match self {
            Command::Publish { skip_history, .. } | Command::Broadcast { skip_history, .. } => {
                *skip_history
            }
        }
    }

    fn own_key(&self) -> Option<&str> {
        match self {
            Command::Publish {
                idempotency_key, ..
            }
            | Command::Broadcast {
                idempotency_key, ..
            } => idempotency_key.as_deref(),
        }
    }
}

fn from_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, PublishError> {
    serde_json::from_slice(bytes).map_err(|e| {
        PublishError::refused(
            ErrorCode::BadRequest,
            format!("bad JSON body: {}", json_error_reason(&e)),
        )
    })
}

fn check(key: Option<&str>) -> Result<(), PublishError> {
    if let Some(key) = key {
        check_idempotency_key(key)?;
    }
    Ok(())
}

/// The largest payload of a command of `method`, with its config key: the HTTP API's request
/// body limit for that method.
fn body_limit(limits: &Limits, method: &str) -> (usize, &'static str) {
    match method {
        // A batch may carry broadcasts.
        "broadcast" | "batch" => (limits.max_broadcast_body_bytes, "max_broadcast_body_bytes"),
        _ => (limits.max_api_body_bytes, "max_api_body_bytes"),
    }
}

/// The most bytes a command of `method` may carry as its payload: `/api/broadcast`'s body limit
/// (`limits.max_broadcast_body_bytes`) for a broadcast, `limits.max_api_body_bytes` otherwise.
/// The API reads bodies up to it, and the consumers hold their rows and records to it.
pub fn max_body_bytes(limits: &Limits, method: &str) -> usize {
    body_limit(limits, method).0
}

/// A payload of `len` bytes for `method` within [`max_body_bytes`], or error 106 naming the
/// limit (what the API answers with 413).
pub fn check_body_size(limits: &Limits, method: &str, len: usize) -> Result<(), PublishError> {
    let (max, key) = body_limit(limits, method);
    if len > max {
        return Err(PublishError::refused(
            ErrorCode::LimitExceeded,
            format!("payload of {len} bytes is over limits.{key} ({max} bytes)"),
        ));
    }
    Ok(())
}

/// Idempotency keys travel as broker headers and key names: 1 to 128 printable ASCII characters
/// without spaces (error 107 otherwise).
pub fn check_idempotency_key(key: &str) -> Result<(), PublishError> {
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(PublishError::refused(
            ErrorCode::BadRequest,
            format!("idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters without spaces"),
        ));
    }
    Ok(())
}

/// What running a command did, channel by channel.
#[derive(Default)]
pub struct Executed {
    /// Each channel's outcome, in the command's order: its publication's position (the earlier
    /// one where the idempotency key was seen before) or the error.
    pub results: Vec<Result<StreamPosition, PublishError>>,
}

impl Executed {
    /// Channels published (or found published before under the same key).
    pub fn published(&self) -> usize {
        self.results.iter().filter(|r| r.is_ok()).count()
    }

    /// The channels that failed, with their errors.
    pub fn failed<'a>(
        &'a self,
        cmd: &'a Command,
    ) -> impl Iterator<Item = (&'a str, &'a PublishError)> + 'a {
        cmd.channels()
            .iter()
            .zip(&self.results)
            .filter_map(|(c, r)| r.as_ref().err().map(|e| (c.as_str(), e)))
    }

    /// Some channel failed with an error a retry can cure (the broker was unavailable): run
    /// the command again with the same idempotency key.
    pub fn retryable(&self) -> bool {
        self.results
            .iter()
            .any(|r| r.as_ref().is_err_and(PublishError::is_retryable))
    }
}

/// Run `cmd`. Each publication carries the command's own idempotency key, or else `key` (a
/// consumer's row or record id). A broadcast over `limits.max_broadcast_channels` is refused
/// whole (error 106); otherwise each channel succeeds or fails on its own.
pub async fn execute(
    ctx: &NodeContext,
    cmd: &Command,
    key: Option<&str>,
) -> Result<Executed, PublishError> {
    execute_traced(ctx, cmd, key, None).await
}

/// [`execute`], each publication carrying `traceparent` (the W3C trace context of the span
/// around it, `crate::otel`) through the broker to the nodes that fan it out.
pub async fn execute_traced(
    ctx: &NodeContext,
    cmd: &Command,
    key: Option<&str>,
    traceparent: Option<&str>,
) -> Result<Executed, PublishError> {
    let limits = &ctx.config.limits;
    let max = limits.max_broadcast_channels;
    if cmd.channels().len() > max {
        return Err(PublishError::refused(
            ErrorCode::LimitExceeded,
            format!("at most {max} channels per broadcast"),
        ));
    }
    if let Some(key) = key {
        check_idempotency_key(key)?;
    }
    let key = cmd.own_key().or(key);
    let data = cmd.data();
    let published = Published {
        key,
        traceparent,
        tags: cmd.tags(),
        skip_history: cmd.skips_history(),
    };
    let results = match cmd {
        Command::Publish { channel, .. } => {
            vec![publish_one(ctx, channel, data.clone(), &published).await]
        }
        Command::Broadcast { channels, .. } => {
            let publish_all = broadcast(
                ctx,
                channels,
                data,
                &published,
                limits.broadcast_concurrency,
            );
            ctx.hub.gathering_direct_writes(publish_all).await
        }
    };
    Ok(Executed { results })
}

/// At most this many channels per [`Hub::publish_many`](herald_core::hub::Hub::publish_many)
/// call: a broker that stores several in one round trip (Redis) takes them in one script call.
const CHANNELS_PER_CALL: usize = 64;

/// Publish to each channel, up to `concurrency` publications in flight (in calls of up to
/// [`CHANNELS_PER_CALL`] channels), results in the channels' order. A channel of no configured
/// namespace fails alone.
// A hand-kept `FuturesOrdered` rather than `stream::iter(..).map(..).buffered(..)`: the closure
// in the latter makes the server's connection future fail the `Send` check (a known
// higher-ranked lifetime limit of the compiler).
async fn broadcast(
    ctx: &NodeContext,
    channels: &[String],
    data: &Bytes,
    published: &Published<'_>,
    concurrency: usize,
) -> Vec<Result<StreamPosition, PublishError>> {
    let mut results: Vec<Option<Result<StreamPosition, PublishError>>> =
        channels.iter().map(|_| None).collect();
    let mut targets = Vec::with_capacity(channels.len());
    let mut places = Vec::with_capacity(channels.len());
    for (i, channel) in channels.iter().enumerate() {
        match publish_options(ctx, channel, published) {
            Ok(opts) => {
                let channel = channel.clone();
                targets.push(PublishTarget { channel, opts });
                places.push(i);
            }
            Err(e) => results[i] = Some(Err(e)),
        }
    }
    let per_call = CHANNELS_PER_CALL.min(concurrency.max(1));
    let calls_at_once = (concurrency / per_call).max(1);
    let mut chunks = targets.chunks(per_call).zip(places.chunks(per_call));
    let mut in_flight = FuturesOrdered::new();
    loop {
        while in_flight.len() < calls_at_once {
            let Some((chunk, at)) = chunks.next() else {
                break;
            };
            let call = ctx.hub.publish_many(chunk, data.clone(), None);
            in_flight.push_back(async move { (at, call.await) });
        }
        let Some((at, positions)) = in_flight.next().await else {
            break;
        };
        for (&i, position) in at.iter().zip(positions) {
            results[i] = Some(position.map_err(PublishError::from));
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every channel has an outcome"))
        .collect()
}

/// What every publication of one command carries besides its data.
struct Published<'a> {
    /// The idempotency key.
    key: Option<&'a str>,
    /// The trace context.
    traceparent: Option<&'a str>,
    /// The tags.
    tags: &'a Tags,
    /// Live only, not stored.
    skip_history: bool,
}

/// A channel's publish options: its namespace's stream options, the idempotency key, the
/// trace context and the tags.
fn publish_options(
    ctx: &NodeContext,
    channel: &str,
    published: &Published<'_>,
) -> Result<PublishOptions, PublishError> {
    let ns = ctx.namespaces.resolve(channel)?;
    Ok(PublishOptions {
        stream: ns.stream_options(),
        idempotency_key: published.key.map(str::to_owned),
        traceparent: published.traceparent.map(str::to_owned),
        tags: published.tags.clone(),
        // Where nothing is kept it changes nothing: the publication is published as always.
        skip_history: published.skip_history && ns.history_size > 0,
    })
}

/// Publish to one channel of a configured namespace.
async fn publish_one(
    ctx: &NodeContext,
    channel: &str,
    data: Bytes,
    published: &Published<'_>,
) -> Result<StreamPosition, PublishError> {
    let opts = publish_options(ctx, channel, published)?;
    Ok(ctx.hub.publish(channel, data, None, &opts).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_publish_and_broadcast_payloads() {
        let c = Command::parse("publish", br#"{"channel":"a","data":{"x":1}}"#).unwrap();
        assert_eq!(c.channels(), ["a"]);
        assert_eq!(c.data().as_ref(), br#"{"x":1}"#);
        let c = Command::parse(
            "broadcast",
            br#"{"channels":["a","b"],"data":1,"idempotency_key":"k"}"#,
        )
        .unwrap();
        assert_eq!(c.channels(), ["a", "b"]);
        assert_eq!(c.own_key(), Some("k"));
        let c = Command::parse("publish", br#"{"channel":"a","data":null}"#).unwrap();
        assert_eq!(c.data().as_ref(), b"null");
    }

    #[test]
    fn b64data_is_decoded_json_or_refused() {
        // eyJ4IjoxfQ== is {"x":1}.
        let c = Command::parse("publish", br#"{"channel":"a","b64data":"eyJ4IjoxfQ=="}"#).unwrap();
        assert_eq!(c.data().as_ref(), br#"{"x":1}"#);
        let message = |body: &str| match Command::parse("broadcast", body.as_bytes()) {
            Err(e) => e.message().to_owned(),
            Ok(c) => panic!("{body} parsed: {c:?}"),
        };
        assert!(message(r#"{"channels":["a"],"b64data":"AAEC"}"#).contains("must decode to JSON"));
        assert!(message(r#"{"channels":["a"],"b64data":"%%"}"#).contains("not base64"));
        assert!(message(r#"{"channels":["a"],"data":1,"b64data":"MQ=="}"#).contains("not both"));
        assert!(message(r#"{"channels":["a"]}"#).contains("missing field \"data\""));
    }

    #[test]
    fn errors_say_whether_a_retry_helps_and_show_their_code() {
        let down = PublishError::from(BrokerError::unavailable("redis is down"));
        assert!(down.is_retryable());
        assert_eq!(down.error_code(), ErrorCode::TemporarilyUnavailable);
        assert_eq!(
            down.to_string(),
            format!(
                "redis is down ({})",
                ErrorCode::TemporarilyUnavailable.as_u16()
            )
        );
        let internal = PublishError::from(BrokerError::internal("secret detail"));
        assert!(!internal.is_retryable());
        assert!(!internal.to_string().contains("secret"), "{internal}");
        let big = PublishError::refused(ErrorCode::LimitExceeded, "too big");
        assert!(!big.is_retryable());
        assert_eq!(big.message(), "too big");
        assert_eq!(big.to_string(), "too big (106)");
    }

    #[test]
    fn parses_an_envelope() {
        let env = br#"{"method":"publish","payload":{"channel":"a","data":2}}"#;
        let c = Command::parse_envelope(env, &Limits::default()).unwrap();
        assert_eq!(c.channels(), ["a"]);
    }

    #[test]
    fn payloads_are_held_to_the_api_body_limit_of_their_method() {
        let limits = Limits {
            max_api_body_bytes: 40,
            max_broadcast_body_bytes: 60,
            ..Limits::default()
        };
        assert_eq!(max_body_bytes(&limits, "publish"), 40);
        assert_eq!(max_body_bytes(&limits, "broadcast"), 60);
        let publish =
            br#"{"method":"publish","payload":{"channel":"a","data":"0123456789012345"}}"#;
        let err = Command::parse_envelope(publish, &limits).unwrap_err();
        assert_eq!(err.error_code(), ErrorCode::LimitExceeded);
        assert!(err.message().contains("max_api_body_bytes"), "{err:?}");
        let broadcast =
            br#"{"method":"broadcast","payload":{"channels":["a"],"data":"0123456789012345"}}"#;
        assert!(Command::parse_envelope(broadcast, &limits).is_ok());
    }

    #[test]
    fn refuses_what_is_not_a_command() {
        let code = |r: Result<Command, PublishError>| r.unwrap_err().error_code();
        assert_eq!(
            code(Command::parse("delete", b"{}")),
            ErrorCode::UnknownMethod
        );
        assert_eq!(code(Command::parse("publish", b"{")), ErrorCode::BadRequest);
        assert_eq!(
            code(Command::parse("publish", br#"{"channel":"a"}"#)),
            ErrorCode::BadRequest
        );
        assert_eq!(
            code(Command::parse(
                "publish",
                br#"{"channel":"a","data":1,"idempotency_key":"a b"}"#
            )),
            ErrorCode::BadRequest
        );
        assert_eq!(
            code(Command::parse_envelope(
                br#"{"method":"publish"}"#,
                &Limits::default()
            )),
            ErrorCode::BadRequest
        );
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let body = format!(r#"{{"channel":"a","data":{deep}}}"#);
        assert_eq!(
            code(Command::parse("publish", body.as_bytes())),
            ErrorCode::BadRequest
        );
    }
}
