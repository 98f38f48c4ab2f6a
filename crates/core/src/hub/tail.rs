//! The tail check: finding a publication lost at the end of a burst by comparing the broker's
//! newest offset with each hosted channel's baseline (see [`super::TAIL_CHECK_EVERY`]).

use std::cmp::Reverse;

use super::*;

impl Hub {
    /// One tick of the tail check (see the module docs). Due: channels whose tail was ahead last
    /// time, channels that delivered since their last check, and channels not checked for
    /// [`TAIL_SWEEP_TICKS`]. At most [`TAIL_CHECKS_PER_TICK`] are read; when more are due, a gap
    /// seen once goes first, then the longest unchecked, and the rest stay due for the next
    /// tick: with D channels due a tick, each is read within about D / 512 ticks.
    pub(super) async fn check_tails(&self) {
        let tick = self.shared.tail_tick.fetch_add(1, Ordering::Relaxed) as u32;
        // (priority, shard, channel): higher priority first.
        let mut due: Vec<(u32, usize, Arc<str>)> = Vec::new();
        for (n, shard) in self.shared.shards.iter().enumerate() {
            let shard = shard.lock().expect("hub lock");
            for (name, ch) in shard.iter() {
                if ch.last_offset.is_none() {
                    continue;
                }
                let waited = tick.wrapping_sub(ch.checked_at);
                if ch.tail_ahead.is_some() {
                    due.push((u32::MAX, n, name.clone()));
                } else if ch.active || waited >= TAIL_SWEEP_TICKS {
                    due.push((waited.min(u32::MAX - 1), n, name.clone()));
                }
            }
        }
        let waiting = due.len().saturating_sub(TAIL_CHECKS_PER_TICK);
        if waiting > 0 {
            due.select_nth_unstable_by_key(TAIL_CHECKS_PER_TICK - 1, |d| Reverse(d.0));
            due.truncate(TAIL_CHECKS_PER_TICK);
        }
        self.shared.metrics.tail_checks_waiting.set(waiting as i64);
        // Mark the chosen checked (each shard locked once); the others keep their marks.
        due.sort_unstable_by_key(|d| d.1);
        let mut reads: Vec<(Arc<str>, StreamOptions)> = Vec::with_capacity(due.len());
        for group in due.chunk_by(|a, b| a.1 == b.1) {
            let mut shard = self.shared.shards[group[0].1].lock().expect("hub lock");
            for (_, _, name) in group {
                if let Some(ch) = shard.get_mut(name) {
                    ch.active = false;
                    ch.checked_at = tick;
                    reads.push((name.clone(), ch.opts.clone()));
                }
            }
        }
        let tops = self.shared.broker.positions(&reads).await;
        for ((channel, _), top) in reads.iter().zip(tops) {
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
