//! How publications and presence changes are laid out in a Redis pub/sub message: written by the
//! publish script (`scripts`) and [`encode_presence`], read by [`decode`] on the receiving side.

use bytes::Bytes;
use herald_protocol::{ClientInfo, Publication};

/// A message received on a channel's pub/sub channel.
#[derive(Debug, PartialEq)]
pub(crate) enum Envelope {
    /// A publication with the stream's epoch.
    Publication {
        epoch: String,
        publication: Publication,
        /// The publishing span's W3C `traceparent`, for a publication tracing sampled.
        traceparent: Option<String>,
    },
    /// A client joined (`true`) or left.
    Presence { joined: bool, who: ClientInfo },
}

/// Encode a presence change: `j <ClientInfo JSON>` or `l <ClientInfo JSON>`.
pub(crate) fn encode_presence(joined: bool, who: &ClientInfo) -> Vec<u8> {
    let mut out = if joined {
        b"j ".to_vec()
    } else {
        b"l ".to_vec()
    };
    serde_json::to_writer(&mut out, who).expect("ClientInfo serializes");
    out
}

/// Decode what the publish script or [`encode_presence`] sent.
///
/// # Format
/// ```text
/// p <epoch> <offset> <info length> <info JSON><data JSON>
/// p 9f3ac2e1d0b4a577 44 36 t{"kind":"goal"}\n{"user":"a","client":"c"}{"text":"hi"}
/// p 9f3ac2e1d0b4a577 42 0 {"text":"hi"}
/// p,00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 9f3ac2e1d0b4a577 43 0 {"text":"hi"}
/// j {"user":"alice","client":"c1"}
/// ```
/// The info slot holds the publisher's info and the publication's tags as
/// [`herald_broker::meta`] encodes them. The publication's data is the bytes after it, exactly as
/// published. A traced
/// publication's first field carries its `traceparent` after `p,`: nodes that predate tracing
/// read only the first byte of that field, so they deliver it as any other.
pub(crate) fn decode(payload: Bytes) -> Option<Envelope> {
    match payload.first()? {
        b'p' => {
            let mut fields = payload.splitn(5, |b| *b == b' ');
            let traceparent = match fields.next()?.strip_prefix(b"p,") {
                Some(tp) if !tp.is_empty() => Some(std::str::from_utf8(tp).ok()?.to_owned()),
                _ => None,
            };
            let epoch = std::str::from_utf8(fields.next()?).ok()?.to_owned();
            let offset: u64 = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
            let info_len: usize = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
            let rest_len = fields.next()?.len();
            let rest_start = payload.len() - rest_len;
            if info_len > rest_len {
                return None;
            }
            let (info, tags) =
                herald_broker::meta::decode_meta(&payload[rest_start..rest_start + info_len])?;
            let data = payload.slice(rest_start + info_len..);
            Some(Envelope::Publication {
                epoch,
                publication: Publication {
                    offset,
                    data,
                    info,
                    tags,
                },
                traceparent,
            })
        }
        b'j' | b'l' => {
            let who = serde_json::from_slice(payload.get(2..)?).ok()?;
            Some(Envelope::Presence {
                joined: payload[0] == b'j',
                who,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publication_roundtrip() {
        let info = r#"{"user":"u","client":"c"}"#;
        let msg = format!("p abc 7 {} {info}{{\"x\": [1, 2]}}", info.len());
        let Some(Envelope::Publication {
            epoch,
            publication,
            traceparent: None,
        }) = decode(Bytes::from(msg))
        else {
            panic!("not decoded");
        };
        assert_eq!(epoch, "abc");
        assert_eq!(publication.offset, 7);
        assert_eq!(&publication.data[..], br#"{"x": [1, 2]}"#);
        assert_eq!(publication.info.unwrap().client, "c");
        let bare = decode(Bytes::from_static(b"p e 1 0 \"a b\"")).unwrap();
        assert!(matches!(bare, Envelope::Publication { publication, .. }
            if publication.info.is_none() && &publication.data[..] == b"\"a b\""));
        assert!(decode(Bytes::from_static(b"p e x 0 1")).is_none());
        assert!(decode(Bytes::from_static(b"p e 1 99 1")).is_none());
    }

    #[test]
    fn traced_publication_carries_its_traceparent() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let msg = format!("p,{tp} abc 8 0 [1]");
        let Some(Envelope::Publication {
            epoch,
            publication,
            traceparent,
        }) = decode(Bytes::from(msg))
        else {
            panic!("not decoded");
        };
        assert_eq!((epoch.as_str(), publication.offset), ("abc", 8));
        assert_eq!(&publication.data[..], b"[1]");
        assert_eq!(traceparent.as_deref(), Some(tp));
    }

    #[test]
    fn presence_roundtrip() {
        let who = ClientInfo {
            user: "alice".into(),
            client: "c1".into(),
            info: None,
        };
        let got = decode(Bytes::from(encode_presence(false, &who))).unwrap();
        assert_eq!(got, Envelope::Presence { joined: false, who });
    }

    // Fuzz harness (`scripts/fuzz.sh` runs it longer): whatever arrives on a Redis pub/sub
    // channel (another program, a corrupted message) is decoded or dropped, never a panic.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        fn edited(seed: Vec<u8>, edits: Vec<(prop::sample::Index, u8, bool)>) -> Vec<u8> {
            let mut b = seed;
            for (at, byte, insert) in edits {
                let i = at.index(b.len() + 1);
                if insert {
                    b.insert(i, byte);
                } else if i < b.len() {
                    b[i] = byte;
                }
            }
            b
        }

        proptest! {
            #[test]
            fn any_payload_is_decoded_or_dropped(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = decode(Bytes::from(payload));
            }

            #[test]
            fn edited_messages_are_decoded_or_dropped(
                which in 0..3u8,
                edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 0..6),
            ) {
                let seed: Vec<u8> = match which {
                    0 => br#"p 9f3ac2e1d0b4a577 42 29 {"user":"u","client":"c1"}{"text":"hi"}"#.to_vec(),
                    1 => b"p 9f3ac2e1d0b4a577 7 0 [1,2]".to_vec(),
                    _ => br#"j {"user":"alice","client":"c1","info":{"a":1}}"#.to_vec(),
                };
                let _ = decode(Bytes::from(edited(seed, edits)));
            }

            #[test]
            fn header_fields_out_of_range(offset in any::<String>(), len in any::<String>(), rest in ".{0,40}") {
                let _ = decode(Bytes::from(format!("p e {offset} {len} {rest}")));
            }
        }
    }
}
