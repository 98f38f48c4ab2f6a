//! The slice of the Herald wire protocol (docs/protocol.md) the load generator speaks: the
//! `connect` command with `subs`, its reply, pushes, and the publication payload that carries the
//! send time; and the same slice of the Pusher protocol (`--pusher`) and of Centrifugo's JSON
//! client protocol and HTTP API (`--centrifugo`, for side-by-side runs: docs/bench/peers/), and
//! of Socket.IO over WebSocket (`--socketio`: Engine.IO v4 packets carrying Socket.IO v5 ones).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

/// The `data` of every publication: scheduled send time (ns since the UNIX epoch), sequence number
/// within the run, and padding up to the requested size.
///
/// ```text
/// {"t":1763712000123456789,"s":42,"p":"xxxxxxxxxxxx"}
/// ```
pub fn make_data(sched_ns: u64, seq: u64, size: usize) -> String {
    let head = format!("{{\"t\":{sched_ns},\"s\":{seq},\"p\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    let mut s = String::with_capacity(head.len() + pad + 2);
    s.push_str(&head);
    s.push_str(&"x".repeat(pad));
    s.push_str("\"}");
    s
}

/// The Pusher event name publications go out as in `--pusher` mode.
pub const PUSHER_EVENT: &str = "bench";

/// The answer to the server's `pusher:ping`.
pub const PUSHER_PONG: &str = r#"{"event":"pusher:pong","data":{}}"#;

/// `--pusher`: the publication data that a Pusher client receives as event [`PUSHER_EVENT`] with
/// our payload as its (string) data (the envelope of docs/pusher.md).
pub fn pusher_envelope(data: &str) -> String {
    serde_json::json!({"event": PUSHER_EVENT, "data": data}).to_string()
}

/// The Pusher channel of the Herald channel `pusher:{app_id}:{name}`.
pub fn pusher_channel(channel: &str) -> &str {
    channel.splitn(3, ':').nth(2).unwrap_or(channel)
}

/// `pusher:subscribe` with the catch-up extension: positions, and `herald_since` after a drop.
/// Without `extension` (`--pusher-app`): the plain Pusher command.
pub fn pusher_subscribe(channel: &str, since: Option<&Since>, extension: bool) -> String {
    if !extension {
        return serde_json::json!({"event": "pusher:subscribe", "data": {"channel": channel}})
            .to_string();
    }
    let mut data = serde_json::json!({"channel": channel, "herald_positions": true});
    if let Some(s) = since {
        data["herald_since"] = serde_json::json!({"epoch": s.epoch, "offset": s.offset});
    }
    serde_json::json!({"event": "pusher:subscribe", "data": data}).to_string()
}

/// `--pusher-app`: the body of a trigger (`POST /apps/{id}/events`) of event [`PUSHER_EVENT`]
/// with our payload as its (string) data.
pub fn pusher_trigger_body(channel: &str, data: &str) -> String {
    serde_json::json!({"name": PUSHER_EVENT, "channel": channel, "data": data}).to_string()
}

/// `--pusher-app`: the path and signed query of a trigger with `body`, as Pusher's HTTP API
/// authenticates it: HMAC-SHA256 under the app secret of `POST\n{path}\n{sorted query}`, the query
/// carrying the body's MD5.
pub fn pusher_trigger_path(app: &crate::params::PusherApp, body: &str, unix_s: u64) -> String {
    use hmac::{Hmac, Mac};
    use md5::{Digest, Md5};
    let path = format!("/apps/{}/events", app.id);
    let body_md5 = hex::encode(Md5::digest(body.as_bytes()));
    let query = format!(
        "auth_key={}&auth_timestamp={unix_s}&auth_version=1.0&body_md5={body_md5}",
        app.key
    );
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(app.secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(format!("POST\n{path}\n{query}").as_bytes());
    let sig = hex::encode(mac.finalize().into_bytes());
    format!("{path}?{query}&auth_signature={sig}")
}

/// `--pusher-app`: the offset the k-th publication of a channel stands for. Publication `seq`
/// goes to channel `seq mod channels` ([`crate::publisher`]), so a channel's publications are
/// numbered 1, 2, 3, … by `seq / channels + 1`.
pub fn plain_offset(seq: u64, channels: usize) -> u64 {
    seq / channels.max(1) as u64 + 1
}

/// A Pusher message (`--pusher`): one per WebSocket message.
#[derive(Debug, Deserialize)]
pub struct PusherIncoming<'a> {
    /// Event name.
    #[serde(borrow)]
    pub event: std::borrow::Cow<'a, str>,
    /// Channel, for channel events.
    #[serde(borrow, default)]
    pub channel: Option<std::borrow::Cow<'a, str>>,
    /// Event data: for our events and `subscription_succeeded` a JSON string (borrowed from
    /// the message: no copy per event).
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
    /// The publication's offset (catch-up extension).
    #[serde(default)]
    pub herald_offset: Option<u64>,
}

impl PusherIncoming<'_> {
    /// Our payload, from an event whose data is the payload's JSON text.
    pub fn payload(&self) -> Data {
        self.data
            .and_then(|d| serde_json::from_str::<String>(d.get()).ok())
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default()
    }
}

/// The extension's part of `pusher_internal:subscription_succeeded` data.
#[derive(Debug, Default, Deserialize)]
pub struct PusherPosition {
    /// Stream epoch.
    #[serde(default)]
    pub epoch: String,
    /// Newest offset at subscribe time.
    #[serde(default)]
    pub offset: u64,
    /// With `herald_since`: whether every missed event follows.
    #[serde(default)]
    pub recovered: Option<bool>,
}

/// `--centrifugo`: connect anonymously and subscribe in one frame (two commands, one per line:
/// Centrifugo's JSON protocol reads newline-separated commands and answers them in order), with
/// `recover` from `since` after a drop.
///
/// ```text
/// {"id":1,"connect":{"name":"herald-bench"}}
/// {"id":2,"subscribe":{"channel":"bench0","recover":true,"epoch":"e","offset":7}}
/// ```
pub fn centrifugo_connect_subscribe(channel: &str, since: Option<&Since>) -> String {
    let mut sub = serde_json::json!({"channel": channel});
    if let Some(s) = since {
        sub["recover"] = true.into();
        sub["epoch"] = s.epoch.clone().into();
        sub["offset"] = s.offset.into();
    }
    let connect = serde_json::json!({"id": 1, "connect": {"name": "herald-bench"}});
    format!(
        "{connect}\n{}",
        serde_json::json!({"id": 2, "subscribe": sub})
    )
}

/// `--centrifugo`: one message from the server (one line of a frame): a reply to a command, an
/// asynchronous push, or the `{}` ping (answered with `{}`). Fields the bench does not act on are
/// skipped; zero values are absent on the wire (`omitempty`).
#[derive(Debug, Deserialize)]
pub struct CentrifugoIncoming<'a> {
    /// Reply id (absent on pushes and pings).
    #[serde(default)]
    pub id: Option<u64>,
    /// An error reply.
    #[serde(default)]
    pub error: Option<Box<RawValue>>,
    /// The `connect` result.
    #[serde(default)]
    pub connect: Option<Box<RawValue>>,
    /// The `subscribe` result.
    #[serde(borrow, default)]
    pub subscribe: Option<CentrifugoSubscribed<'a>>,
    /// An asynchronous push.
    #[serde(borrow, default)]
    pub push: Option<CentrifugoPush<'a>>,
}

impl CentrifugoIncoming<'_> {
    /// Whether this is the `{}` ping.
    pub fn is_ping(&self) -> bool {
        self.id.is_none()
            && self.error.is_none()
            && self.connect.is_none()
            && self.subscribe.is_none()
            && self.push.is_none()
    }
}

/// `--centrifugo`: a subscribe result. With history and `force_recovery` it carries the stream
/// position; after `recover`, the missed publications and whether all of them were there.
#[derive(Debug, Deserialize)]
pub struct CentrifugoSubscribed<'a> {
    /// Stream epoch.
    #[serde(default)]
    pub epoch: String,
    /// Newest offset at subscribe time.
    #[serde(default)]
    pub offset: u64,
    /// Whether every missed publication follows (absent: false).
    #[serde(default)]
    pub recovered: bool,
    /// Recovered publications, in order.
    #[serde(borrow, default)]
    pub publications: Vec<Publication<'a>>,
}

/// `--centrifugo`: a push; the channel is on the push, the payload in one of its members.
#[derive(Debug, Deserialize)]
pub struct CentrifugoPush<'a> {
    /// Channel the push is about.
    #[serde(borrow, default)]
    pub channel: Option<std::borrow::Cow<'a, str>>,
    /// A publication.
    #[serde(default, rename = "pub")]
    pub publication: Option<CentrifugoPublication>,
    /// The server ended the subscription.
    #[serde(default)]
    pub unsub: Option<Box<RawValue>>,
    /// Presence: someone subscribed.
    #[serde(default)]
    pub join: Option<Box<RawValue>>,
    /// Presence: someone left.
    #[serde(default)]
    pub leave: Option<Box<RawValue>>,
    /// The server is about to close the connection.
    #[serde(default)]
    pub disconnect: Option<Box<RawValue>>,
}

/// `--centrifugo`: a pushed publication. Its offset is absent (zero, `omitempty`) when the
/// channel keeps no history (`--no-history`), where Herald's always carries one.
#[derive(Debug, Deserialize)]
pub struct CentrifugoPublication {
    /// Offset in the stream; 0 without history.
    #[serde(default)]
    pub offset: u64,
    /// Our payload.
    #[serde(default)]
    pub data: Data,
}

/// `--centrifugo`: parses one line of a frame.
///
/// # Errors
/// Invalid JSON.
pub fn parse_centrifugo(line: &str) -> serde_json::Result<CentrifugoIncoming<'_>> {
    serde_json::from_str(line)
}

/// `--centrifugo`: the `{"channel":…,"data":…}` answer of `POST /api/publish` is
/// `{"result":{"offset":N,"epoch":"…"}}`, or `{"error":{"code":…,"message":…}}` with HTTP 200.
/// Returns the result (what Herald answers at the top level) or the error's text.
///
/// # Errors
/// The API's error, or an answer without a result.
pub fn centrifugo_api_result(v: &serde_json::Value) -> Result<&serde_json::Value, String> {
    if let Some(e) = v.get("error") {
        return Err(format!("API error {e}"));
    }
    v.get("result")
        .ok_or_else(|| format!("API answer without result: {v}"))
}

/// `--socketio`: the Socket.IO event our server script emits publications as
/// (`io.to(channel).emit("publication", channel, data)`).
pub const SOCKETIO_EVENT: &str = "publication";

/// `--socketio`: Socket.IO `CONNECT` to the main namespace, in an Engine.IO `message` packet.
pub const SOCKETIO_CONNECT: &str = "40";

/// `--socketio`: the Engine.IO `pong` that answers the server's `ping` (`2`).
pub const SOCKETIO_PONG: &str = "3";

/// `--socketio`: the ack id of the `subscribe` event.
pub const SOCKETIO_SUBSCRIBE_ACK: u64 = 1;

/// `--socketio`: `socket.emit("subscribe", channel, ack)` as a client library sends it: an
/// Engine.IO message (`4`) holding a Socket.IO `EVENT` (`2`) with ack id
/// [`SOCKETIO_SUBSCRIBE_ACK`].
pub fn socketio_subscribe(channel: &str) -> String {
    format!(
        "42{SOCKETIO_SUBSCRIBE_ACK}{}",
        serde_json::json!(["subscribe", channel])
    )
}

/// `--socketio`: one WebSocket message, an Engine.IO packet (WebSocket carries one packet per
/// message), and for a `message` packet the Socket.IO packet in it (main namespace only).
#[derive(Debug, PartialEq, Eq)]
pub enum SocketIo<'a> {
    /// Engine.IO `open` (`0{"sid":…,"pingInterval":…}`), with its JSON.
    Open(&'a str),
    /// Engine.IO `close` (`1`) or Socket.IO `DISCONNECT` (`41`).
    Close,
    /// Engine.IO `ping` (`2`): answer [`SOCKETIO_PONG`].
    Ping,
    /// Socket.IO `CONNECT` answer (`40{"sid":…}`).
    Connected,
    /// Socket.IO `CONNECT_ERROR` (`44{…}`), with its JSON.
    ConnectError(&'a str),
    /// Socket.IO `EVENT` (`42[name,…args]`): the JSON array.
    Event(&'a str),
    /// Socket.IO `ACK` (`43<id>[…args]`): its id and JSON array.
    Ack(u64, &'a str),
    /// Anything else (Engine.IO `noop`, binary packets, other namespaces).
    Other,
}

/// `--socketio`: parses one WebSocket text message.
///
/// # Errors
/// An empty message, or an `ACK` without an id.
pub fn parse_socketio(text: &str) -> Result<SocketIo<'_>, String> {
    let mut chars = text.chars();
    let Some(eio) = chars.next() else {
        return Err("empty Engine.IO packet".into());
    };
    let rest = &text[1..];
    Ok(match eio {
        '0' => SocketIo::Open(rest),
        '1' => SocketIo::Close,
        '2' => SocketIo::Ping,
        '4' => {
            let Some(kind) = rest.chars().next() else {
                return Err("empty Socket.IO packet".into());
            };
            let body = &rest[1..];
            // A namespace other than the main one starts with `/`.
            if body.starts_with('/') {
                return Ok(SocketIo::Other);
            }
            match kind {
                '0' => SocketIo::Connected,
                '1' => SocketIo::Close,
                '2' => SocketIo::Event(body.trim_start_matches(|c: char| c.is_ascii_digit())),
                '3' => {
                    let digits =
                        body.len() - body.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                    let id = body[..digits]
                        .parse()
                        .map_err(|_| format!("ACK without an id: {text:?}"))?;
                    SocketIo::Ack(id, &body[digits..])
                }
                '4' => SocketIo::ConnectError(body),
                _ => SocketIo::Other,
            }
        }
        _ => SocketIo::Other,
    })
}

/// `--socketio`: the channel and payload of an `EVENT` array if it is a publication
/// (`["publication",channel,data]`), `None` for other events or other shapes.
pub fn socketio_publication(array: &str) -> Option<(std::borrow::Cow<'_, str>, Data)> {
    let args: Vec<&RawValue> = serde_json::from_str(array).ok()?;
    let [name, channel, data] = args.as_slice() else {
        return None;
    };
    let name: std::borrow::Cow<'_, str> = serde_json::from_str(name.get()).ok()?;
    if name != SOCKETIO_EVENT {
        return None;
    }
    let channel: std::borrow::Cow<'_, str> = serde_json::from_str(channel.get()).ok()?;
    let data: Data = serde_json::from_str(data.get()).ok()?;
    Some((channel, data))
}

/// Where a subscription resumes from (`since`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Since {
    /// Stream epoch.
    pub epoch: String,
    /// Last offset the application has.
    pub offset: u64,
}

/// The first command on a connection: connect and subscribe in one round trip.
///
/// ```text
/// {"id":1,"connect":{"name":"herald-bench","subs":{"bench0":{"since":{"epoch":"e","offset":7}}}}}
/// ```
pub fn connect_cmd(subs: &[(&str, Option<&Since>)]) -> String {
    let mut m = serde_json::Map::new();
    for (ch, since) in subs {
        let v = match since {
            Some(s) => serde_json::json!({"since": {"epoch": s.epoch, "offset": s.offset}}),
            None => serde_json::json!({}),
        };
        m.insert((*ch).to_string(), v);
    }
    serde_json::json!({"id": 1, "connect": {"name": "herald-bench", "subs": m}}).to_string()
}

/// `--tags-filter`: `connect` without subscriptions, then one `subscribe` with the filter
/// (`connect.subs` takes no `tf`), as two frames sent back to back.
///
/// ```text
/// {"id":1,"connect":{"name":"herald-bench"}}
/// {"id":2,"subscribe":{"channel":"bench0","tf":{"key":"k","cmp":"eq","val":"v"}}}
/// ```
pub fn filtered_connect_subscribe(
    channel: &str,
    since: Option<&Since>,
    tf: &serde_json::Value,
) -> [String; 2] {
    let mut sub = serde_json::json!({"channel": channel, "tf": tf});
    if let Some(s) = since {
        sub["since"] = serde_json::json!({"epoch": s.epoch, "offset": s.offset});
    }
    [
        serde_json::json!({"id": 1, "connect": {"name": "herald-bench"}}).to_string(),
        serde_json::json!({"id": 2, "subscribe": sub}).to_string(),
    ]
}

/// Our payload, read back from a publication's `data`.
#[derive(Debug, Default, Deserialize)]
pub struct Data {
    /// Scheduled send time, ns since the UNIX epoch (0 if the data was not ours).
    #[serde(default)]
    pub t: u64,
    /// Sequence number within the run.
    #[serde(default)]
    pub s: u64,
}

/// A publication, pushed or carried in a recovery reply.
#[derive(Debug, Deserialize)]
pub struct Publication<'a> {
    /// Channel (present in pushes, absent inside a subscribe result).
    #[serde(borrow, default)]
    pub channel: Option<std::borrow::Cow<'a, str>>,
    /// Offset in the stream.
    pub offset: u64,
    /// Our payload.
    #[serde(default)]
    pub data: Data,
}

/// A subscribe result (also one entry of `connect.subs`).
#[derive(Debug, Deserialize)]
pub struct SubResult<'a> {
    /// Stream epoch.
    #[serde(default)]
    pub epoch: String,
    /// Newest offset at subscribe time.
    #[serde(default)]
    pub offset: u64,
    /// Whether `since` was honoured in full.
    #[serde(default)]
    pub recovered: Option<bool>,
    /// Recovered publications, in order.
    #[serde(borrow, default)]
    pub publications: Vec<Publication<'a>>,
    /// A per-channel error, if the server reports one here.
    #[serde(default)]
    pub error: Option<Box<RawValue>>,
}

/// The `connect` result.
#[derive(Debug, Deserialize)]
pub struct ConnectResult<'a> {
    /// Client id.
    #[serde(default)]
    pub client: String,
    /// Subscription results by channel.
    #[serde(borrow, default)]
    pub subs: BTreeMap<String, SubResult<'a>>,
}

/// Any message from the server (one line of a frame).
#[derive(Debug, Deserialize)]
pub struct Incoming<'a> {
    /// Reply id (absent on pushes).
    #[serde(default)]
    pub id: Option<u64>,
    /// A `connect` reply.
    #[serde(borrow, default)]
    pub connect: Option<ConnectResult<'a>>,
    /// A `subscribe` reply (`--tags-filter`), or the server's `subscribe` push.
    #[serde(borrow, default)]
    pub subscribe: Option<SubResult<'a>>,
    /// An error reply.
    #[serde(default)]
    pub error: Option<Box<RawValue>>,
    /// A publication push.
    #[serde(borrow, default, rename = "pub")]
    pub publication: Option<Publication<'a>>,
    /// The server ended a subscription.
    #[serde(default)]
    pub unsub: Option<Box<RawValue>>,
    /// The server is about to close the connection.
    #[serde(default)]
    pub disconnect: Option<Box<RawValue>>,
    /// Presence: someone subscribed (where the namespace turns `join_leave` on).
    #[serde(default)]
    pub join: Option<Box<RawValue>>,
    /// Presence: someone left.
    #[serde(default)]
    pub leave: Option<Box<RawValue>>,
}

impl Incoming<'_> {
    /// Whether this is the `{}` ping (answered with `{}`).
    pub fn is_ping(&self) -> bool {
        self.id.is_none()
            && self.connect.is_none()
            && self.subscribe.is_none()
            && self.error.is_none()
            && self.publication.is_none()
            && self.unsub.is_none()
            && self.disconnect.is_none()
            && self.join.is_none()
            && self.leave.is_none()
    }
}

/// The part of a `disconnect` push a client acts on.
#[derive(Debug, Deserialize)]
struct Disconnect {
    #[serde(default)]
    reconnect: bool,
    #[serde(default)]
    after_ms: u64,
}

/// A `disconnect` push's reconnect hint: `Some(after_ms)` (0 when absent) when the client is told
/// to reconnect, `None` when it is told to stay away or the push is malformed.
pub fn reconnect_after_ms(disconnect: &RawValue) -> Option<u64> {
    let d: Disconnect = serde_json::from_str(disconnect.get()).ok()?;
    d.reconnect.then_some(d.after_ms)
}

/// Parses one line of a frame.
///
/// # Errors
/// Invalid JSON.
pub fn parse(line: &str) -> serde_json::Result<Incoming<'_>> {
    serde_json::from_str(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_has_requested_size_and_reads_back() {
        let d = make_data(1_763_712_000_123_456_789, 42, 64);
        assert_eq!(d.len(), 64);
        let v: Data = serde_json::from_str(&d).unwrap();
        assert_eq!((v.t, v.s), (1_763_712_000_123_456_789, 42));
    }

    #[test]
    fn pusher_messages() {
        let env = pusher_envelope(&make_data(5, 1, 32));
        let v: serde_json::Value = serde_json::from_str(&env).unwrap();
        assert_eq!(v["event"], PUSHER_EVENT);
        let frame = serde_json::json!({"event": "bench", "channel": "bench0", "data": v["data"], "herald_offset": 3}).to_string();
        let m: PusherIncoming<'_> = serde_json::from_str(&frame).unwrap();
        assert_eq!(
            (m.herald_offset, m.payload().t, m.payload().s),
            (Some(3), 5, 1)
        );
        assert_eq!(pusher_channel("pusher:app:bench0"), "bench0");
        let since = Since {
            epoch: "e".into(),
            offset: 2,
        };
        assert!(pusher_subscribe("bench0", Some(&since), true)
            .contains(r#""herald_since":{"epoch":"e","offset":2}"#));
    }

    #[test]
    fn trigger_signature_matches_pushers_worked_example() {
        // The worked example of Pusher's HTTP API reference (authentication).
        let app = crate::params::PusherApp {
            id: "3".into(),
            key: "278d425bdf160c739803".into(),
            secret: "7ad3773142a6692b25b8".into(),
        };
        let body = r#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
        assert_eq!(
            pusher_trigger_path(&app, body, 1353088179),
            "/apps/3/events?auth_key=278d425bdf160c739803&auth_timestamp=1353088179\
             &auth_version=1.0&body_md5=ec365a775a4cd0599faeb73354201b6f\
             &auth_signature=da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c"
        );
        let b: serde_json::Value =
            serde_json::from_str(&pusher_trigger_body("bench3", r#"{"t":1}"#)).unwrap();
        assert_eq!(b["data"], r#"{"t":1}"#);
        assert_eq!(b["channel"], "bench3");
        assert_eq!(
            pusher_subscribe("bench3", None, false),
            r#"{"data":{"channel":"bench3"},"event":"pusher:subscribe"}"#
        );
        // Channel 2 of 4 gets publications 2, 6, 10: offsets 1, 2, 3.
        assert_eq!([2, 6, 10].map(|s| plain_offset(s, 4)), [1, 2, 3]);
    }

    #[test]
    fn parses_pushes_replies_and_ping() {
        let p =
            parse(r#"{"pub":{"channel":"c","offset":7,"data":{"t":5,"s":1,"p":"x"}}}"#).unwrap();
        let publ = p.publication.unwrap();
        assert_eq!((publ.offset, publ.data.t), (7, 5));
        assert!(parse("{}").unwrap().is_ping());
        let j = parse(r#"{"join":{"channel":"c","info":{"user":"","client":"x"}}}"#).unwrap();
        assert!(!j.is_ping() && j.join.is_some());
        let r = parse(
            r#"{"id":1,"connect":{"client":"a","node":"n","ping_interval":25,"subs":{"c":{"epoch":"e","offset":3,"recoverable":true,"recovered":true,"publications":[{"offset":3,"data":{"t":1,"s":0}}]}}}}"#,
        )
        .unwrap();
        let c = r.connect.unwrap();
        assert_eq!(c.subs["c"].publications.len(), 1);
        assert_eq!(c.subs["c"].recovered, Some(true));
        let cmd = connect_cmd(&[(
            "c",
            Some(&Since {
                epoch: "e".into(),
                offset: 3,
            }),
        )]);
        assert!(cmd.contains(r#""since":{"epoch":"e","offset":3}"#));
    }

    #[test]
    fn centrifugo_frames() {
        // A frame of several messages, one per line, as Centrifugo batches them.
        let frame = "{\"id\":1,\"connect\":{\"client\":\"c1\",\"version\":\"6.9.1\",\"ping\":25,\"pong\":true}}\n\
            {\"id\":2,\"subscribe\":{\"recoverable\":true,\"epoch\":\"ep\",\"offset\":12,\"positioned\":true}}\n\
            {\"push\":{\"channel\":\"bench0\",\"pub\":{\"data\":{\"t\":5,\"s\":9,\"p\":\"xx\"},\"offset\":13}}}\n\
            {}";
        let msgs: Vec<_> = frame
            .split('\n')
            .map(|l| parse_centrifugo(l).unwrap())
            .collect();
        assert_eq!(msgs[0].id, Some(1));
        assert!(msgs[0].connect.is_some() && !msgs[0].is_ping());
        let s = msgs[1].subscribe.as_ref().unwrap();
        assert_eq!((s.epoch.as_str(), s.offset, s.recovered), ("ep", 12, false));
        let push = msgs[2].push.as_ref().unwrap();
        assert_eq!(push.channel.as_deref(), Some("bench0"));
        let p = push.publication.as_ref().unwrap();
        assert_eq!((p.offset, p.data.t, p.data.s), (13, 5, 9));
        assert!(msgs[3].is_ping());
        // A recovered resubscribe: the missed publications come in the reply.
        let r = parse_centrifugo(
            r#"{"id":2,"subscribe":{"recoverable":true,"epoch":"ep","offset":14,"recovered":true,"publications":[{"data":{"t":1,"s":2},"offset":14}]}}"#,
        )
        .unwrap();
        let s = r.subscribe.unwrap();
        assert!(s.recovered);
        assert_eq!(s.publications[0].offset, 14);
        // Errors, unsubscribe pushes and a publication without our payload are not pings.
        let e = parse_centrifugo(r#"{"id":2,"error":{"code":103,"message":"permission denied"}}"#)
            .unwrap();
        assert!(e.error.is_some() && !e.is_ping());
        let u = parse_centrifugo(r#"{"push":{"channel":"bench0","unsub":{"code":2500}}}"#).unwrap();
        assert!(u.push.unwrap().unsub.is_some());
        let other =
            parse_centrifugo(r#"{"push":{"channel":"x","pub":{"data":"text","offset":1}}}"#);
        assert!(
            other.is_err(),
            "a publication whose data is not our payload object"
        );
        assert!(parse_centrifugo("{\"push\":").is_err());
        // Without history (the NATS broker) a publication has no offset (`omitempty`).
        let plain =
            parse_centrifugo(r#"{"push":{"channel":"bench0","pub":{"data":{"t":5,"s":9}}}}"#)
                .unwrap();
        let p = plain.push.unwrap().publication.unwrap();
        assert_eq!((p.offset, p.data.s), (0, 9));
    }

    #[test]
    fn filtered_subscribe_is_a_second_command_and_its_reply_parses() {
        let tf = serde_json::json!({"key": "k", "cmp": "eq", "val": "v"});
        let since = Since {
            epoch: "e".into(),
            offset: 7,
        };
        let [c, s] = filtered_connect_subscribe("bench0", Some(&since), &tf);
        assert_eq!(c, r#"{"connect":{"name":"herald-bench"},"id":1}"#);
        let s: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(s["id"], 2);
        assert_eq!(s["subscribe"]["tf"], tf);
        assert_eq!(s["subscribe"]["since"]["offset"], 7);
        let reply = r#"{"id":2,"subscribe":{"epoch":"e","offset":9,"recoverable":true}}"#;
        let inc = parse(reply).unwrap();
        assert_eq!(inc.subscribe.map(|r| r.offset), Some(9));
        assert!(!parse(reply).unwrap().is_ping());
    }

    #[test]
    fn centrifugo_commands_and_api() {
        let first = centrifugo_connect_subscribe("bench0", None);
        let lines: Vec<serde_json::Value> = first
            .split('\n')
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["id"], 1);
        assert!(lines[0]["connect"].is_object());
        assert_eq!(
            lines[1]["subscribe"],
            serde_json::json!({"channel": "bench0"})
        );
        let since = Since {
            epoch: "ep".into(),
            offset: 7,
        };
        let again = centrifugo_connect_subscribe("bench0", Some(&since));
        let sub: serde_json::Value =
            serde_json::from_str(again.split('\n').nth(1).unwrap()).unwrap();
        assert_eq!(
            sub["subscribe"],
            serde_json::json!({"channel": "bench0", "recover": true, "epoch": "ep", "offset": 7})
        );
        let ok: serde_json::Value =
            serde_json::from_str(r#"{"result":{"offset":3,"epoch":"ep"}}"#).unwrap();
        assert_eq!(centrifugo_api_result(&ok).unwrap()["offset"], 3);
        let err: serde_json::Value =
            serde_json::from_str(r#"{"error":{"code":102,"message":"unknown channel"}}"#).unwrap();
        assert!(centrifugo_api_result(&err)
            .unwrap_err()
            .contains("unknown channel"));
        assert!(centrifugo_api_result(&serde_json::json!({})).is_err());
    }

    #[test]
    fn disconnect_reconnect_hint() {
        let d = parse(
            r#"{"disconnect":{"code":4000,"reason":"shutdown","reconnect":true,"after_ms":1234}}"#,
        )
        .unwrap();
        assert_eq!(reconnect_after_ms(&d.disconnect.unwrap()), Some(1234));
        let d = parse(r#"{"disconnect":{"code":4000,"reason":"x","reconnect":true}}"#).unwrap();
        assert_eq!(reconnect_after_ms(&d.disconnect.unwrap()), Some(0));
        let d = parse(r#"{"disconnect":{"code":4501,"reason":"x","reconnect":false}}"#).unwrap();
        assert_eq!(reconnect_after_ms(&d.disconnect.unwrap()), None);
    }

    #[test]
    fn socketio_handshake_packets() {
        let open = r#"0{"sid":"AbC","upgrades":[],"pingInterval":25000,"pingTimeout":20000,"maxPayload":1000000}"#;
        assert_eq!(parse_socketio(open).unwrap(), SocketIo::Open(&open[1..]));
        assert_eq!(
            parse_socketio(r#"40{"sid":"xyz"}"#).unwrap(),
            SocketIo::Connected
        );
        assert_eq!(
            parse_socketio(r#"44{"message":"Not authorized"}"#).unwrap(),
            SocketIo::ConnectError(r#"{"message":"Not authorized"}"#)
        );
        assert_eq!(parse_socketio("2").unwrap(), SocketIo::Ping);
        assert_eq!(parse_socketio("1").unwrap(), SocketIo::Close);
        assert_eq!(parse_socketio("41").unwrap(), SocketIo::Close);
        assert_eq!(parse_socketio("6").unwrap(), SocketIo::Other);
        assert_eq!(
            parse_socketio(r#"42/admin,["publication","a",{}]"#).unwrap(),
            SocketIo::Other
        );
        assert!(parse_socketio("").is_err());
        assert!(parse_socketio("4").is_err());
        assert!(parse_socketio("43[]").is_err());
        // The acknowledgement of `subscribe`: empty on success, an error object otherwise.
        assert_eq!(parse_socketio("431[]").unwrap(), SocketIo::Ack(1, "[]"));
        assert_eq!(
            parse_socketio(r#"4312[{"error":"x"}]"#).unwrap(),
            SocketIo::Ack(12, r#"[{"error":"x"}]"#)
        );
        // What the client sends.
        assert_eq!(SOCKETIO_CONNECT, "40");
        assert_eq!(SOCKETIO_PONG, "3");
        assert_eq!(socketio_subscribe("bench0"), r#"421["subscribe","bench0"]"#);
        assert_eq!(
            socketio_subscribe("a\"b"),
            r#"421["subscribe","a\"b"]"#,
            "the channel is JSON-escaped"
        );
    }

    #[test]
    fn socketio_publications() {
        let data = make_data(1_763_712_000_123_456_789, 7, 64);
        let msg = format!(r#"42["publication","bench0",{data}]"#);
        let SocketIo::Event(array) = parse_socketio(&msg).unwrap() else {
            panic!("not an event: {msg}");
        };
        let (channel, d) = socketio_publication(array).unwrap();
        assert_eq!(channel, "bench0");
        assert_eq!((d.t, d.s), (1_763_712_000_123_456_789, 7));
        // An event with an ack id carries the id before the array.
        let with_id = format!(r#"4217["publication","bench0",{data}]"#);
        assert_eq!(parse_socketio(&with_id).unwrap(), SocketIo::Event(array));
        // Other events and shapes are not publications.
        assert!(socketio_publication(r#"["other","bench0",{"t":1,"s":1}]"#).is_none());
        assert!(socketio_publication(r#"["publication",{"t":1,"s":1}]"#).is_none());
        assert!(socketio_publication(r#"["publication","bench0",{"t":1},4]"#).is_none());
        assert!(socketio_publication("not json").is_none());
    }
}
