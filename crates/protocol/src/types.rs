//! Values shared by commands, replies and brokers.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::tags::Tags;

/// Who published or who joined/left: `{"user": "...", "client": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientInfo {
    /// User id from the token's `sub` ("" for anonymous).
    pub user: String,
    /// Connection id assigned by the node.
    pub client: String,
    /// The token's `info` claim, as raw JSON, shown in presence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<Box<RawValue>>,
}

impl PartialEq for ClientInfo {
    fn eq(&self, other: &Self) -> bool {
        self.user == other.user
            && self.client == other.client
            && self.info.as_ref().map(|i| i.get()) == other.info.as_ref().map(|i| i.get())
    }
}

impl Eq for ClientInfo {}

/// A stream position: the channel's epoch and an offset within it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPosition {
    /// Random string that changes whenever the stream is recreated.
    pub epoch: String,
    /// Offset of the newest publication (0 when the stream is empty).
    pub offset: u64,
}

/// One publication in a channel's stream. `data` is raw JSON text, validated once on the way in and
/// never re-encoded, so that the same bytes reach every subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// Position within the epoch, starting at 1.
    pub offset: u64,
    /// The payload as JSON text.
    pub data: Bytes,
    /// Publisher, when a client published.
    pub info: Option<ClientInfo>,
    /// The publisher's tags (empty for most publications), which subscribers' tag filters
    /// select on (see [`crate::tags`]).
    pub tags: Tags,
}

impl Publication {
    /// The payload as a raw JSON value for serialization.
    pub fn data_raw(&self) -> &RawValue {
        raw_from_bytes(&self.data)
    }
}

/// Borrow validated JSON bytes as a raw value. Bytes that are not valid JSON become `null` (this
/// only happens if a broker hands back corrupted data, which must not crash an encoder).
pub fn raw_from_bytes(data: &[u8]) -> &RawValue {
    let parsed: Option<&RawValue> = std::str::from_utf8(data)
        .ok()
        .and_then(|s| serde_json::from_str(s).ok());
    match parsed {
        Some(raw) => raw,
        None => null_raw(),
    }
}

fn null_raw() -> &'static RawValue {
    static NULL: std::sync::OnceLock<Box<RawValue>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| RawValue::from_string("null".to_owned()).expect("null is JSON"))
}

/// Wire form of a publication inside replies (`publications: [...]`).
#[derive(Serialize)]
pub struct PublicationWire<'a> {
    /// Offset within the epoch; absent for a publication kept out of history
    /// (`skip_history`), which has none.
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// Raw JSON payload.
    pub data: &'a RawValue,
    /// Publisher info without the presence `info` claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<PublisherWire<'a>>,
    /// The publication's tags; absent when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<&'a Tags>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `{"user","client","info"?}` as carried in publications and join/leave pushes; `info` is the
/// connection token's `info` claim.
#[derive(Serialize)]
pub struct PublisherWire<'a> {
    /// User id.
    pub user: &'a str,
    /// Client id.
    pub client: &'a str,
    /// The token's `info` claim, when it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<&'a RawValue>,
}

impl<'a> From<&'a ClientInfo> for PublisherWire<'a> {
    fn from(i: &'a ClientInfo) -> Self {
        PublisherWire {
            user: &i.user,
            client: &i.client,
            info: i.info.as_deref(),
        }
    }
}

impl<'a> From<&'a Publication> for PublicationWire<'a> {
    fn from(p: &'a Publication) -> Self {
        PublicationWire {
            offset: p.offset,
            data: p.data_raw(),
            info: p.info.as_ref().map(PublisherWire::from),
            tags: (!p.tags.is_empty()).then_some(&p.tags),
        }
    }
}
