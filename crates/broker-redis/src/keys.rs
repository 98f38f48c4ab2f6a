//! Redis names of a channel's keys and pub/sub channel, the messages carried on pub/sub, and the
//! slot and shard a channel lives on.
//!
//! Every name of a channel holds the channel in a hash tag, `herald:{chat:room1}:h`, so that on a
//! Cluster its history, its metadata, its presence and its sharded pub/sub channel share one slot:
//! the publish script touches them atomically on the shard that owns the slot, and `SPUBLISH` keeps
//! the message on that shard. Channel names cannot contain `{` or `}` (docs/protocol.md).

use bytes::Bytes;
use herald_protocol::{ClientInfo, Publication};

/// The Redis names of one deployment (one `key_prefix`).
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
    /// The control channel: `herald:control`, the only always-on subscription.
    pub(crate) control: String,
}

/// The keys of one channel.
#[derive(Debug, Clone)]
pub(crate) struct ChannelKeys {
    /// Hash `{e: epoch, o: top offset}`; lives `meta_ttl` after the last publication.
    pub(crate) meta: String,
    /// Stream of publications (`o`, `d`, `i` fields), bounded by `MAXLEN` and `MINID`.
    pub(crate) history: String,
    /// Hash client id → ClientInfo JSON.
    pub(crate) presence: String,
    /// Sorted set client id → expiry (ms since the epoch).
    pub(crate) presence_expiry: String,
    /// The pub/sub channel nodes hosting the channel subscribe to.
    pub(crate) pubsub: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Self {
        Names {
            prefix: prefix.to_owned(),
            control: format!("{prefix}:control"),
        }
    }

    pub(crate) fn channel(&self, channel: &str) -> ChannelKeys {
        let p = &self.prefix;
        ChannelKeys {
            meta: format!("{p}:{{{channel}}}:m"),
            history: format!("{p}:{{{channel}}}:h"),
            presence: format!("{p}:{{{channel}}}:pr"),
            presence_expiry: format!("{p}:{{{channel}}}:pe"),
            pubsub: format!("{p}:{{{channel}}}:p"),
        }
    }

    /// The key that remembers an idempotency key of a channel.
    pub(crate) fn idempotency(&self, channel: &str, key: &str) -> String {
        format!("{}:{{{channel}}}:k:{key}", self.prefix)
    }

    /// The pub/sub channel of a Herald channel.
    pub(crate) fn pubsub(&self, channel: &str) -> String {
        format!("{}:{{{channel}}}:p", self.prefix)
    }

    /// The Herald channel of a pub/sub channel name, if it is one of ours.
    pub(crate) fn channel_of<'a>(&self, pubsub: &'a str) -> Option<&'a str> {
        pubsub
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix("}:p")
    }
}

/// A message received on a channel's pub/sub channel.
#[derive(Debug, PartialEq)]
pub(crate) enum Envelope {
    /// A publication with the stream's epoch.
    Publication {
        epoch: String,
        publication: Publication,
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
/// p 9f3ac2e1d0b4a577 42 0 {"text":"hi"}
/// j {"user":"alice","client":"c1"}
/// ```
/// The publication's data is the bytes after the info, exactly as published.
pub(crate) fn decode(payload: Bytes) -> Option<Envelope> {
    match payload.first()? {
        b'p' => {
            let mut fields = payload.splitn(5, |b| *b == b' ');
            fields.next()?;
            let epoch = std::str::from_utf8(fields.next()?).ok()?.to_owned();
            let offset: u64 = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
            let info_len: usize = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
            let rest_len = fields.next()?.len();
            let rest_start = payload.len() - rest_len;
            if info_len > rest_len {
                return None;
            }
            let info = match info_len {
                0 => None,
                n => Some(serde_json::from_slice(&payload[rest_start..rest_start + n]).ok()?),
            };
            let data = payload.slice(rest_start + info_len..);
            Some(Envelope::Publication {
                epoch,
                publication: Publication { offset, data, info },
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

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Which of `shards` standalone servers owns a channel: jump consistent hash (Lamping & Veach)
/// of the channel's FNV-1a hash. The same on every node; going from N to N+1 shards moves 1/(N+1)
/// of the channels.
pub(crate) fn shard_of(channel: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut key = channel.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let (mut b, mut j) = (-1i64, 0i64);
    while j < shards as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_channel_slot() {
        let n = Names::new("herald");
        let k = n.channel("chat:room#a,b");
        assert_eq!(k.pubsub, "herald:{chat:room#a,b}:p");
        let s = slot(&k.meta);
        for key in [&k.history, &k.presence, &k.presence_expiry, &k.pubsub] {
            assert_eq!(slot(key), s);
        }
        assert_eq!(slot(&n.idempotency("chat:room#a,b", "x")), s);
        assert_eq!(n.channel_of(&k.pubsub), Some("chat:room#a,b"));
        assert_eq!(n.channel_of("other:{x}:p"), None);
        assert_eq!(n.channel_of(&n.control), None);
    }

    #[test]
    fn slot_matches_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("123456789"), 0x31C3);
        assert_eq!(slot("{}x"), slot("{}x"));
    }

    #[test]
    fn publication_roundtrip() {
        let info = r#"{"user":"u","client":"c"}"#;
        let msg = format!("p abc 7 {} {info}{{\"x\": [1, 2]}}", info.len());
        let Some(Envelope::Publication { epoch, publication }) = decode(Bytes::from(msg)) else {
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
    fn presence_roundtrip() {
        let who = ClientInfo {
            user: "alice".into(),
            client: "c1".into(),
            info: None,
        };
        let got = decode(Bytes::from(encode_presence(false, &who))).unwrap();
        assert_eq!(got, Envelope::Presence { joined: false, who });
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            let ch = format!("room{i}");
            let s = shard_of(&ch, 4);
            assert_eq!(s, shard_of(&ch, 4));
            counts[s] += 1;
        }
        assert!(counts.iter().all(|c| *c > 800), "{counts:?}");
        // Growing from 4 to 5 shards moves about a fifth.
        let moved = (0..4000)
            .filter(|i| {
                let ch = format!("room{i}");
                shard_of(&ch, 4) != shard_of(&ch, 5)
            })
            .count();
        assert!(moved < 1100, "{moved}");
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
