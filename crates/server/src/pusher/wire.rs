//! Pusher protocol 7 messages: what clients send, what the server sends, and the envelope that
//! carries a Pusher event through a Herald channel.
//!
//! # The envelope
//! A Pusher event is stored in its Herald channel as the publication data
//! `{"event": NAME, "data": DATA, "user_id"?: ID, "exclude"?: SOCKET_ID}`: `user_id` marks a
//! client event on a presence channel, `exclude` the socket that must not receive it (the HTTP
//! API's `socket_id`, or the sender of a client event). A publication without an `event` string
//! (a Herald client's own) reaches Pusher clients as event `herald:publication`.
//!
//! # Escapes
//! Every string read from the wire may carry JSON escapes (Laravel's event names are
//! `App\\Events\\…` on the wire, user ids may hold `\"`): the fields read here are `Cow<str>`,
//! which borrow when the string has no escape and are decoded by serde_json when it has one. A
//! borrowed `&str` field would fail on an escape and the whole frame would decode as something
//! else.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Every frame this module encodes starts so; frames from the hub (Herald pushes) never do.
pub const OWN_FRAME_PREFIX: &[u8] = b"{\"event\":";

/// The event a Herald-protocol publication without an envelope becomes.
pub const HERALD_PUBLICATION: &str = "herald:publication";

/// A message from a client: `{"event", "channel"?, "data"?}`.
#[derive(Debug, Deserialize)]
pub struct ClientMessage {
    /// Event name.
    pub event: String,
    /// Channel, for client events.
    #[serde(default)]
    pub channel: Option<String>,
    /// Event data, as sent.
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
}

/// `pusher:subscribe` data.
#[derive(Debug, Deserialize)]
pub struct SubscribeData {
    /// The channel.
    pub channel: String,
    /// `key:signature` for private and presence channels.
    #[serde(default)]
    pub auth: Option<String>,
    /// Presence member data, a JSON string `{"user_id", "user_info"?}`.
    #[serde(default)]
    pub channel_data: Option<String>,
    /// Extension: recover what was published after this position (implies `herald_positions`).
    #[serde(default)]
    pub herald_since: Option<herald_protocol::StreamPosition>,
    /// Extension: tag this channel's events with `herald_offset`.
    #[serde(default)]
    pub herald_positions: bool,
}

/// `pusher:unsubscribe` data.
#[derive(Debug, Deserialize)]
pub struct UnsubscribeData {
    /// The channel.
    pub channel: String,
}

/// `pusher:signin` data.
#[derive(Debug, Deserialize)]
pub struct SigninData {
    /// `key:signature` over `socket_id::user::user_data`.
    pub auth: String,
    /// The user, a JSON string `{"id", …}`.
    pub user_data: String,
}

/// `user_data` of a sign-in: the user id.
#[derive(Debug, Deserialize)]
pub struct UserData {
    /// The user id.
    pub id: String,
}

/// Presence `channel_data`: who the member is.
#[derive(Debug, Deserialize)]
pub struct ChannelData {
    /// The user id (a string or a number).
    pub user_id: serde_json::Value,
    /// Shown to the other members.
    #[serde(default)]
    pub user_info: Option<Box<RawValue>>,
}

impl ChannelData {
    /// The user id as text, if it is a non-empty string or a number.
    pub fn user_id(&self) -> Option<String> {
        match &self.user_id {
            serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// Read a message's data: an object, or (as some clients send it) a string holding one.
pub fn parse_data<T: serde::de::DeserializeOwned>(data: Option<&RawValue>) -> Option<T> {
    let raw = data?.get();
    if let Ok(v) = serde_json::from_str(raw) {
        return Some(v);
    }
    let inner: String = serde_json::from_str(raw).ok()?;
    serde_json::from_str(&inner).ok()
}

/// The envelope as stored (see the module docs).
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<'a> {
    /// Event name.
    #[serde(borrow)]
    pub event: Cow<'a, str>,
    /// Event data, as given.
    #[serde(borrow)]
    pub data: &'a RawValue,
    /// The sender of a client event on a presence channel.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<Cow<'a, str>>,
    /// The socket that does not receive it.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Cow<'a, str>>,
}

impl Envelope<'_> {
    /// The publication data.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("envelope serializes"))
    }
}

#[derive(Serialize)]
struct Event<'a, D: Serialize + ?Sized> {
    event: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    channel: Option<&'a str>,
    data: &'a D,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    herald_offset: Option<u64>,
}

fn encode<D: Serialize + ?Sized>(
    event: &str,
    channel: Option<&str>,
    data: &D,
    user_id: Option<&str>,
) -> Bytes {
    encode_at(event, channel, data, user_id, None)
}

fn encode_at<D: Serialize + ?Sized>(
    event: &str,
    channel: Option<&str>,
    data: &D,
    user_id: Option<&str>,
    herald_offset: Option<u64>,
) -> Bytes {
    let frame = Event {
        event,
        channel,
        data,
        user_id,
        herald_offset,
    };
    Bytes::from(serde_json::to_vec(&frame).expect("event serializes"))
}

/// `pusher:connection_established`; its data is a JSON string.
pub fn connection_established(socket_id: &str, activity_timeout_s: u64) -> Bytes {
    let data = serde_json::json!({"socket_id": socket_id, "activity_timeout": activity_timeout_s});
    encode(
        "pusher:connection_established",
        None,
        &data.to_string(),
        None,
    )
}

/// `pusher:error` with a protocol code (or none, for errors that are not about the connection).
pub fn error(code: Option<u16>, message: &str) -> Bytes {
    let data = serde_json::json!({"code": code, "message": message});
    encode("pusher:error", None, &data, None)
}

/// `pusher:signin_success` with the signed-in `user_data`.
pub fn signin_success(user_data: &str) -> Bytes {
    let data = serde_json::json!({ "user_data": user_data });
    encode("pusher:signin_success", None, &data.to_string(), None)
}

/// `pusher:pong`.
pub fn pong() -> Bytes {
    encode("pusher:pong", None, &serde_json::json!({}), None)
}

/// `pusher:ping` (the server asks a silent client whether it is there).
pub fn ping() -> Bytes {
    encode("pusher:ping", None, &serde_json::json!({}), None)
}

/// `pusher_internal:subscription_succeeded`; `data` is JSON text, sent as a string.
pub fn subscription_succeeded(channel: &str, data: &str) -> Bytes {
    encode(
        "pusher_internal:subscription_succeeded",
        Some(channel),
        data,
        None,
    )
}

/// `pusher:subscription_error` on a channel (what pusher-js reports to the channel's listeners).
pub fn subscription_error(channel: &str, kind: &str, message: &str, status: u16) -> Bytes {
    let data = serde_json::json!({"type": kind, "error": message, "status": status});
    encode("pusher:subscription_error", Some(channel), &data, None)
}

/// An event on a channel; `herald_offset` (the extension) is the publication's offset.
pub fn event(
    name: &str,
    channel: &str,
    data: &RawValue,
    user_id: Option<&str>,
    herald_offset: Option<u64>,
) -> Bytes {
    encode_at(name, Some(channel), data, user_id, herald_offset)
}

/// `herald:reset` (the extension): the channel's stream could not be followed; it goes on from
/// `{epoch, offset}` and what came between is lost.
pub fn reset(channel: &str, position: &herald_protocol::StreamPosition) -> Bytes {
    encode("herald:reset", Some(channel), position, None)
}

/// `pusher_internal:member_added`.
pub fn member_added(channel: &str, user_id: &str, user_info: Option<&RawValue>) -> Bytes {
    let data = serde_json::json!({"user_id": user_id, "user_info": user_info});
    encode(
        "pusher_internal:member_added",
        Some(channel),
        &data.to_string(),
        None,
    )
}

/// `pusher_internal:subscription_count`: data (a JSON string) `{"subscription_count": N}`.
pub fn subscription_count(channel: &str, count: u64) -> Bytes {
    let data = serde_json::json!({ "subscription_count": count });
    encode(
        "pusher_internal:subscription_count",
        Some(channel),
        &data.to_string(),
        None,
    )
}

/// `pusher:cache_miss`: a cache channel holds no event for the new subscriber.
pub fn cache_miss(channel: &str) -> Bytes {
    encode("pusher:cache_miss", Some(channel), "{}", None)
}

/// `pusher_internal:member_removed`.
pub fn member_removed(channel: &str, user_id: &str) -> Bytes {
    let data = serde_json::json!({ "user_id": user_id });
    encode(
        "pusher_internal:member_removed",
        Some(channel),
        &data.to_string(),
        None,
    )
}

/// `pusher_internal:watchlist_events`: data (a JSON string) `{"events": events}`.
pub fn watchlist_events(events: &[serde_json::Value]) -> Bytes {
    let data = serde_json::json!({ "events": events });
    encode(
        "pusher_internal:watchlist_events",
        None,
        &data.to_string(),
        None,
    )
}

/// A Herald push the hub queued for a Pusher connection.
#[derive(Debug, Deserialize)]
pub struct HubPush<'a> {
    /// A publication.
    #[serde(default, borrow, rename = "pub")]
    pub publication: Option<HubPublication<'a>>,
    /// Someone joined a channel.
    #[serde(default, borrow)]
    pub join: Option<HubPresence<'a>>,
    /// Someone left a channel.
    #[serde(default, borrow)]
    pub leave: Option<HubPresence<'a>>,
}

/// `{"channel", "data", …}` of a Herald publication push.
#[derive(Debug, Deserialize)]
pub struct HubPublication<'a> {
    /// The Herald channel.
    #[serde(borrow)]
    pub channel: Cow<'a, str>,
    /// The offset in the channel's stream.
    pub offset: u64,
    /// The publication data.
    #[serde(borrow)]
    pub data: &'a RawValue,
}

/// `{"channel", "info": {"user", "client", "info"?}}` of a join or leave push.
#[derive(Debug, Deserialize)]
pub struct HubPresence<'a> {
    /// The Herald channel.
    #[serde(borrow)]
    pub channel: Cow<'a, str>,
    /// Who.
    #[serde(borrow)]
    pub info: HubMember<'a>,
}

/// A presence member as Herald carries it: user id, socket id and user info.
#[derive(Debug, Deserialize)]
pub struct HubMember<'a> {
    /// The Pusher `user_id`.
    #[serde(borrow)]
    pub user: Cow<'a, str>,
    /// The socket id.
    #[serde(borrow)]
    pub client: Cow<'a, str>,
    /// The Pusher `user_info`.
    #[serde(default, borrow)]
    pub info: Option<&'a RawValue>,
}

/// The Pusher event a Herald publication's data stands for.
pub fn envelope_of(data: &RawValue) -> Envelope<'_> {
    match serde_json::from_str::<Envelope<'_>>(data.get()) {
        Ok(envelope) => envelope,
        Err(_) => Envelope {
            event: Cow::Borrowed(HERALD_PUBLICATION),
            data,
            user_id: None,
            exclude: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_established_carries_a_json_string() {
        let frame = connection_established("1.2", 120);
        let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(v["event"], "pusher:connection_established");
        let data: serde_json::Value = serde_json::from_str(v["data"].as_str().unwrap()).unwrap();
        assert_eq!(data["socket_id"], "1.2");
        assert_eq!(data["activity_timeout"], 120);
        assert!(frame.starts_with(OWN_FRAME_PREFIX));
    }

    #[test]
    fn envelopes_round_trip_and_foreign_data_is_wrapped() {
        let data = RawValue::from_string("\"{\\\"a\\\":1}\"".into()).unwrap();
        let bytes = Envelope {
            event: "e".into(),
            data: &data,
            user_id: None,
            exclude: Some("1.2".into()),
        }
        .to_bytes();
        let raw: &RawValue = serde_json::from_slice(&bytes).unwrap();
        let back = envelope_of(raw);
        assert_eq!(
            (&*back.event, back.data.get(), back.exclude.as_deref()),
            ("e", data.get(), Some("1.2"))
        );
        let foreign = RawValue::from_string("{\"text\":\"hi\"}".into()).unwrap();
        assert_eq!(envelope_of(&foreign).event, HERALD_PUBLICATION);
    }

    #[test]
    fn escaped_envelope_strings_are_decoded() {
        // Laravel's default event name, a user id with a quote: escapes on the wire.
        let bytes = Envelope {
            event: "App\\Events\\OrderShipped".into(),
            data: &RawValue::from_string("1".into()).unwrap(),
            user_id: Some("a\"b".into()),
            exclude: Some("1.2".into()),
        }
        .to_bytes();
        assert!(
            bytes.windows(2).any(|w| w == b"\\\\"),
            "escaped on the wire"
        );
        let raw: &RawValue = serde_json::from_slice(&bytes).unwrap();
        let back = envelope_of(raw);
        assert_eq!(&*back.event, "App\\Events\\OrderShipped");
        assert_eq!(back.user_id.as_deref(), Some("a\"b"));
        assert_eq!(back.exclude.as_deref(), Some("1.2"));
    }

    #[test]
    fn subscribe_data_as_object_or_string() {
        let obj = RawValue::from_string(r#"{"channel":"a"}"#.into()).unwrap();
        let s = RawValue::from_string(r#""{\"channel\":\"b\"}""#.into()).unwrap();
        assert_eq!(
            parse_data::<SubscribeData>(Some(&obj)).unwrap().channel,
            "a"
        );
        assert_eq!(parse_data::<SubscribeData>(Some(&s)).unwrap().channel, "b");
        assert!(parse_data::<SubscribeData>(None).is_none());
    }
}
