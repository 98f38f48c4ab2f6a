//! How a publication is laid out in a NATS message (stored in JetStream and republished to the
//! delivery subject), and how presence changes travel.
//!
//! # Format
//! ```text
//! HPUB herald.h.chat=3Aroom 81 103
//! NATS/1.0
//! Herald-Epoch: 9f1c2b3a4d5e6f70
//! Herald-Offset: 42
//! Herald-Prev: 1187                       stream sequence of offset 41 on this subject (0: none)
//! Herald-Info: 30                         publisher info: the first 30 payload bytes (optional)
//! Nats-Expected-Last-Subject-Sequence: 1187
//!
//! {"user":"alice","client":"c1"}{"text":"hi"}
//! ```
//! The payload is the publisher's info as JSON followed by the data's raw JSON, so that neither
//! is ever re-encoded, and `info` may hold any JSON (even with newlines), which a header could
//! not. Offset 0 is an epoch marker: it fixes a channel's epoch before its first publication
//! (see `publish.rs`) and is never delivered.
//!
//! A presence change is a core NATS message on the delivery subject with a `Herald-Presence:
//! join|leave` header and the client's info as JSON payload.

use async_nats::HeaderMap;
use bytes::{BufMut, Bytes, BytesMut};
use herald_protocol::{ClientInfo, Publication};

pub(crate) const EPOCH: &str = "Herald-Epoch";
pub(crate) const OFFSET: &str = "Herald-Offset";
pub(crate) const PREV: &str = "Herald-Prev";
pub(crate) const INFO_LEN: &str = "Herald-Info";
pub(crate) const PRESENCE: &str = "Herald-Presence";
/// Marks a presence record as removed (the record itself expires later).
pub(crate) const GONE: &str = "Herald-Gone";
pub(crate) const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
pub(crate) const MSG_ID: &str = "Nats-Msg-Id";

/// One stored publication as read back from a message's headers and payload.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) epoch: String,
    pub(crate) offset: u64,
    /// Stream sequence of the previous publication on the same subject (0: none).
    pub(crate) prev: u64,
    pub(crate) data: Bytes,
    pub(crate) info: Option<ClientInfo>,
}

impl Stored {
    pub(crate) fn into_publication(self) -> Publication {
        Publication {
            offset: self.offset,
            data: self.data,
            info: self.info,
        }
    }
}

/// Headers and payload of a publication to store.
pub(crate) fn encode_publication(
    epoch: &str,
    offset: u64,
    prev: u64,
    data: &Bytes,
    info: Option<&ClientInfo>,
) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(EPOCH, epoch);
    headers.insert(OFFSET, offset.to_string());
    headers.insert(PREV, prev.to_string());
    headers.insert(EXPECTED_LAST_SUBJECT_SEQ, prev.to_string());
    let payload = match info {
        None => data.clone(),
        Some(info) => {
            let info = serde_json::to_vec(info).unwrap_or_else(|_| b"{}".to_vec());
            headers.insert(INFO_LEN, info.len().to_string());
            let mut buf = BytesMut::with_capacity(info.len() + data.len());
            buf.put_slice(&info);
            buf.put_slice(data);
            buf.freeze()
        }
    };
    (headers, payload)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    header(headers, name).and_then(|v| v.trim().parse().ok())
}

/// Read a stored publication back. `None` when the message is not one of ours.
pub(crate) fn decode_publication(headers: &HeaderMap, payload: &Bytes) -> Option<Stored> {
    let epoch = header(headers, EPOCH)?.to_owned();
    let offset = header_u64(headers, OFFSET)?;
    let prev = header_u64(headers, PREV).unwrap_or(0);
    let (info, data) = match header_u64(headers, INFO_LEN) {
        None => (None, payload.clone()),
        Some(len) => {
            let len = usize::try_from(len).ok().filter(|l| *l <= payload.len())?;
            let info: ClientInfo = serde_json::from_slice(&payload[..len]).ok()?;
            (Some(info), payload.slice(len..))
        }
    };
    Some(Stored {
        epoch,
        offset,
        prev,
        data,
        info,
    })
}

/// Headers and payload of a presence change.
pub(crate) fn encode_presence_change(joined: bool, who: &ClientInfo) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(PRESENCE, if joined { "join" } else { "leave" });
    let payload = serde_json::to_vec(who).unwrap_or_default();
    (headers, Bytes::from(payload))
}

/// What arrived on a delivery subject.
pub(crate) enum Delivery {
    /// A stored publication (offset ≥ 1).
    Publication(Stored),
    /// An epoch marker: nothing to deliver.
    Marker,
    /// A client joined (`true`) or left.
    Presence(bool, ClientInfo),
    /// Not ours or malformed.
    Unknown,
}

/// Classify a message received on a delivery subject.
pub(crate) fn decode_delivery(headers: Option<&HeaderMap>, payload: &Bytes) -> Delivery {
    let Some(headers) = headers else {
        return Delivery::Unknown;
    };
    if let Some(kind) = header(headers, PRESENCE) {
        return match serde_json::from_slice::<ClientInfo>(payload) {
            Ok(who) => Delivery::Presence(kind == "join", who),
            Err(_) => Delivery::Unknown,
        };
    }
    match decode_publication(headers, payload) {
        Some(stored) if stored.offset == 0 => Delivery::Marker,
        Some(stored) => Delivery::Publication(stored),
        None => Delivery::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> ClientInfo {
        ClientInfo {
            user: "alice".into(),
            client: "c1".into(),
            info: Some(serde_json::value::RawValue::from_string("{\n \"a\": 1}".into()).unwrap()),
        }
    }

    #[test]
    fn publication_round_trips_with_and_without_info() {
        let data = Bytes::from_static(br#"{"text":"hi"}"#);
        let (h, p) = encode_publication("ep", 42, 7, &data, Some(&who()));
        let s = decode_publication(&h, &p).unwrap();
        assert_eq!((s.epoch.as_str(), s.offset, s.prev), ("ep", 42, 7));
        assert_eq!(s.data, data);
        assert_eq!(s.info, Some(who()));

        let (h, p) = encode_publication("ep", 1, 0, &data, None);
        let s = decode_publication(&h, &p).unwrap();
        assert_eq!((s.offset, s.info), (1, None));
        assert_eq!(s.data, data);
    }

    #[test]
    fn markers_presence_and_strangers_are_told_apart() {
        let (h, p) = encode_publication("ep", 0, 0, &Bytes::new(), None);
        assert!(matches!(decode_delivery(Some(&h), &p), Delivery::Marker));
        let (h, p) = encode_presence_change(false, &who());
        assert!(
            matches!(decode_delivery(Some(&h), &p), Delivery::Presence(false, w) if w == who())
        );
        assert!(matches!(decode_delivery(None, &p), Delivery::Unknown));
        let mut h = HeaderMap::new();
        h.insert(EPOCH, "ep");
        h.insert(OFFSET, "3");
        h.insert(INFO_LEN, "999");
        assert!(matches!(
            decode_delivery(Some(&h), &Bytes::from_static(b"{}")),
            Delivery::Unknown
        ));
    }
}
