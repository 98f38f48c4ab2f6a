//! The newest stream position a node has seen per channel, so that a broker that comes back
//! *behind* is noticed.
//!
//! A broker restored from an older snapshot (Redis restarted from its last RDB after `kill -9`,
//! AOF `everysec` after an OS crash, a failover to a lagging replica, a NATS file store after a
//! crash) still holds the channel's epoch but an older top offset. Offsets it assigns next would
//! repeat ones that subscribers already received, in the same epoch: later subscribers would drop
//! them as duplicates and a client holding a position past the old top would be told
//! `recovered: true` without them. So every stream write and read passes the node's watermark to
//! the broker, which starts the stream over with a new epoch when its top is below it (every
//! client is then told plainly that it cannot recover).
//!
//! Only what this node saw since it started is known: a stream that no running node published
//! to, read or received since its rollback is not caught (see `docs/reliability.md`).

use std::collections::HashMap;
use std::sync::Mutex;

/// Channels remembered at most; past this the map starts over (detection weakens, memory stays
/// bounded).
const MAX_CHANNELS: usize = 100_000;

/// Channel → (epoch, newest offset).
type Marks = HashMap<Box<str>, (Box<str>, u64)>;

/// The watermarks of one node. See the module docs.
#[derive(Default)]
pub struct Watermarks {
    map: Mutex<Marks>,
}

impl Watermarks {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The broker reported (or delivered) `offset` in `epoch` for `channel`.
    pub fn observe(&self, channel: &str, epoch: &str, offset: u64) {
        let mut map = self.map.lock().expect("watermarks lock");
        if let Some((e, o)) = map.get_mut(channel) {
            if **e == *epoch {
                *o = (*o).max(offset);
            } else {
                *e = epoch.into();
                *o = offset;
            }
            return;
        }
        if map.len() >= MAX_CHANNELS {
            map.clear();
        }
        map.insert(channel.into(), (epoch.into(), offset));
    }

    /// The newest position seen for `channel`: `(epoch, offset)`, or `("", 0)` when none.
    pub fn floor(&self, channel: &str) -> (String, u64) {
        let map = self.map.lock().expect("watermarks lock");
        map.get(channel)
            .map(|(e, o)| (e.to_string(), *o))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_highest_offset_of_the_latest_epoch() {
        let w = Watermarks::new();
        assert_eq!(w.floor("c"), (String::new(), 0));
        w.observe("c", "e1", 5);
        w.observe("c", "e1", 3);
        assert_eq!(w.floor("c"), ("e1".to_string(), 5));
        w.observe("c", "e2", 1);
        assert_eq!(w.floor("c"), ("e2".to_string(), 1));
    }
}
