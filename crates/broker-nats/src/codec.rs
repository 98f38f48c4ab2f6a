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
//! Herald-Info: 30                         one publication: its info (and tags, see
//!                                         `herald_broker::meta`) is the first 30 payload bytes
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
//! A sampled publication (tracing) adds `traceparent: 00-…-01`, the W3C trace context of the
//! publishing node's broker span; in a message of several, `Herald-Traced: <i>` says which one it
//! belongs to (counted from 0; absent: the first), and only the first traced one carries its
//! context.
//!
//! A presence change is a core NATS message on the delivery subject with a `Herald-Presence:
//! join|leave` header and the client's info as JSON payload.

use std::fmt::Write;

use async_nats::HeaderMap;
use bytes::{BufMut, Bytes, BytesMut};
use herald_protocol::tags::Tags;
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
/// Marks a publication kept out of history (`skip_history`): sent on the delivery subject only,
/// never stored, delivered with offset 0.
pub(crate) const UNSTORED: &str = "Herald-Unstored";
/// Marks a presence record as removed (the record itself expires later).
pub(crate) const GONE: &str = "Herald-Gone";
pub(crate) const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
pub(crate) const MSG_ID: &str = "Nats-Msg-Id";
/// The W3C trace context of a sampled publication (see [`traced_publication`]).
pub(crate) const TRACEPARENT: &str = "traceparent";
/// Which publication of the message `traceparent` belongs to, counted from 0; absent: the first.
pub(crate) const TRACED: &str = "Herald-Traced";

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

/// The info slot: the publisher's info and the tags (see [`herald_broker::meta`]).
fn info_json(info: Option<&ClientInfo>, tags: &Tags) -> Vec<u8> {
    herald_broker::meta::encode_meta(info, tags)
}

/// One publication to store: its data, publisher info and tags.
pub(crate) type Item<'a> = (&'a Bytes, Option<&'a ClientInfo>, &'a Tags);

/// Headers and payload of a message holding `items` (data, info) as offsets `first`, `first + 1`,
/// …, stamped with the boot id `boot` (none when empty); no items: an epoch marker (offset 0), or,
/// with `first` above 0, the position `first - 1` without publications.
pub(crate) fn encode_publications(
    epoch: &str,
    boot: &str,
    first: u64,
    prev: u64,
    items: &[Item<'_>],
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
        [(data, None, tags)] if tags.is_empty() => (*data).clone(),
        [(data, info, tags)] => {
            let info = info_json(*info, tags);
            headers.insert(INFO_LEN, info.len().to_string());
            let mut buf = BytesMut::with_capacity(info.len() + data.len());
            buf.put_slice(&info);
            buf.put_slice(data);
            buf.freeze()
        }
        many => {
            let mut sizes = String::with_capacity(many.len() * 8);
            let mut buf = BytesMut::new();
            for (i, (data, info, tags)) in many.iter().enumerate() {
                let info = info_json(*info, tags);
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

fn client_info(bytes: &[u8]) -> Option<(Option<ClientInfo>, Tags)> {
    herald_broker::meta::decode_meta(bytes)
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
            let ((info, tags), data) = match header_u64(headers, INFO_LEN) {
                None => ((None, Tags::new()), payload.clone()),
                Some(len) => {
                    let len = usize::try_from(len).ok().filter(|l| *l <= payload.len())?;
                    (client_info(&payload[..len])?, payload.slice(len..))
                }
            };
            publications.push(Publication {
                offset: first,
                data,
                info,
                tags,
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
                let (info, tags) = client_info(&payload[at..info_end])?;
                publications.push(Publication {
                    offset: first + i as u64,
                    data: payload.slice(info_end..data_end),
                    info,
                    tags,
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

/// Headers and payload of a publication kept out of history (`skip_history`): a core NATS
/// message on the delivery subject, `Herald-Unstored: 1`, its info and tags first as in a stored
/// message (`Herald-Info` bytes), then the data.
pub(crate) fn encode_unstored(
    data: &Bytes,
    info: Option<&ClientInfo>,
    tags: &Tags,
) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(UNSTORED, "1");
    let meta = info_json(info, tags);
    if meta.is_empty() {
        return (headers, data.clone());
    }
    headers.insert(INFO_LEN, meta.len().to_string());
    let mut buf = BytesMut::with_capacity(meta.len() + data.len());
    buf.put_slice(&meta);
    buf.put_slice(data);
    (headers, buf.freeze())
}

fn decode_unstored(headers: &HeaderMap, payload: &Bytes) -> Option<Publication> {
    let len = match header_u64(headers, INFO_LEN) {
        None => 0,
        Some(len) => usize::try_from(len).ok().filter(|l| *l <= payload.len())?,
    };
    let (info, tags) = client_info(&payload[..len])?;
    Some(Publication {
        offset: 0,
        data: payload.slice(len..),
        info,
        tags,
    })
}

/// The traced publication of a delivered message: its offset and `traceparent`. A message
/// carries at most one (that of its first traced publication); nodes of an earlier version ignore
/// both headers and deliver it as any other.
pub(crate) fn traced_publication(headers: Option<&HeaderMap>) -> Option<(u64, &str)> {
    let headers = headers?;
    let traceparent = header(headers, TRACEPARENT)?;
    let first = header_u64(headers, OFFSET)?;
    let index = header_u64(headers, TRACED).unwrap_or(0);
    Some((first.checked_add(index)?, traceparent))
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
    /// A publication kept out of history: offset 0, live only.
    Unstored(Publication),
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
    if header(headers, UNSTORED).is_some() {
        return match decode_unstored(headers, payload) {
            Some(p) => Delivery::Unstored(p),
            None => Delivery::Unknown,
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
        let (h, p) = encode_publications("ep", "b1", 42, 7, &[(&data, Some(&who()), &Tags::new())]);
        let s = decode_publications(&h, &p).unwrap();
        assert_eq!(
            (s.epoch.as_str(), s.boot.as_str(), s.first, s.prev, s.last()),
            ("ep", "b1", 42, 7, 42)
        );
        assert_eq!(s.publications[0].data, data);
        assert_eq!(s.publications[0].info, Some(who()));

        let (h, p) = encode_publications("ep", "", 1, 0, &[(&data, None, &Tags::new())]);
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
    fn the_traced_publication_is_named_by_its_offset() {
        let data = Bytes::from_static(b"1");
        let none = Tags::new();
        let (mut h, _) = encode_publications(
            "ep",
            "",
            42,
            7,
            &[(&data, None, &none), (&data, None, &none)],
        );
        assert_eq!(traced_publication(Some(&h)), None, "untraced");
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        h.insert(TRACEPARENT, tp);
        assert_eq!(traced_publication(Some(&h)), Some((42, tp)));
        h.insert(TRACED, "1");
        assert_eq!(traced_publication(Some(&h)), Some((43, tp)));
        assert_eq!(traced_publication(None), None);
    }

    #[test]
    fn several_publications_round_trip_in_order() {
        let (a, b, c) = (
            Bytes::from_static(b"1"),
            Bytes::from_static(br#"{"x":[2]}"#),
            Bytes::from_static(b"\"three\""),
        );
        let w = who();
        let tags: Tags = [("kind".to_string(), "goal".to_string())].into();
        let none = Tags::new();
        let (h, p) = encode_publications(
            "ep",
            "b1",
            10,
            3,
            &[
                (&a, Some(&w), &none),
                (&b, None, &tags),
                (&c, Some(&w), &tags),
            ],
        );
        let s = decode_publications(&h, &p).unwrap();
        let offsets: Vec<u64> = s.publications.iter().map(|p| p.offset).collect();
        assert_eq!(offsets, vec![10, 11, 12]);
        assert_eq!(s.last(), 12);
        assert_eq!(s.publications[1].data, b);
        assert_eq!(s.publications[1].info, None);
        assert_eq!(s.publications[2].data, c);
        assert_eq!(s.publications[2].info, Some(w));
        let got: Vec<&Tags> = s.publications.iter().map(|p| &p.tags).collect();
        assert_eq!(got, vec![&none, &tags, &tags]);
        // One publication with tags and no info carries them too.
        let (h, p) = encode_publications("ep", "", 1, 0, &[(&b, None, &tags)]);
        let one = decode_publications(&h, &p).unwrap();
        assert_eq!(
            (&one.publications[0].tags, &one.publications[0].data),
            (&tags, &b)
        );
    }

    #[test]
    fn an_unstored_publication_round_trips_as_offset_0() {
        let data = Bytes::from_static(br#"{"typing":true}"#);
        let tags: Tags = [("k".to_string(), "v".to_string())].into();
        for (info, tags) in [(None, Tags::new()), (Some(who()), tags)] {
            let (h, p) = encode_unstored(&data, info.as_ref(), &tags);
            let Delivery::Unstored(got) = decode_delivery(Some(&h), &p) else {
                panic!("not an unstored publication");
            };
            assert_eq!(
                (got.offset, &got.data, &got.info, &got.tags),
                (0, &data, &info, &tags)
            );
        }
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
                let none = Tags::new();
                let items: Vec<Item> = datas
                    .iter()
                    .map(|d| (d, with_info.then_some(&info), &none))
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
