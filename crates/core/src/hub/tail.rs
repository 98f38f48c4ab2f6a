//! The tail check: finding a publication lost at the end of a burst by comparing the broker's
//! newest offset with each hosted channel's baseline (see [`super::TAIL_CHECK_EVERY`]).

use super::*;

impl Hub {
    /// One tick of the tail check (see the module docs): channels that delivered since the last
    /// tick, channels whose tail was ahead last time, and every channel of one shard.
    pub(super) async fn check_tails(&self) {
        let sweep = (self.shared.sweep.fetch_add(1, Ordering::Relaxed) as usize) % SHARDS;
        let mut due: Vec<(Arc<str>, StreamOptions)> = Vec::new();
        for (n, shard) in self.shared.shards.iter().enumerate() {
            let mut shard = shard.lock().expect("hub lock");
            for (name, ch) in shard.iter_mut() {
                let wanted = n == sweep || ch.active || ch.tail_ahead.is_some();
                ch.active = false;
                if wanted && ch.last_offset.is_some() && due.len() < TAIL_CHECKS_PER_TICK {
                    due.push((name.clone(), ch.opts.clone()));
                }
            }
        }
        let tops = self.shared.broker.positions(&due).await;
        for ((channel, _), top) in due.iter().zip(tops) {
            // A failed read: the broker is down, and its reconnect triggers a catch-up anyway.
            if let Ok(top) = top {
                self.tail_checked(channel, top);
            }
        }
    }

    /// The broker's newest position for a hosted channel: a gap seen twice in a row (not a
    /// publication still on its way) starts a catch-up; a changed epoch loses the channel.
    pub(super) fn tail_checked(&self, channel: &str, top: StreamPosition) {
        let mut shard = self.shard(channel).lock().expect("hub lock");
        let Some(ch) = shard.get_mut(channel) else {
            return;
        };
        let (Some(epoch), Some(last)) = (ch.epoch.as_deref(), ch.last_offset) else {
            return;
        };
        if ch.catchup.is_some() {
            return;
        }
        // A stream that expired and was recreated empty holds nothing this node missed; its
        // first publication will show the new epoch (and lose the channel) if one ever comes.
        let behind = top.offset > 0 && (top.epoch != epoch || top.offset > last);
        let seen_before = ch
            .tail_ahead
            .as_ref()
            .is_some_and(|prev| prev.epoch != epoch || prev.offset > last);
        if !behind {
            ch.tail_ahead = None;
            return;
        }
        if !seen_before {
            ch.tail_ahead = Some(top);
            return;
        }
        ch.tail_ahead = None;
        self.shared.metrics.tail_gaps.inc();
        if top.epoch != epoch {
            self.lose_continuity(channel, ch, "stream epoch changed");
        } else {
            tracing::info!(channel, last, top = top.offset, "tail check found a gap");
            self.begin_catchup(channel, ch, None);
        }
    }
}
