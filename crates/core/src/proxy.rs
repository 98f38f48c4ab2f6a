//! Proxy hooks: the application's backend decides connects, subscriptions and publications, and
//! answers `rpc`, over HTTP with JSON bodies (docs/proxy.md).
//!
//! The core builds the request bodies and reads the answers; moving the bytes is the server's
//! job behind the [`Proxy`] trait (the core knows no HTTP), the same way [`crate::auth::KeySet`]
//! fetches keys.

use std::collections::BTreeMap;
use std::net::IpAddr;

use herald_protocol::codes::APP_ERROR_CODES;
use herald_protocol::{CloseCode, CommandError, ErrorCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::metrics::Metrics;

/// Which hook a call is for; the server maps each to its configured URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `proxy.connect_url`
    Connect,
    /// `proxy.refresh_url`
    Refresh,
    /// `proxy.subscribe_url`
    Subscribe,
    /// `proxy.sub_refresh_url`
    SubRefresh,
    /// `proxy.publish_url`
    Publish,
    /// `proxy.rpc_url`
    Rpc,
}

impl Hook {
    /// The hook's name in logs.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Connect => "connect",
            Hook::Refresh => "refresh",
            Hook::Subscribe => "subscribe",
            Hook::SubRefresh => "sub_refresh",
            Hook::Publish => "publish",
            Hook::Rpc => "rpc",
        }
    }
}

/// Why a backend call gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// Connection refused, reset, or no answer within `proxy.timeout_ms`: retryable.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// A status other than 200, an answer over `proxy.max_response_bytes`, or a body that is not
    /// a proxy answer: a bug on one side, logged.
    #[error("bad backend answer: {0}")]
    BadAnswer(String),
}

/// Where one call goes, and what travels with it outside the body.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The hook.
    pub hook: Hook,
    /// The namespace of the call's channel ("" for connection-wide hooks and the default
    /// namespace): a namespace may have its own URL and timeout (`[[proxy.namespaces]]`).
    pub namespace: &'a str,
    /// The client's allow-listed headers (names in lower case), also sent as HTTP headers with
    /// `proxy.http_headers`.
    pub headers: &'a BTreeMap<String, String>,
}

/// Sends a hook's JSON body to the backend and returns the answer's body (status 200 only).
#[async_trait::async_trait]
pub trait Proxy: Send + Sync {
    /// POST `body` to the URL of the target's hook.
    async fn call(&self, target: &Target<'_>, body: Vec<u8>) -> Result<Vec<u8>, ProxyError>;
}

/// What the server knows about the client's HTTP request, sent with every hook. Only the headers
/// and cookies allow-listed in `proxy.headers` and `proxy.cookies` are kept.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientMeta {
    /// `websocket`, `sse` or `stream`.
    pub transport: &'static str,
    /// The peer address of the TCP connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
    /// Allow-listed headers, names in lower case.
    pub headers: BTreeMap<String, String>,
    /// Allow-listed cookies.
    pub cookies: BTreeMap<String, String>,
}

/// Body of the connect hook.
#[derive(Serialize)]
pub(crate) struct ConnectRequest<'a> {
    pub(crate) client: &'a str,
    #[serde(flatten)]
    pub(crate) meta: &'a ClientMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<&'a RawValue>,
}

/// Body of the refresh, subscribe, publish and rpc hooks: who asks, and what about.
#[derive(Serialize)]
pub(crate) struct ConnectedRequest<'a> {
    pub(crate) client: &'a str,
    pub(crate) user: &'a str,
    #[serde(flatten)]
    pub(crate) meta: &'a ClientMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) channel: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<&'a RawValue>,
    /// The connect hook's `meta` for this connection, sent back with every later call.
    #[serde(rename = "meta", skip_serializing_if = "Option::is_none")]
    pub(crate) conn_meta: Option<&'a RawValue>,
}

/// The largest connect hook `meta` a connection keeps, in bytes of JSON: it travels with every
/// later hook call of the connection.
pub const MAX_META_BYTES: usize = 4096;

/// `result` of the connect hook.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectResult {
    /// The user id ("" anonymous).
    #[serde(default)]
    pub(crate) user: String,
    /// Shown in presence and publications.
    pub(crate) info: Option<Box<RawValue>>,
    /// Unix seconds when the connection expires (then the refresh hook, or close 4004).
    pub(crate) expire_at: Option<u64>,
    /// Returned to the client in the `connect` reply.
    pub(crate) data: Option<Box<RawValue>>,
    /// Channels the server subscribes.
    #[serde(default)]
    pub(crate) channels: Vec<String>,
    /// More channels the server subscribes, each with its options.
    #[serde(default)]
    pub(crate) subs: BTreeMap<String, SubOptions>,
    /// Kept on the connection (never shown to clients) and sent with its later hook calls.
    pub(crate) meta: Option<Box<RawValue>>,
}

impl ConnectResult {
    /// Refuse a `meta` that is not a JSON object or over [`MAX_META_BYTES`].
    pub(crate) fn check_meta(&self) -> Result<(), ProxyError> {
        let Some(meta) = &self.meta else {
            return Ok(());
        };
        if !meta.get().starts_with('{') {
            return Err(ProxyError::BadAnswer("meta must be a JSON object".into()));
        }
        if meta.get().len() > MAX_META_BYTES {
            return Err(ProxyError::BadAnswer(format!(
                "meta over {MAX_META_BYTES} bytes"
            )));
        }
        Ok(())
    }
}

/// What a subscription may do beyond receiving, as a hook lists it (`allow`). Centrifugo's
/// short names are accepted too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Permission {
    #[serde(alias = "pub")]
    Publish,
    #[serde(alias = "hst")]
    History,
    #[serde(alias = "prs")]
    Presence,
}

/// `{"value": bool}`: one overridden option (Centrifugo's shape).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BoolValue {
    pub(crate) value: bool,
}

/// `override`: the namespace's options this subscription changes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubOverride {
    /// This client is (or is not) in the channel's presence.
    pub(crate) presence: Option<BoolValue>,
    /// `join`/`leave` pushes about this client (needs presence).
    pub(crate) join_leave: Option<BoolValue>,
    /// false: a `since` is not honoured (no recovery); true: recover (the namespace must keep
    /// history). Centrifugo's `force_recovery` is the same option.
    #[serde(alias = "force_recovery")]
    pub(crate) recovery: Option<BoolValue>,
}

/// Per-subscription options from a hook: data for the client, overridden options, rights.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubOptions {
    /// Returned in the subscription's reply (or its `connect.subs` entry).
    pub(crate) data: Option<Box<RawValue>>,
    #[serde(rename = "override")]
    pub(crate) overrides: Option<SubOverride>,
    /// With a list, exactly these rights (see [`crate::permission::Grants`]).
    pub(crate) allow: Option<Vec<Permission>>,
}

impl SubOptions {
    /// The rights listed, if any.
    pub(crate) fn grants(&self) -> Option<crate::permission::Grants> {
        let allow = self.allow.as_ref()?;
        Some(crate::permission::Grants {
            publish: allow.contains(&Permission::Publish),
            history: allow.contains(&Permission::History),
            presence: allow.contains(&Permission::Presence),
        })
    }

    /// The namespace options this subscription runs with, and whether it recovers. An override
    /// the namespace cannot honour is a bad answer, not a silent downgrade.
    pub(crate) fn apply(
        &self,
        ns: &crate::config::NamespaceConfig,
    ) -> Result<(crate::config::NamespaceConfig, bool), ProxyError> {
        let mut ns = ns.clone();
        let mut recovers = true;
        let Some(o) = &self.overrides else {
            return Ok((ns, recovers));
        };
        if let Some(v) = o.presence {
            ns.presence = v.value;
            if !v.value {
                ns.join_leave = false;
            }
        }
        if let Some(v) = o.join_leave {
            if v.value && !ns.presence {
                return Err(ProxyError::BadAnswer(
                    "override join_leave needs presence on the subscription".into(),
                ));
            }
            ns.join_leave = v.value;
        }
        if let Some(v) = o.recovery {
            if v.value && ns.history_size == 0 {
                return Err(ProxyError::BadAnswer(
                    "override recovery needs a namespace that keeps history".into(),
                ));
            }
            recovers = v.value;
        }
        Ok((ns, recovers))
    }
}

/// `result` of the refresh and sub_refresh hooks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefreshResult {
    /// The connection ends (close 4004).
    #[serde(default)]
    pub(crate) expired: bool,
    /// The new expiry, unix seconds; absent: never.
    pub(crate) expire_at: Option<u64>,
    /// Replaces the connection's info.
    pub(crate) info: Option<Box<RawValue>>,
}

/// `result` of the subscribe hook.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubscribeResult {
    /// Returned in the reply.
    pub(crate) data: Option<Box<RawValue>>,
    /// Unix seconds when the subscription ends (then the sub_refresh hook, or `unsub` 4004).
    pub(crate) expire_at: Option<u64>,
    /// The namespace's options this subscription changes.
    #[serde(rename = "override")]
    pub(crate) overrides: Option<SubOverride>,
    /// With a list, exactly these rights on the channel.
    pub(crate) allow: Option<Vec<Permission>>,
}

impl SubscribeResult {
    /// The per-subscription options (the expiry aside).
    pub(crate) fn options(self) -> SubOptions {
        SubOptions {
            data: self.data,
            overrides: self.overrides,
            allow: self.allow,
        }
    }
}

/// `result` of the publish and rpc hooks.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DataResult {
    /// Subscribe: returned in the reply; publish: replaces the publication's data; rpc: the
    /// reply.
    pub(crate) data: Option<Box<RawValue>>,
}

/// A backend's answer: exactly one of `result`, `error`, `disconnect`.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// Allowed, with what the hook returns.
    Result(T),
    /// Refused: the client gets this error reply.
    Error(Refusal),
}

/// A refusal for the client: an error reply, or the connection closes.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A protocol error reply.
    Command(CommandError),
    /// An error reply with the backend's own code (in [`APP_ERROR_CODES`]).
    App { code: u16, message: String },
    /// The connection closes with this code and reason.
    Close { code: CloseCode, reason: String },
}

impl From<CommandError> for Refusal {
    fn from(e: CommandError) -> Self {
        Refusal::Command(e)
    }
}

impl From<ErrorCode> for Refusal {
    fn from(code: ErrorCode) -> Self {
        Refusal::Command(code.into())
    }
}

#[derive(Deserialize)]
struct Envelope<T> {
    result: Option<T>,
    error: Option<ErrorAnswer>,
    disconnect: Option<DisconnectAnswer>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    code: u16,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct DisconnectAnswer {
    code: u16,
    #[serde(default)]
    reason: String,
}

/// Read a backend's answer. Codes outside the documented ranges make the answer unusable rather
/// than reaching the client as something the protocol gives another meaning.
pub(crate) fn parse_answer<T: DeserializeOwned>(body: &[u8]) -> Result<Answer<T>, ProxyError> {
    let envelope: Envelope<T> = serde_json::from_slice(body)
        .map_err(|e| ProxyError::BadAnswer(format!("not a proxy answer: {e}")))?;
    match (envelope.result, envelope.error, envelope.disconnect) {
        (Some(r), None, None) => Ok(Answer::Result(r)),
        (None, Some(e), None) if APP_ERROR_CODES.contains(&e.code) => {
            Ok(Answer::Error(Refusal::App {
                code: e.code,
                message: e.message,
            }))
        }
        (None, Some(e), None) => Err(ProxyError::BadAnswer(format!(
            "error code {} outside {}..={}",
            e.code,
            APP_ERROR_CODES.start(),
            APP_ERROR_CODES.end()
        ))),
        (None, None, Some(d)) if (4000..=4999).contains(&d.code) => {
            Ok(Answer::Error(Refusal::Close {
                code: CloseCode(d.code),
                reason: d.reason,
            }))
        }
        (None, None, Some(d)) => Err(ProxyError::BadAnswer(format!(
            "disconnect code {} outside 4000..=4999",
            d.code
        ))),
        _ => Err(ProxyError::BadAnswer(
            "expected exactly one of result, error, disconnect".into(),
        )),
    }
}

/// Why a call failed, for the log limiter: each hook's unavailable backend and bad answers are
/// separate causes, so that a flood of one never hides the first line of another.
fn cause(hook: Hook, e: &ProxyError) -> usize {
    let kind = match e {
        ProxyError::Unavailable(_) => 0,
        ProxyError::BadAnswer(_) => 1,
    };
    hook as usize * 2 + kind
}

/// Causes the limiter tells apart: every [`Hook`] times the two kinds of [`ProxyError`].
const CAUSES: usize = 12;

/// At most one warn/error line a second per cause, so that a backend outage failing thousands of
/// connects does not flood the log; the lines left out go to debug level and are counted, and the
/// next line of the same cause says how many there were (the metrics count every failure).
struct LogLimiter {
    /// Per cause: the unix second of its last loud line (`u64::MAX`: none yet).
    last: [std::sync::atomic::AtomicU64; CAUSES],
    /// Per cause: the lines left out since its last loud one.
    suppressed: [std::sync::atomic::AtomicU64; CAUSES],
}

impl LogLimiter {
    const fn new() -> Self {
        use std::sync::atomic::AtomicU64;
        #[allow(clippy::declare_interior_mutable_const)] // only to initialize the arrays
        const NONE: AtomicU64 = AtomicU64::new(u64::MAX);
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        LogLimiter {
            last: [NONE; CAUSES],
            suppressed: [ZERO; CAUSES],
        }
    }

    /// Whether a line of `cause` may be loud at unix second `now`: `Some(lines left out since
    /// the last loud one)`, or `None` (and this one is counted as left out).
    fn loud(&self, cause: usize, now: u64) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let last = self.last[cause].load(Ordering::Relaxed);
        if last != now
            && self.last[cause]
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed[cause].swap(0, Ordering::Relaxed));
        }
        self.suppressed[cause].fetch_add(1, Ordering::Relaxed);
        None
    }
}

static LIMITER: LogLimiter = LogLimiter::new();

/// What a failed call becomes for the client: unavailable is retryable (112); anything else is
/// an internal error whose cause only the log sees.
pub(crate) fn failure(hook: Hook, e: ProxyError) -> Refusal {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let loud = LIMITER.loud(cause(hook, &e), now);
    match e {
        ProxyError::Unavailable(cause) => {
            match loud {
                Some(suppressed) => {
                    tracing::warn!(hook = hook.name(), %cause, suppressed, "proxy call failed")
                }
                None => tracing::debug!(hook = hook.name(), %cause, "proxy call failed"),
            }
            ErrorCode::BackendUnavailable.into()
        }
        ProxyError::BadAnswer(cause) => {
            match loud {
                Some(suppressed) => {
                    tracing::error!(hook = hook.name(), %cause, suppressed, "proxy answer refused")
                }
                None => tracing::debug!(hook = hook.name(), %cause, "proxy answer refused"),
            }
            ErrorCode::Internal.into()
        }
    }
}

/// Call `hook` with `body` and read its answer, counted in `metrics`.
pub(crate) async fn ask<T: DeserializeOwned>(
    proxy: &dyn Proxy,
    target: &Target<'_>,
    body: &impl Serialize,
    metrics: &Metrics,
) -> Result<Answer<T>, ProxyError> {
    let bytes = serde_json::to_vec(body).expect("proxy requests serialize");
    let started = std::time::Instant::now();
    metrics.proxy_calls.inc();
    let answer = proxy
        .call(target, bytes)
        .await
        .and_then(|a| parse_answer(&a));
    metrics
        .proxy_seconds
        .observe(started.elapsed().as_secs_f64());
    match &answer {
        Err(ProxyError::Unavailable(_)) => {
            metrics.proxy_unavailable.inc();
        }
        Err(ProxyError::BadAnswer(_)) => {
            metrics.proxy_bad_answers.inc();
        }
        Ok(_) => {}
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Answer<DataResult>, ProxyError> {
        parse_answer(body.as_bytes())
    }

    #[test]
    fn answers() {
        let Ok(Answer::Result(r)) = parse(r#"{"result": {"data": {"x": 1}}}"#) else {
            panic!()
        };
        assert_eq!(r.data.unwrap().get(), r#"{"x": 1}"#);
        assert!(matches!(
            parse(r#"{"error": {"code": 1403, "message": "no"}}"#),
            Ok(Answer::Error(Refusal::App { code: 1403, .. }))
        ));
        assert!(matches!(
            parse(r#"{"disconnect": {"code": 4601, "reason": "bye"}}"#),
            Ok(Answer::Error(Refusal::Close {
                code: CloseCode(4601),
                ..
            }))
        ));
    }

    #[test]
    fn the_log_limiter_keeps_a_slot_per_cause_and_counts_what_it_left_out() {
        let limiter = LogLimiter::new();
        let unavailable = ProxyError::Unavailable(String::new());
        let bad = ProxyError::BadAnswer(String::new());
        let connect_down = cause(Hook::Connect, &unavailable);
        // One loud line a second per cause; another cause in the same second is loud too.
        assert_eq!(limiter.loud(connect_down, 10), Some(0));
        assert_eq!(limiter.loud(connect_down, 10), None);
        assert_eq!(limiter.loud(connect_down, 10), None);
        assert_eq!(limiter.loud(cause(Hook::Connect, &bad), 10), Some(0));
        assert_eq!(limiter.loud(cause(Hook::Rpc, &unavailable), 10), Some(0));
        // The next second's line says how many were left out.
        assert_eq!(limiter.loud(connect_down, 11), Some(2));
        assert_eq!(limiter.loud(connect_down, 12), Some(0));
        // Every hook and kind has its own slot.
        let hooks = [
            Hook::Connect,
            Hook::Refresh,
            Hook::Subscribe,
            Hook::SubRefresh,
            Hook::Publish,
            Hook::Rpc,
        ];
        let mut all: Vec<usize> = hooks
            .iter()
            .flat_map(|&h| [cause(h, &unavailable), cause(h, &bad)])
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all, (0..CAUSES).collect::<Vec<_>>());
    }

    #[test]
    fn unusable_answers() {
        for bad in [
            "",
            "garbage",
            "{}",
            r#"{"result": {}, "error": {"code": 1000}}"#,
            r#"{"error": {"code": 101, "message": "not ours"}}"#,
            r#"{"disconnect": {"code": 1000}}"#,
            r#"{"result": {"data": }}"#,
        ] {
            assert!(
                matches!(parse(bad), Err(ProxyError::BadAnswer(_))),
                "{bad} accepted"
            );
        }
    }

    /// Fuzz harness (property-based): any body a backend may send is read as an answer or
    /// refused as unusable, never a panic, and no code outside the documented ranges reaches a
    /// client. `scripts/fuzz.sh` runs it with more cases.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;
        use proptest::sample::{select, Index};

        const SEEDS: &[&str] = &[
            r#"{"result": {"user": "u", "info": {"n": 1}, "expire_at": 4000000000, "data": [1], "channels": ["a", "b"]}}"#,
            r#"{"result": {"expired": false, "expire_at": 1, "info": null}}"#,
            r#"{"result": {"data": {"x": 1}, "expire_at": 5}}"#,
            r#"{"error": {"code": 1403, "message": "no"}}"#,
            r#"{"disconnect": {"code": 4601, "reason": "bye"}}"#,
        ];

        fn body() -> impl Strategy<Value = Vec<u8>> {
            let edit = (any::<Index>(), any::<u8>(), any::<bool>());
            prop_oneof![
                any::<Vec<u8>>(),
                (select(SEEDS), prop::collection::vec(edit, 0..6)).prop_map(|(seed, edits)| {
                    let mut b = seed.as_bytes().to_vec();
                    for (at, byte, insert) in edits {
                        let i = at.index(b.len() + 1);
                        if insert {
                            b.insert(i, byte);
                        } else if i < b.len() {
                            b[i] = byte;
                        }
                    }
                    b
                }),
            ]
        }

        fn codes_in_range<T>(answer: &Result<Answer<T>, ProxyError>) -> bool {
            match answer {
                Ok(Answer::Error(Refusal::App { code, .. })) => APP_ERROR_CODES.contains(code),
                Ok(Answer::Error(Refusal::Close { code, .. })) => (4000..=4999).contains(&code.0),
                Ok(_) => true,
                Err(ProxyError::BadAnswer(why)) => why.len() < 400,
                Err(_) => false,
            }
        }

        proptest! {
            #[test]
            fn any_body_is_an_answer_or_unusable(body in body()) {
                prop_assert!(codes_in_range(&parse_answer::<ConnectResult>(&body)));
                prop_assert!(codes_in_range(&parse_answer::<RefreshResult>(&body)));
                prop_assert!(codes_in_range(&parse_answer::<SubscribeResult>(&body)));
                prop_assert!(codes_in_range(&parse_answer::<DataResult>(&body)));
            }
        }
    }
}
