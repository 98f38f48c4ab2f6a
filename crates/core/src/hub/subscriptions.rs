//! Subscribing and unsubscribing: the pending → live hand-over of a new subscriber and the
//! channel's baseline (see the module docs of [`super`]).

use super::fanout::passes;
use super::*;

impl Hub {
    /// First half of a subscription: add the connection as a pending subscriber, make sure the
    /// node is subscribed at the broker, and read the history the reply carries. The caller
    /// queues the reply, then calls [`activate`](Self::activate). On error nothing is left behind.
    pub async fn prepare_subscription(
        &self,
        channel: &str,
        key: ConnKey,
        out: &Arc<Outbound>,
        since: Option<&StreamPosition>,
        ns: &NamespaceConfig,
    ) -> Result<SubscribeResult, BrokerError> {
        let opts = ns.stream_options();
        let (generation, local) = {
            let _transition = self.shared.transitions[stripe(channel, TRANSITION_STRIPES)]
                .lock()
                .await;
            let (first, generation, local) = {
                let mut shard = self.shard(channel).lock().expect("hub lock");
                let first = !shard.contains_key(channel);
                let ch = shard.entry(Arc::from(channel)).or_insert_with(|| {
                    let incarnation = self.shared.incarnations.fetch_add(1, Ordering::Relaxed);
                    Channel::new(opts.clone(), incarnation << 32)
                });
                ch.subscribers.insert(
                    key,
                    Subscriber {
                        out: out.clone(),
                        mode: Mode::Pending(Vec::new()),
                        backpressure: ns.backpressure,
                        delta: None,
                        filter: None,
                    },
                );
                // Read under the same lock that made the subscriber pending: what the channel
                // delivers from here on is kept for it, so the answer and delivery meet exactly.
                let local = ch.local_history(since, ns.history_size);
                (first, ch.generation, local)
            };
            if first {
                self.shared.metrics.channels.inc();
                if let Err(e) = self.shared.broker.subscribe(channel).await {
                    self.remove_subscriber(channel, key);
                    self.shared.metrics.channels.dec();
                    return Err(e);
                }
            }
            (generation, local)
        };
        self.shared.metrics.subscriptions.inc();
        let history = match local {
            Some(answer) => {
                self.shared.metrics.history_reads_local.inc();
                Ok(answer)
            }
            None => self.read_history(channel, since, &opts, generation).await,
        };
        let history = match history {
            Ok(h) => h,
            Err(e) => {
                self.unsubscribe(channel, key).await;
                return Err(e);
            }
        };
        let result = decide(since, history, ns.history_size > 0);
        match result.recovered {
            Some(true) => self.shared.metrics.recovered.inc(),
            Some(false) => self.shared.metrics.recovery_failed.inc(),
            None => 0,
        };
        Ok(result)
    }

    /// The broker's answer for a new subscriber: the position, and with `since` what came after.
    async fn read_history(
        &self,
        channel: &str,
        since: Option<&StreamPosition>,
        opts: &StreamOptions,
        generation: u64,
    ) -> Result<HistoryResult, BrokerError> {
        let query = HistoryQuery {
            since: since.cloned(),
            limit: if since.is_some() { None } else { Some(0) },
        };
        let (history, shared) = self
            .shared
            .flights
            .history(&self.shared.broker, channel, &query, opts, generation)
            .await;
        if shared {
            self.shared.metrics.history_reads_shared.inc();
        }
        history
    }

    /// Second half: the reply is queued; queue what arrived meanwhile (after the reply's
    /// position) and switch the subscriber to live delivery. A channel without a baseline takes
    /// this position as its baseline and then runs the deliveries it held through the gap check.
    pub fn activate(&self, channel: &str, key: ConnKey, position: &StreamPosition) {
        let mut shard = self.shard(channel).lock().expect("hub lock");
        let Some(ch) = shard.get_mut(channel) else {
            return;
        };
        let Some(sub) = ch.subscribers.get_mut(&key) else {
            return;
        };
        if let Some(sink) = self.lifecycle() {
            sink.subscribed(key, channel);
        }
        let top = position.offset;
        match std::mem::replace(&mut sub.mode, Mode::Live { skip_until: top }) {
            Mode::Pending(waiting) => {
                // What the subscriber is given after its reply must run on from the reply's
                // position without a hole up to the baseline (deliveries continue from there).
                // It does not when the reply is older than publications delivered before the
                // subscriber was pending, or when another reply set the baseline past a
                // publication held for it that never reached the node: tell it (4003) instead;
                // it recovers with `since` from history.
                let mut reach = top;
                for p in waiting.iter() {
                    if p.offset == reach + 1 {
                        reach = p.offset;
                    }
                }
                let hole = waiting.iter().any(|p| p.offset > reach)
                    || ch.last_offset.is_some_and(|last| last > reach);
                if hole {
                    sub.mode = Mode::Lost;
                    sub.out.control(Control::Lost {
                        channel: channel.to_owned(),
                        reason: "insufficient state: the reply is older than what was delivered"
                            .into(),
                    });
                    self.shared.metrics.continuity_lost.inc();
                    return;
                }
                for p in waiting
                    .iter()
                    .filter(|p| p.offset > top && passes(&sub.filter, p))
                {
                    sub.out.push(push_publication(channel, p));
                }
            }
            Mode::Lost => {
                sub.mode = Mode::Lost;
                return;
            }
            Mode::Live { .. } => {}
        }
        if ch.last_offset.is_none() {
            ch.forget_recent();
            ch.epoch = Some(position.epoch.clone());
            ch.last_offset = Some(top);
            ch.active = true;
            let early = std::mem::take(&mut ch.early);
            // Other pending subscribers may hold older replies than this baseline: they keep the
            // held publications at or below it too (the rest reach them through delivery).
            for (other, sub) in ch.subscribers.iter_mut() {
                if let (true, Mode::Pending(waiting)) = (*other != key, &mut sub.mode) {
                    waiting.extend(
                        early
                            .iter()
                            .filter(|(e, p)| *e == position.epoch && p.offset <= top)
                            .map(|(_, p)| p.clone()),
                    );
                }
            }
            for (epoch, p) in early {
                self.deliver_to(channel, ch, &epoch, p, None);
            }
        }
    }

    /// Send this (pending) subscriber its live publications with delta compression, from the
    /// first one after its reply (which goes in full). Call between
    /// [`prepare_subscription`](Self::prepare_subscription) and [`activate`](Self::activate).
    pub fn use_delta(&self, channel: &str, key: ConnKey) {
        let mut shard = self.shard(channel).lock().expect("hub lock");
        if let Some(sub) = shard
            .get_mut(channel)
            .and_then(|ch| ch.subscribers.get_mut(&key))
        {
            sub.delta = Some(DeltaSubscriber::default());
        }
    }

    /// Deliver this (pending) subscriber only the publications whose tags match `filter`. Call
    /// between [`prepare_subscription`](Self::prepare_subscription) and
    /// [`activate`](Self::activate): what arrived meanwhile is filtered on activation.
    pub fn use_tags_filter(&self, channel: &str, key: ConnKey, filter: TagFilter) {
        let mut shard = self.shard(channel).lock().expect("hub lock");
        if let Some(sub) = shard
            .get_mut(channel)
            .and_then(|ch| ch.subscribers.get_mut(&key))
        {
            sub.filter = Some(Box::new(filter));
        }
    }

    /// Remove a subscriber without touching the broker (the caller holds the transition lock).
    pub(super) fn remove_subscriber(&self, channel: &str, key: ConnKey) -> Option<bool> {
        let mut shard = self.shard(channel).lock().expect("hub lock");
        let ch = shard.get_mut(channel)?;
        ch.subscribers.remove(&key)?;
        let last = ch.subscribers.is_empty();
        if last {
            shard.remove(channel);
        }
        Some(last)
    }

    /// Remove a subscription; the last local subscriber unsubscribes the node at the broker.
    pub async fn unsubscribe(&self, channel: &str, key: ConnKey) {
        let _transition = self.shared.transitions[stripe(channel, TRANSITION_STRIPES)]
            .lock()
            .await;
        let Some(last) = self.remove_subscriber(channel, key) else {
            return;
        };
        if let Some(sink) = self.lifecycle() {
            sink.unsubscribed(key, channel);
        }
        self.shared.metrics.subscriptions.dec();
        if last {
            self.shared.metrics.channels.dec();
            if let Err(e) = self.shared.broker.unsubscribe(channel).await {
                tracing::warn!(channel, cause = %e, "broker unsubscribe failed");
            }
        }
    }

    /// Channels with local subscribers and their counts.
    pub fn channels(&self) -> Vec<(String, usize)> {
        let mut all = Vec::new();
        for shard in self.shared.shards.iter() {
            let shard = shard.lock().expect("hub lock");
            all.extend(
                shard
                    .iter()
                    .map(|(name, ch)| (name.to_string(), ch.subscribers.len())),
            );
        }
        all
    }
}
