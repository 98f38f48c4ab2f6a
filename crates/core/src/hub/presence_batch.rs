//! Join/leave batching for crowded channels. In a namespace with `join_leave_batch_ms`, the
//! joins and leaves a node receives for a channel are collected for that long and pushed to each
//! of its subscribers as `presence_batch` pushes (at most [`MAX_CHANGES_PER_PUSH`] changes each),
//! so that a storm of N joins costs a subscriber about N / interval frames instead of N. Order
//! is kept: the changes of one channel leave in the order they arrived.
//!
//! In a namespace with `join_leave_counts` as well, a batch pushes the channel's presence counts
//! instead (`presence_count`, read from the broker once per batch and node), so that what a
//! subscriber receives no longer grows with the number of members.
//!
//! The hub does not know namespaces: the node tells it which channels batch, and how long, with
//! [`Hub::batch_join_leave`]. Without that call every change is pushed at once, as before.

use std::sync::OnceLock;

use herald_protocol::encode::{push_presence_batch, push_presence_count};

use super::*;

/// Changes per `presence_batch` push: bounds one frame (a change is about 100 bytes, more with
/// the token's `info`), so a storm is several pushes, not one frame over the client's limits.
pub(super) const MAX_CHANGES_PER_PUSH: usize = 500;

/// Which channels batch (and for how long), and the changes waiting per channel.
#[derive(Default)]
pub(super) struct PresenceBatches {
    interval_of: OnceLock<IntervalOf>,
    pending: Mutex<HashMap<String, Vec<(bool, ClientInfo)>>>,
    /// `join_leave_counts`: per channel, the number of the newest count read so far and of the
    /// newest pushed, so that a slow broker read never overtakes a newer one.
    counts: Mutex<HashMap<String, (u64, u64)>>,
}

/// How a channel's joins and leaves are batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinLeaveBatch {
    /// How long a batch collects; zero: no batching.
    pub interval: Duration,
    /// Push the channel's presence counts instead of the changes (`join_leave_counts`).
    pub counts: bool,
}

/// A channel's batching; `None` or a zero interval: no batching.
type IntervalOf = Box<dyn Fn(&str) -> Option<JoinLeaveBatch> + Send + Sync>;

impl Hub {
    /// Batch the joins and leaves of the channels `interval_of` gives an interval for. Called
    /// once, before the node serves; later calls are ignored.
    pub fn batch_join_leave(
        &self,
        interval_of: impl Fn(&str) -> Option<JoinLeaveBatch> + Send + Sync + 'static,
    ) {
        let _ = self
            .shared
            .presence_batches
            .interval_of
            .set(Box::new(interval_of));
    }

    /// A join or leave from the broker: pushed now, or queued for the channel's next batch.
    pub(super) fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo) {
        let batches = &self.shared.presence_batches;
        let batch = batches
            .interval_of
            .get()
            .and_then(|of| of(channel))
            .filter(|b| !b.interval.is_zero());
        let Some(JoinLeaveBatch { interval, counts }) = batch else {
            self.deliver_presence_change(channel, joined, &who);
            return;
        };
        let mut pending = batches.pending.lock().expect("presence batch lock");
        let first = match pending.get_mut(channel) {
            Some(changes) => {
                changes.push((joined, who));
                false
            }
            None => {
                pending.insert(channel.to_owned(), vec![(joined, who)]);
                true
            }
        };
        drop(pending);
        if first {
            // The first change of a batch starts its timer; the batch leaves when it fires.
            let weak = Arc::downgrade(&self.shared);
            let channel = channel.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(interval).await;
                if let Some(shared) = weak.upgrade() {
                    let hub = Hub { shared };
                    match counts {
                        true => hub.flush_presence_counts(&channel).await,
                        false => hub.flush_presence_batch(&channel),
                    }
                }
            });
        }
    }

    /// `join_leave_counts`: drop the channel's waiting changes and push its presence counts, as
    /// the broker has them now, to its live subscribers. A read that fails is logged and
    /// skipped: the next change pushes counts again.
    async fn flush_presence_counts(&self, channel: &str) {
        let batches = &self.shared.presence_batches;
        batches
            .pending
            .lock()
            .expect("presence batch lock")
            .remove(channel);
        let ticket = {
            let mut counts = batches.counts.lock().expect("presence counts lock");
            let entry = counts.entry(channel.to_owned()).or_default();
            entry.0 += 1;
            entry.0
        };
        let stats = match self.shared.broker.presence_stats(channel).await {
            Ok(stats) => stats,
            Err(e) => {
                tracing::warn!(channel, error = %e, "presence counts not read; pushed with the next change");
                return;
            }
        };
        let frame = push_presence_count(channel, stats.num_clients, stats.num_users);
        let shard = self.shard(channel).lock().expect("hub lock");
        let mut counts = batches.counts.lock().expect("presence counts lock");
        let Some(ch) = shard.get(channel) else {
            counts.remove(channel);
            return;
        };
        let Some(entry) = counts.get_mut(channel) else {
            return;
        };
        if ticket <= entry.1 {
            return;
        }
        entry.1 = ticket;
        for sub in ch.subscribers.values() {
            if matches!(sub.mode, Mode::Live { .. }) {
                sub.out.push(frame.clone());
            }
        }
    }

    /// Push a channel's waiting changes to its live subscribers.
    fn flush_presence_batch(&self, channel: &str) {
        let changes = {
            let mut pending = self
                .shared
                .presence_batches
                .pending
                .lock()
                .expect("presence batch lock");
            pending.remove(channel).unwrap_or_default()
        };
        let frames: Vec<Bytes> = changes
            .chunks(MAX_CHANGES_PER_PUSH)
            .map(|chunk| push_presence_batch(channel, chunk.iter().map(|(j, who)| (*j, who))))
            .collect();
        if frames.is_empty() {
            return;
        }
        let shard = self.shard(channel).lock().expect("hub lock");
        let Some(ch) = shard.get(channel) else { return };
        for sub in ch.subscribers.values() {
            if matches!(sub.mode, Mode::Live { .. }) {
                for frame in &frames {
                    sub.out.push(frame.clone());
                }
            }
        }
    }
}
