//! Redis names of a channel's keys and pub/sub channel, and the slot and shard a channel lives on.
//!
//! Every name of a channel holds the channel in a hash tag, `herald:{chat:room1}:h`, so that on a
//! Cluster its history, its metadata, its presence and its sharded pub/sub channel share one slot:
//! the publish script touches them atomically on the shard that owns the slot, and `SPUBLISH` keeps
//! the message on that shard. Channel names cannot contain `{` or `}` (docs/protocol.md).

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
    /// The pub/sub channel nodes hosting the channel subscribe to.
    pub(crate) pubsub: String,
}

/// The keys of one part of a channel's presence; they share one hash tag.
#[derive(Debug, Clone)]
pub(crate) struct PresenceKeys {
    /// The hash tag, which also picks the standalone shard.
    pub(crate) tag: String,
    /// Hash client id → ClientInfo JSON.
    pub(crate) entries: String,
    /// Sorted set client id → expiry (ms since the epoch).
    pub(crate) expiry: String,
    /// Sorted set of client ids, all scored 0, so that pages are read in id order (`ZRANGEBYLEX`).
    pub(crate) order: String,
    /// Hash user → how many of the user's clients are present, so that counts cost no list.
    pub(crate) users: String,
}

/// The presence part that holds `user`'s clients: all of a user's clients share one part, so
/// the distinct users of a channel are the sum of each part's.
pub(crate) fn presence_part(user: &str, parts: usize) -> usize {
    match parts {
        0 | 1 => 0,
        _ => crc16(user.as_bytes()) as usize % parts,
    }
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
            pubsub: format!("{p}:{{{channel}}}:p"),
        }
    }

    /// The keys of part `part` of `parts` of a channel's presence. With one part they share the
    /// channel's hash tag (`{chat:room}`); with more, each part has its own (`{chat:room|3}`: a
    /// channel name never holds `|`, so no channel's tag is ever a part's).
    pub(crate) fn presence(&self, channel: &str, part: usize, parts: usize) -> PresenceKeys {
        let p = &self.prefix;
        let tag = match parts {
            0 | 1 => channel.to_owned(),
            _ => format!("{channel}|{part}"),
        };
        PresenceKeys {
            entries: format!("{p}:{{{tag}}}:pr"),
            expiry: format!("{p}:{{{tag}}}:pe"),
            order: format!("{p}:{{{tag}}}:po"),
            users: format!("{p}:{{{tag}}}:pu"),
            tag,
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

    /// The key prefix (`key_prefix`).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Herald channel of a history key name, if it is one of ours.
    pub(crate) fn channel_of_history<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix("}:h")
            .filter(|c| !c.contains(['{', '}']))
    }

    /// The Herald channel of a pub/sub channel name, if it is one of ours.
    pub(crate) fn channel_of<'a>(&self, pubsub: &'a str) -> Option<&'a str> {
        pubsub
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix("}:p")
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
        let pk = n.presence("chat:room#a,b", 0, 1);
        for key in [
            &k.history,
            &pk.entries,
            &pk.expiry,
            &pk.order,
            &pk.users,
            &k.pubsub,
        ] {
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
}
