//! How publications are laid out in a NATS message (stored in JetStream and republished to the
//! delivery subject), and how presence changes travel.
//!
//! # Format
//! One stored message holds one publication, or several consecutive ones of the same channel
//! when they were queued behind each other (group commit, see `publish.rs`).
//! ```text
//! HPUB herald.h.chat=3Aroom 81 103
//! NATS/1.0
//! Herald-Epoch: 9f1c2b3a4d5e6f70
//! Herald-Offset: 42                       offset of the (first) publication
//! Herald-Prev: 1187                       stream sequence of the previous message on this subject
//! Herald-Boot: 5b0e77c2a9d13f48           the boot id it was stored under (see `boot.rs`)
//! Herald-Info: 30                         one publication: its info is the first 30 payload bytes
//! Nats-Expected-Last-Subject-Sequence: 1187
//!
//! {"user":"alice","client":"c1"}{"text":"hi"}
//! ```
//! Several publications: `Herald-Count: 3` and `Herald-Sizes: 30:14,0:9,0:11` (info and data
//! length of each, in order), the payload being each one's info then data, back to back.
//!
//! Info and data are stored as their raw JSON, never re-encoded, and `info` may hold any JSON (even
//! with newlines), which a header could not. Offset 0 with no publication is an epoch marker: it
//! fixes a channel's epoch before its first publication and is never delivered.
//!
//! A presence change is a core NATS message on the delivery subject with a `Herald-Presence:
//! join|leave` header and the client's info as JSON payload.

use std::fmt::Write;

use async_nats::HeaderMap;
use bytes::{BufMut, Bytes, BytesMut};
use herald_protocol::{ClientInfo, Publication};

pub(crate) const EPOCH: &str = "Herald-Epoch";
pub(crate) const OFFSET: &str = "Herald-Offset";
pub(crate) const PREV: &str = "Herald-Prev";
/// The boot id a message was stored under; absent with `synchronous_persistence`.
pub(crate) const BOOT: &str = "Herald-Boot";
pub(crate) const INFO_LEN: &str = "Herald-Info";
pub(crate) const COUNT: &str = "Herald-Count";
pub(crate) const SIZES: &str = "Herald-Sizes";
pub(crate) const PRESENCE: &str = "Herald-Presence";
/// Marks a presence record as removed (the record itself expires later).
pub(crate) const GONE: &str = "Herald-Gone";
pub(crate) const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
pub(crate) const MSG_ID: &str = "Nats-Msg-Id";

/// One stored message as read back: an epoch marker or a run of consecutive publications.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) epoch: String,
    /// Offset of the first publication (0 for a marker).
    pub(crate) first: u64,
    /// Stream sequence of the previous message on the same subject (0: none).
    pub(crate) prev: u64,
    /// The boot id it was stored under (empty: none).
    pub(crate) boot: String,
    /// In offset order; empty for a marker.
    pub(crate) publications: Vec<Publication>,
}

impl Stored {
    /// Offset of the last publication (0 for a marker).
    pub(crate) fn last(&self) -> u64 {
        match self.publications.last() {
            Some(p) => p.offset,
            None => self.first.saturating_sub(1),
        }
    }

    /// An epoch marker stored under `boot`.
    pub(crate) fn marker(epoch: String, boot: String) -> Self {
        Stored {
            epoch,
            first: 0,
            prev: 0,
            boot,
            publications: Vec::new(),
        }
    }
}

fn info_json(info: Option<&ClientInfo>) -> Vec<u8> {
    info.map(|i| serde_json::to_vec(i).unwrap_or_else(|_| b"{}".to_vec()))
        .unwrap_or_default()
}

/// Headers and payload of a message holding `items` (data, info) as offsets `first`, `first + 1`,
/// …, stamped with the boot id `boot` (none when empty); no items: an epoch marker (offset 0), or,
/// with `first` above 0, the position `first - 1` without publications.
pub(crate) fn encode_publications(
    epoch: &str,
    boot: &str,
    first: u64,
    prev: u64,
    items: &[(&Bytes, Option<&ClientInfo>)],
) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(EPOCH, epoch);
    headers.insert(OFFSET, first.to_string());
    headers.insert(PREV, prev.to_string());
    headers.insert(EXPECTED_LAST_SUBJECT_SEQ, prev.to_string());
    if !boot.is_empty() {
        headers.insert(BOOT, boot);
    }
    if items.is_empty() && first > 0 {
        // A position without publications (history removed, see `admin.rs`): `Herald-Count: 0`
        // tells it from a single publication.
        headers.insert(COUNT, "0");
    }
    let payload = match items {
        [] => Bytes::new(),
        [(data, None)] => (*data).clone(),
        [(data, Some(info))] => {
            let info = info_json(Some(info));
            headers.insert(INFO_LEN, info.len().to_string());
            let mut buf = BytesMut::with_capacity(info.len() + data.len());
            buf.put_slice(&info);
            buf.put_slice(data);
            buf.freeze()
        }
        many => {
            let mut sizes = String::with_capacity(many.len() * 8);
            let mut buf = BytesMut::new();
            for (i, (data, info)) in many.iter().enumerate() {
                let info = info_json(*info);
                if i > 0 {
                    sizes.push(',');
                }
                let _ = write!(sizes, "{}:{}", info.len(), data.len());
                buf.put_slice(&info);
                buf.put_slice(data);
            }
            headers.insert(COUNT, many.len().to_string());
            headers.insert(SIZES, sizes);
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

fn client_info(bytes: &[u8]) -> Option<Option<ClientInfo>> {
    if bytes.is_empty() {
        return Some(None);
    }
    serde_json::from_slice(bytes).ok().map(Some)
}

/// Read a stored message back. `None` when it is not one of ours or is malformed.
pub(crate) fn decode_publications(headers: &HeaderMap, payload: &Bytes) -> Option<Stored> {
    let epoch = header(headers, EPOCH)?.to_owned();
    let first = header_u64(headers, OFFSET)?;
    let prev = header_u64(headers, PREV).unwrap_or(0);
    let boot = header(headers, BOOT).unwrap_or_default().to_owned();
    let mut publications = Vec::new();
    if first == 0 {
        return Some(Stored::marker(epoch, boot));
    }
    if header(headers, SIZES).is_none() && header_u64(headers, COUNT) == Some(0) {
        return Some(Stored {
            epoch,
            first,
            prev,
            boot,
            publications,
        });
    }
    match header(headers, SIZES) {
        None => {
            let (info, data) = match header_u64(headers, INFO_LEN) {
                None => (None, payload.clone()),
                Some(len) => {
                    let len = usize::try_from(len).ok().filter(|l| *l <= payload.len())?;
                    (client_info(&payload[..len])?, payload.slice(len..))
                }
            };
            publications.push(Publication {
                offset: first,
                data,
                info,
            });
        }
        Some(sizes) => {
            let mut at = 0usize;
            for (i, size) in sizes.split(',').enumerate() {
                let (info_len, data_len) = size.split_once(':')?;
                let info_len: usize = info_len.parse().ok()?;
                let data_len: usize = data_len.parse().ok()?;
                let info_end = at.checked_add(info_len)?;
                let data_end = info_end.checked_add(data_len)?;
                if data_end > payload.len() {
                    return None;
                }
                publications.push(Publication {
                    offset: first + i as u64,
                    data: payload.slice(info_end..data_end),
                    info: client_info(&payload[at..info_end])?,
                });
                at = data_end;
            }
            if header_u64(headers, COUNT) != Some(publications.len() as u64) {
                return None;
            }
        }
    }
    Some(Stored {
        epoch,
        first,
        prev,
        boot,
        publications,
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
    /// Stored publications (at least one), in offset order.
    Publications(Stored),
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
    match decode_publications(headers, payload) {
        Some(stored) if stored.publications.is_empty() => Delivery::Marker,
        Some(stored) => Delivery::Publications(stored),
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
    fn one_publication_round_trips_with_and_without_info() {
        let data = Bytes::from_static(br#"{"text":"hi"}"#);
        let (h, p) = encode_publications("ep", "b1", 42, 7, &[(&data, Some(&who()))]);
        let s = decode_publications(&h, &p).unwrap();
        assert_eq!(
            (s.epoch.as_str(), s.boot.as_str(), s.first, s.prev, s.last()),
            ("ep", "b1", 42, 7, 42)
        );
        assert_eq!(s.publications[0].data, data);
        assert_eq!(s.publications[0].info, Some(who()));

        let (h, p) = encode_publications("ep", "", 1, 0, &[(&data, None)]);
        let s = decode_publications(&h, &p).unwrap();
        assert_eq!(s.boot, "", "no boot id: no stamp");
        assert!(h.get(BOOT).is_none());
        assert_eq!(s.publications.len(), 1);
        assert_eq!(
            (s.publications[0].offset, s.publications[0].info.clone()),
            (1, None)
        );
        assert_eq!(s.publications[0].data, data);
    }

    #[test]
    fn several_publications_round_trip_in_order() {
        let (a, b, c) = (
            Bytes::from_static(b"1"),
            Bytes::from_static(br#"{"x":[2]}"#),
            Bytes::from_static(b"\"three\""),
        );
        let w = who();
        let (h, p) = encode_publications(
            "ep",
            "b1",
            10,
            3,
            &[(&a, Some(&w)), (&b, None), (&c, Some(&w))],
        );
        let s = decode_publications(&h, &p).unwrap();
        let offsets: Vec<u64> = s.publications.iter().map(|p| p.offset).collect();
        assert_eq!(offsets, vec![10, 11, 12]);
        assert_eq!(s.last(), 12);
        assert_eq!(s.publications[1].data, b);
        assert_eq!(s.publications[1].info, None);
        assert_eq!(s.publications[2].data, c);
        assert_eq!(s.publications[2].info, Some(w));
    }

    #[test]
    fn a_position_without_publications_round_trips() {
        let (h, p) = encode_publications("ep", "b1", 8, 41, &[]);
        let s = decode_publications(&h, &p).unwrap();
        assert!(s.publications.is_empty());
        assert_eq!((s.last(), s.prev, s.epoch.as_str()), (7, 41, "ep"));
        assert!(matches!(decode_delivery(Some(&h), &p), Delivery::Marker));
    }

    #[test]
    fn markers_presence_and_strangers_are_told_apart() {
        let (h, p) = encode_publications("ep", "b1", 0, 0, &[]);
        assert!(matches!(decode_delivery(Some(&h), &p), Delivery::Marker));
        let marker = decode_publications(&h, &p).unwrap();
        assert_eq!((marker.first, marker.last()), (0, 0));
        assert_eq!(marker.boot, "b1", "a marker is stamped too");
        let (h, p) = encode_presence_change(false, &who());
        assert!(
            matches!(decode_delivery(Some(&h), &p), Delivery::Presence(false, w) if w == who())
        );
        assert!(matches!(decode_delivery(None, &p), Delivery::Unknown));
        let mut h = HeaderMap::new();
        h.insert(EPOCH, "ep");
        h.insert(OFFSET, "3");
        h.insert(INFO_LEN, "999");
        let junk = Bytes::from_static(b"{}");
        assert!(matches!(
            decode_delivery(Some(&h), &junk),
            Delivery::Unknown
        ));
        h.insert(SIZES, "0:1,0:5");
        h.insert(COUNT, "2");
        assert!(
            matches!(decode_delivery(Some(&h), &junk), Delivery::Unknown),
            "sizes beyond payload"
        );
    }

    // Fuzz harness (`scripts/fuzz.sh` runs it longer): a message on a delivery subject or in a
    // stream that another program wrote (any headers, any payload) is classified or dropped,
    // never a panic; what the node writes reads back the same.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        const NAMES: &[&str] = &[
            EPOCH, OFFSET, PREV, BOOT, SIZES, INFO_LEN, COUNT, PRESENCE, GONE, "X-Other",
        ];

        fn headers() -> impl Strategy<Value = HeaderMap> {
            proptest::collection::vec(
                (
                    proptest::sample::select(NAMES),
                    prop_oneof!["[0-9]{0,20}", "[0-9, ]{0,40}", "[ -~]{0,30}"],
                ),
                0..7,
            )
            .prop_map(|pairs| {
                let mut h = HeaderMap::new();
                for (name, value) in pairs {
                    h.insert(name, value.as_str());
                }
                h
            })
        }

        proptest! {
            #[test]
            fn any_message_is_classified_or_dropped(
                h in headers(),
                payload in proptest::collection::vec(any::<u8>(), 0..200),
            ) {
                let payload = Bytes::from(payload);
                let _ = decode_delivery(Some(&h), &payload);
                let _ = decode_publications(&h, &payload);
            }

            #[test]
            fn written_batches_read_back(
                epoch in "[0-9a-f]{16}",
                first in 1u64..u64::MAX / 2,
                datas in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..6),
                with_info in any::<bool>(),
            ) {
                let datas: Vec<Bytes> = datas.into_iter().map(Bytes::from).collect();
                let info = super::who();
                let items: Vec<(&Bytes, Option<&ClientInfo>)> = datas
                    .iter()
                    .map(|d| (d, with_info.then_some(&info)))
                    .collect();
                let (h, p) = encode_publications(&epoch, "b", first, first - 1, &items);
                let stored = decode_publications(&h, &p).expect("reads back");
                prop_assert_eq!(stored.publications.len(), datas.len());
                for (got, want) in stored.publications.iter().zip(&datas) {
                    prop_assert_eq!(&got.data, want);
                }
            }
        }
    }
}
