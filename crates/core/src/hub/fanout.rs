//! Fan-out and continuity: delivering a publication to a channel's subscribers in offset order,
//! catching up a gap from history, and losing the channel when history cannot fill it.

use super::*;

impl Hub {
    /// A publication from the broker: deliver it in order, or catch up first if offsets skip.
    pub fn deliver(&self, channel: &str, epoch: &str, publication: Publication) {
        self.shared.metrics.publications_received.inc();
        let mut direct = Vec::new();
        {
            let mut shard = self.shard(channel).lock().expect("hub lock");
            let Some(ch) = shard.get_mut(channel) else {
                self.shared.metrics.publications_without_subscriber.inc();
                return;
            };
            if publication.offset == 0 {
                deliver_unstored(channel, ch, &publication, &mut direct);
            } else {
                self.deliver_to(channel, ch, epoch, publication, Some(&mut direct));
            }
        }
        write_direct(direct);
    }

    /// Deliver to a channel whose shard lock is held: buffer during a catch-up, start one on a
    /// gap.
    pub(super) fn deliver_to(
        &self,
        channel: &str,
        ch: &mut Channel,
        epoch: &str,
        publication: Publication,
        direct: Option<&mut Vec<Arc<Outbound>>>,
    ) {
        ch.generation += 1;
        if let Some(waiting) = &mut ch.catchup {
            waiting.push(publication);
            return;
        }
        if let Err(Gap) = self.deliver_in_order(channel, ch, epoch, publication.clone(), direct) {
            self.begin_catchup(channel, ch, Some(publication));
        }
    }

    /// Deliver one publication if it is the next offset; skip it if already delivered.
    ///
    /// With `direct`, connections that can be written from here are queued without a wake-up
    /// and collected there, for [`write_direct`] once the lock is released; without it every
    /// connection's task is woken.
    ///
    /// Lock: the channel's shard lock is held.
    pub(super) fn deliver_in_order(
        &self,
        channel: &str,
        ch: &mut Channel,
        epoch: &str,
        p: Publication,
        mut direct: Option<&mut Vec<Arc<Outbound>>>,
    ) -> Result<(), Gap> {
        let Some(last) = ch.last_offset else {
            // No baseline yet: hold it until the first reply's position is known (or drop it
            // when no subscriber is waiting for one).
            if ch.has_pending() {
                if ch.early.len() >= EARLY_MAX {
                    self.lose_continuity(channel, ch, "too many publications before the reply");
                } else {
                    ch.early.push((epoch.to_owned(), p));
                }
            }
            return Ok(());
        };
        if ch.epoch.as_deref() != Some(epoch) {
            // The stream was recreated: positions clients hold mean nothing any more.
            self.lose_continuity(channel, ch, "stream epoch changed");
            return Ok(());
        }
        if p.offset <= last {
            return Ok(());
        }
        if p.offset > last + 1 {
            return Err(Gap);
        }
        ch.last_offset = Some(p.offset);
        ch.active = true;
        ch.remember(&p);
        let frame = push_publication(channel, &p);
        // Delta subscribers' frames, made once each when first needed.
        let base = ch.delta_base.take();
        let mut delta_frames = DeltaFrames::new(channel, &p, base.as_ref());
        let mut has_delta_subscribers = false;
        let mut delivered = 0;
        // The channel's name for the tags of subscribers that may shed (made once, if any).
        let mut name: Option<Arc<str>> = None;
        // Some only in a traced delivery: the first few connections get a `write` span.
        let mut sampler = direct.as_ref().and_then(|_| traced::take_write_sampler());
        for sub in ch.subscribers.values_mut() {
            match &mut sub.mode {
                Mode::Pending(waiting) => waiting.push(p.clone()),
                // A subscriber whose tag filter refuses it does not get it (its client's position
                // moves on with the next publication it does get: see docs/protocol.md).
                Mode::Live { skip_until } if p.offset > *skip_until && passes(&sub.filter, &p) => {
                    let (frame, full) = match &sub.delta {
                        Some(d) => delta_frames.for_subscriber(d.holds),
                        None => (frame.clone(), None),
                    };
                    let tag = match sub.backpressure {
                        Backpressure::Disconnect => None,
                        policy => Some(Sheddable {
                            channel: name.get_or_insert_with(|| Arc::from(channel)).clone(),
                            offset: p.offset,
                            policy,
                            skipped_from: None,
                            full,
                        }),
                    };
                    let queued = match &mut direct {
                        Some(list) => match match sampler.as_mut().filter(|s| s.wants_more()) {
                            Some(s) => sub.out.push_for_fanout_traced(frame, tag, || s.span()),
                            None => sub.out.push_for_fanout(frame, tag),
                        } {
                            Some(true) => {
                                list.push(sub.out.clone());
                                true
                            }
                            Some(false) => true,
                            None => false,
                        },
                        None => sub.out.push_sheddable(frame, tag),
                    };
                    if queued {
                        delivered += 1;
                    }
                    if let Some(d) = &mut sub.delta {
                        d.holds = queued.then_some(p.offset);
                    }
                }
                Mode::Live { .. } | Mode::Lost => {}
            }
            has_delta_subscribers |= sub.delta.is_some();
        }
        if let Some(sampler) = sampler {
            traced::return_write_sampler(sampler);
        }
        self.shared
            .metrics
            .deltas_computed
            .inc_by(delta_frames.computed as u64);
        // Kept only where some subscriber may want a delta of the next one.
        if has_delta_subscribers {
            ch.delta_base = Some((p.offset, p.data.clone()));
        }
        self.shared.metrics.deliveries.inc_by(delivered);
        Ok(())
    }

    /// Start reading the gap from history; live publications wait in `ch.catchup`.
    ///
    /// Lock: the channel's shard lock is held.
    pub(super) fn begin_catchup(
        &self,
        channel: &str,
        ch: &mut Channel,
        first: Option<Publication>,
    ) {
        if let Some(waiting) = &mut ch.catchup {
            waiting.extend(first);
            return;
        }
        let (Some(epoch), Some(offset)) = (ch.epoch.clone(), ch.last_offset) else {
            return;
        };
        ch.catchup = Some(first.into_iter().collect());
        self.shared.metrics.catchups.inc();
        let hub = self.clone();
        let channel = channel.to_owned();
        let opts = ch.opts.clone();
        tokio::spawn(async move {
            let query = HistoryQuery {
                since: Some(StreamPosition { epoch, offset }),
                limit: None,
            };
            // A broker that just came back may still be re-establishing its command link: retry
            // "unavailable" for a few seconds before telling clients to recover themselves.
            let mut backoff = Backoff::new(CATCHUP_RETRY_FIRST, CATCHUP_RETRY_LAST).exact();
            let history = loop {
                let read = hub.shared.broker.history(&channel, &query, &opts).await;
                if let Err(BrokerError::Unavailable { message: why, .. }) = &read {
                    if let Some(delay) = backoff.next_delay_until_max() {
                        tracing::debug!(channel, why, "catch-up read unavailable; retrying");
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                }
                break read;
            };
            hub.finish_catchup(&channel, history);
        });
    }

    pub(super) fn finish_catchup(
        &self,
        channel: &str,
        history: Result<herald_broker::HistoryResult, BrokerError>,
    ) {
        let mut shard = self.shard(channel).lock().expect("hub lock");
        let Some(ch) = shard.get_mut(channel) else {
            return;
        };
        let Some(waiting) = ch.catchup.take() else {
            // Continuity was lost meanwhile; the channel starts over.
            return;
        };
        let history = match history {
            Ok(h) if h.continuous => h,
            Ok(_) => return self.lose_continuity(channel, ch, "history no longer holds the gap"),
            Err(e) => {
                tracing::warn!(channel, cause = %e, "catch-up read failed");
                return self.lose_continuity(channel, ch, "catch-up failed");
            }
        };
        let epoch = history.position.epoch.clone();
        for p in history.publications.into_iter().chain(waiting) {
            if let Err(Gap) = self.deliver_in_order(channel, ch, &epoch, p, None) {
                return self.lose_continuity(channel, ch, "gap after catch-up");
            }
            if ch.last_offset.is_none() {
                return; // lost on an epoch change
            }
        }
    }

    /// The node cannot guarantee the channel's continuity any more: stop delivering it, tell
    /// each subscriber's session to leave it (its client gets `unsub` 4003 and resubscribes with
    /// `since`, or learns it cannot recover), and forget the baseline so that the next
    /// subscriber's reply sets a new one.
    ///
    /// Lock: the channel's shard lock is held.
    pub(super) fn lose_continuity(&self, channel: &str, ch: &mut Channel, why: &str) {
        tracing::warn!(
            channel,
            subscribers = ch.subscribers.len(),
            why,
            "channel continuity lost"
        );
        for sub in ch.subscribers.values_mut() {
            if matches!(sub.mode, Mode::Lost) {
                continue;
            }
            sub.mode = Mode::Lost;
            sub.out.control(Control::Lost {
                channel: channel.to_owned(),
                reason: format!("insufficient state: {why}"),
            });
            self.shared.metrics.continuity_lost.inc();
        }
        ch.epoch = None;
        ch.last_offset = None;
        ch.catchup = None;
        ch.early = Vec::new();
        ch.tail_ahead = None;
        ch.forget_recent();
        ch.delta_base = None;
    }

    /// After a broker reconnect: catch up every channel this node hosts.
    pub fn catch_up_all(&self) {
        for shard in self.shared.shards.iter() {
            let mut shard = shard.lock().expect("hub lock");
            for (name, ch) in shard.iter_mut() {
                let name = name.clone();
                self.begin_catchup(&name, ch, None);
            }
        }
    }

    /// Push a join/leave to the channel's live subscribers.
    pub fn deliver_presence_change(&self, channel: &str, joined: bool, who: &ClientInfo) {
        let shard = self.shard(channel).lock().expect("hub lock");
        let Some(ch) = shard.get(channel) else { return };
        let frame = push_presence_change(joined, channel, who);
        for sub in ch.subscribers.values() {
            if matches!(sub.mode, Mode::Live { .. }) {
                sub.out.push(frame.clone());
            }
        }
    }
}

/// A publication kept out of the stream (`skip_history`, offset 0): to every live subscriber
/// whose filter takes it, now, outside offset order, catch-ups and baselines (it has no
/// position); pending subscribers do not get it (at most once, live only). Its push has no
/// offset, and a delta subscriber's next publication goes in full (its client keeps no base
/// after a plain `pub`).
///
/// Lock: the channel's shard lock is held.
fn deliver_unstored(
    channel: &str,
    ch: &mut Channel,
    p: &Publication,
    direct: &mut Vec<Arc<Outbound>>,
) {
    let frame = push_publication(channel, p);
    for sub in ch.subscribers.values_mut() {
        if !matches!(sub.mode, Mode::Live { .. }) || !passes(&sub.filter, p) {
            continue;
        }
        if let Some(d) = &mut sub.delta {
            d.holds = None;
        }
        if sub.out.push_for_fanout(frame.clone(), None) == Some(true) {
            direct.push(sub.out.clone());
        }
    }
}

/// Whether a subscriber with `filter` (none: every publication) gets `p`.
pub(super) fn passes(filter: &Option<Box<TagFilter>>, p: &Publication) -> bool {
    filter.as_ref().is_none_or(|f| f.matches(&p.tags))
}

/// Offsets skipped: catch up from history first.
pub(super) struct Gap;

/// Up to this many connections the deliverer writes them itself (a personal channel costs no
/// task wake-up at all).
const DIRECT_INLINE_MAX: usize = 16;

/// Connections per task when a fan-out's writes are spread over the runtime: small enough that
/// the workers share them and other tasks run in between (each piece is a few milliseconds of
/// `write`s), large enough that spawning costs nothing beside them.
const DIRECT_PIECE: usize = 256;

tokio::task_local! {
    /// The direct writes of a task that delivers to many channels in a row (see
    /// [`Hub::gathering_direct_writes`]).
    static GATHERED: Gathered;
}

/// Direct writes put off by a gathering task; written in pieces as they fill, and the rest when
/// the gathering ends, even if it ends by being dropped (its frames are queued without a
/// wake-up: nobody else would write them).
#[derive(Default)]
struct Gathered(std::cell::RefCell<Vec<Arc<Outbound>>>);

impl Drop for Gathered {
    fn drop(&mut self) {
        write_direct_now(self.0.take());
    }
}

impl Hub {
    /// Run `work` (a broadcast's publications, say) with the direct writes of its deliveries
    /// gathered across channels and written in pieces spread over the workers, as one large
    /// channel's are. Without it each delivery writes its channel's few connections itself, and
    /// past the task's cooperative budget hands them to their tasks: a wake-up each.
    pub async fn gathering_direct_writes<F: std::future::Future>(&self, work: F) -> F::Output {
        GATHERED.scope(Gathered::default(), work).await
    }
}

/// Write to the connections a fan-out queued for direct writes; in a gathering task, add them
/// to its gathered writes instead, and spawn those a piece at a time.
fn write_direct(mut outs: Vec<Arc<Outbound>>) {
    if outs.is_empty() {
        return;
    }
    let piece = GATHERED.try_with(|g| {
        let mut g = g.0.borrow_mut();
        g.append(&mut outs);
        (g.len() >= DIRECT_PIECE).then(|| std::mem::take(&mut *g))
    });
    match piece {
        Ok(Some(piece)) => write_direct_now(piece),
        Ok(None) => {}
        Err(_) => write_direct_now(outs),
    }
}

/// Write to the connections a fan-out queued for direct writes: on the caller's thread for a
/// few; for more, in pieces spawned on the runtime, so that every worker takes part in the
/// kernel's per-write work (most of a delivery's cost). Outside a runtime, all here.
fn write_direct_now(mut outs: Vec<Arc<Outbound>>) {
    let handle = match tokio::runtime::Handle::try_current() {
        Ok(h) if outs.len() > DIRECT_INLINE_MAX => h,
        _ => {
            // Inside the caller's cooperative budget, on purpose: a task that delivers to many
            // small channels in a row without gathering (a broker's receive loop) writes about
            // 128 of them itself and hands the rest to the connections' tasks, spread over the
            // workers. Written all here, a broadcast to 10,000 personal channels took 123 ms to
            // reach everyone instead of 89–101 (docs/benchmarks.md, round 13).
            outs.iter().for_each(|o| o.flush_direct());
            return;
        }
    };
    while !outs.is_empty() {
        let piece = outs.split_off(outs.len().saturating_sub(DIRECT_PIECE));
        // Outside tokio's cooperative budget: each write polls the socket once, and after 128
        // polls in one task the budget would make the rest return "not ready", sending half of a
        // piece back to the connections' tasks (measured: half the direct writes). A piece is
        // bounded, so it cannot hog its worker.
        handle.spawn(tokio::task::coop::unconstrained(async move {
            piece.iter().for_each(|o| o.flush_direct())
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::{DirectWrite, Flushed};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Poll;

    /// Records whether tokio's cooperative budget had room when it was asked to write (a real
    /// socket's readiness check returns "not ready" when it has none).
    #[derive(Default)]
    struct BudgetProbe(AtomicBool);

    impl DirectWrite for BudgetProbe {
        fn try_write(&self, _frames: Vec<Bytes>) -> Result<Flushed, Vec<Bytes>> {
            self.0
                .store(tokio::task::coop::has_budget_remaining(), Ordering::SeqCst);
            Ok(Flushed::All)
        }
    }

    /// Counts the frames it was given, taking all of them.
    #[derive(Default)]
    struct Counter(std::sync::atomic::AtomicUsize);

    impl DirectWrite for Counter {
        fn try_write(&self, frames: Vec<Bytes>) -> Result<Flushed, Vec<Bytes>> {
            self.0.fetch_add(frames.len(), Ordering::SeqCst);
            Ok(Flushed::All)
        }
    }

    impl Counter {
        fn written(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// `n` queues writing through `counter`, each with one frame queued by a fan-out.
    fn queued(counter: &Arc<Counter>, n: usize) -> Vec<Arc<Outbound>> {
        (0..n)
            .map(|_| {
                let q = Arc::new(Outbound::new(100));
                q.set_direct(Some(counter.clone()));
                assert_eq!(
                    q.push_for_fanout(Bytes::from_static(b"x"), None),
                    Some(true)
                );
                q
            })
            .collect()
    }

    #[tokio::test]
    async fn gathered_writes_go_out_a_piece_at_a_time_and_the_rest_at_the_end() {
        let counter = Arc::new(Counter::default());
        let queues = queued(&counter, DIRECT_PIECE + 44);
        GATHERED
            .scope(Gathered::default(), async {
                for q in &queues {
                    write_direct(vec![q.clone()]);
                }
                // The first piece was spawned; it runs once this task yields.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                assert_eq!(counter.written(), DIRECT_PIECE);
            })
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(counter.written(), DIRECT_PIECE + 44);
    }

    #[tokio::test]
    async fn gathered_writes_go_out_when_the_gathering_is_dropped() {
        let counter = Arc::new(Counter::default());
        let queues = queued(&counter, 3);
        let stuck = GATHERED.scope(Gathered::default(), async {
            for q in &queues {
                write_direct(vec![q.clone()]);
            }
            std::future::pending::<()>().await
        });
        let dropped = tokio::time::timeout(std::time::Duration::from_millis(20), stuck).await;
        assert!(dropped.is_err());
        assert_eq!(
            counter.written(),
            3,
            "written, though nothing woke their tasks"
        );
    }

    /// The budget is what spreads a long run of small deliveries over the workers (see
    /// `write_direct`): the deliverer's own writes must not bypass it.
    #[tokio::test]
    async fn a_few_direct_writes_stay_within_the_callers_budget() {
        let probe = Arc::new(BudgetProbe::default());
        probe.0.store(true, Ordering::SeqCst);
        let q = Arc::new(Outbound::new(100));
        q.set_direct(Some(probe.clone()));
        assert_eq!(
            q.push_for_fanout(Bytes::from_static(b"x"), None),
            Some(true)
        );
        // Spend this task's budget within one poll, as a long run of deliveries would.
        std::future::poll_fn(|cx| {
            while let Poll::Ready(r) = tokio::task::coop::poll_proceed(cx) {
                r.made_progress();
            }
            Poll::Ready(())
        })
        .await;
        write_direct(vec![q]);
        assert!(
            !probe.0.load(Ordering::SeqCst),
            "the write ran outside the budget"
        );
    }
}
