//! The hub: channels → local subscribers, fan-out, continuity (gap catch-up) and the client
//! registry the HTTP API acts through.
//!
//! # Data path of one publication
//! broker → [`Hub::deliver`] → the channel's subscriber map → the frame, encoded once, is pushed
//! to each connection's [`Outbound`] queue → the connection task writes it.
//!
//! # Continuity
//! The hub remembers, per channel, the epoch and the last offset it delivered (its *baseline*). A
//! publication that skips offsets starts a catch-up from history (publications arriving meanwhile
//! are buffered); a changed epoch or a catch-up that history cannot satisfy *loses the channel*:
//! each of its subscribers gets `unsub` with code 4003 (resubscribe with `since` to recover) and
//! keeps its other subscriptions; the channel forgets its baseline.
//!
//! A new subscriber is *pending* from the moment it is added until its reply is queued:
//! publications that arrive meanwhile are kept for it and those the reply's history already holds
//! are dropped, so recovered and live publications meet with no gap and no duplicate. A channel
//! without a baseline takes the first activated reply's position as its baseline, never an
//! unchecked delivery: deliveries that arrive before are held and then run through the same
//! gap check, so a publication lost between the reply's position and the first delivery is
//! caught up from history.
//!
//! A lost publication at the tail of a burst leaves no later publication to reveal the gap, so a
//! periodic *tail check* compares the broker's newest offset with the baseline: every channel that
//! delivered since the last check is looked at on the next tick, every other channel within one
//! sweep of all shards (see [`TAIL_CHECK_EVERY`]); a gap seen on two checks in a row is caught up.
//!
//! # Locks
//! Channel maps are sharded `std::sync::Mutex`es, never held across an `.await` and never held
//! while calling the broker. Broker subscribe/unsubscribe for one channel are serialized by a
//! striped async mutex, so a last-leave and a first-join cannot reorder at the broker.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::flights::Flights;
use bytes::Bytes;
use herald_broker::{
    Backoff, BrokerError, BrokerHandler, ControlMessage, HistoryQuery, NodeInfo, PublishOptions,
    SharedBroker, StreamOptions,
};
use herald_protocol::encode::{push_presence_change, push_publication};
use herald_protocol::{ClientInfo, CloseCode, Publication, StreamPosition};

use crate::config::NamespaceConfig;
use crate::metrics::Metrics;
use crate::outbound::{CloseRequest, Control, Outbound};
use crate::recovery::{decide, SubscribeResult};

const SHARDS: usize = 64;
const TRANSITION_STRIPES: usize = 256;
/// How often a node tells the others about itself, and when it is forgotten.
const NODE_INFO_EVERY: Duration = Duration::from_secs(5);
const NODE_INFO_EXPIRES: Duration = Duration::from_secs(15);
/// Catch-up retries while the broker is unavailable: 100 ms doubling to 3.2 s (about 6 s in all).
const CATCHUP_RETRY_FIRST: Duration = Duration::from_millis(100);
const CATCHUP_RETRY_LAST: Duration = Duration::from_millis(3200);
/// How often the tail check runs. A gap at the tail of a channel that delivered in the last tick
/// is caught up within about two ticks; any other channel's within one sweep of the shards
/// (`SHARDS` ticks, about a minute).
pub const TAIL_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Broker reads the tail check makes at most per tick (the rest wait for the next tick).
const TAIL_CHECKS_PER_TICK: usize = 512;
/// Deliveries held for a channel that has no baseline yet (while its first reply is built).
const EARLY_MAX: usize = 10_000;

/// A connection's key in the hub (cheaper than its client id string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey(u64);

enum Mode {
    /// Added, reply not yet queued: publications are kept here.
    Pending(Vec<Publication>),
    /// Receiving; publications at or below `skip_until` were already in its reply.
    Live { skip_until: u64 },
    /// The channel lost continuity: nothing more is delivered; the session leaves the channel.
    Lost,
}

struct Subscriber {
    out: Arc<Outbound>,
    mode: Mode,
}

struct Channel {
    subscribers: HashMap<ConnKey, Subscriber>,
    /// The baseline: epoch and last offset delivered (both `None` until the first activation).
    epoch: Option<String>,
    last_offset: Option<u64>,
    /// Deliveries that arrived while the channel had no baseline (with their epoch).
    early: Vec<(String, Publication)>,
    /// Some while a catch-up from history runs: live publications wait here.
    catchup: Option<Vec<Publication>>,
    /// Delivered since the last tail check.
    active: bool,
    /// The broker's position when the last tail check found it ahead of the baseline.
    tail_ahead: Option<StreamPosition>,
    /// Moves on with every publication that reaches the channel; unique per incarnation of the
    /// channel on this node (its base comes from [`Shared::incarnations`]). Subscribers that
    /// registered at the same generation may share a history read (see [`crate::flights`]).
    generation: u64,
    opts: StreamOptions,
}

impl Channel {
    fn new(opts: StreamOptions, generation: u64) -> Self {
        Channel {
            generation,
            subscribers: HashMap::new(),
            epoch: None,
            last_offset: None,
            early: Vec::new(),
            catchup: None,
            active: false,
            tail_ahead: None,
            opts,
        }
    }

    fn has_pending(&self) -> bool {
        self.subscribers
            .values()
            .any(|s| matches!(s.mode, Mode::Pending(_)))
    }
}

/// One shard of the channel map.
type ChannelMap = HashMap<Arc<str>, Channel>;

struct ClientEntry {
    user: Arc<str>,
    out: Arc<Outbound>,
    /// Where the client stands in its user's list, so that forgetting it is O(1): every
    /// anonymous connection shares the user "", and a storm of 19,000 disconnects scanning that
    /// list was quadratic, holding the registry lock that new connections wait on.
    slot: usize,
}

#[derive(Default)]
struct Registry {
    clients: HashMap<Arc<str>, ClientEntry>,
    users: HashMap<Arc<str>, Vec<Arc<str>>>,
}

impl Registry {
    /// Append `client` to `user`'s list; returns its slot.
    fn add_to_user(&mut self, user: &Arc<str>, client: Arc<str>) -> usize {
        let list = self.users.entry(user.clone()).or_default();
        list.push(client);
        list.len() - 1
    }

    /// Take the client at `slot` out of `user`'s list, moving the last one into its place.
    fn remove_from_user(&mut self, user: &Arc<str>, slot: usize) {
        let Some(list) = self.users.get_mut(user) else {
            return;
        };
        if slot >= list.len() {
            return;
        }
        list.swap_remove(slot);
        if let Some(moved) = list.get(slot).cloned() {
            if let Some(e) = self.clients.get_mut(&moved) {
                e.slot = slot;
            }
        } else if list.is_empty() {
            self.users.remove(user);
        }
    }
}

struct Shared {
    node_name: String,
    started: Instant,
    broker: SharedBroker,
    metrics: Arc<Metrics>,
    shards: Box<[Mutex<ChannelMap>]>,
    transitions: Box<[tokio::sync::Mutex<()>]>,
    registry: Mutex<Registry>,
    nodes: Mutex<HashMap<String, (NodeInfo, Instant)>>,
    next_key: AtomicU64,
    /// The shard the tail check sweeps next.
    sweep: AtomicU64,
    /// Channel incarnations created so far; each starts its generation at this << 32.
    incarnations: AtomicU64,
    /// History reads in flight, shared by subscribers asking the same at the same generation.
    flights: Flights,
}

/// Cheap-to-clone handle to the hub.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

/// The broker calls into the hub through this, holding it weakly (the hub owns the broker).
struct HubHandler(Weak<Shared>);

impl BrokerHandler for HubHandler {
    fn on_publication(&self, channel: &str, epoch: &str, publication: Publication) {
        if let Some(shared) = self.0.upgrade() {
            Hub { shared }.deliver(channel, epoch, publication);
        }
    }
    fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo) {
        if let Some(shared) = self.0.upgrade() {
            Hub { shared }.deliver_presence_change(channel, joined, &who);
        }
    }
    fn on_control(&self, message: ControlMessage) {
        if let Some(shared) = self.0.upgrade() {
            Hub { shared }.apply_control(message);
        }
    }
    fn on_reconnected(&self) {
        if let Some(shared) = self.0.upgrade() {
            Hub { shared }.catch_up_all();
        }
    }
}

fn stripe(channel: &str, n: usize) -> usize {
    let mut h = DefaultHasher::new();
    channel.hash(&mut h);
    (h.finish() as usize) % n
}

impl Hub {
    /// A hub that publishes and receives through `broker`.
    pub fn new(node_name: String, broker: SharedBroker, metrics: Arc<Metrics>) -> Self {
        Hub {
            shared: Arc::new(Shared {
                node_name,
                started: Instant::now(),
                broker,
                metrics,
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                transitions: (0..TRANSITION_STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                registry: Mutex::default(),
                nodes: Mutex::default(),
                next_key: AtomicU64::new(1),
                sweep: AtomicU64::new(0),
                incarnations: AtomicU64::new(0),
                flights: Flights::default(),
            }),
        }
    }

    /// Connect the broker to the hub and start the node-info heartbeat.
    pub async fn start(&self) -> Result<(), BrokerError> {
        let handler = Arc::new(HubHandler(Arc::downgrade(&self.shared)));
        self.shared.broker.start(handler).await?;
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(NODE_INFO_EVERY);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                let hub = Hub { shared };
                let info = ControlMessage::NodeInfo(hub.node_info());
                if let Err(e) = hub.shared.broker.publish_control(&info).await {
                    tracing::debug!(cause = %e, "node info not published");
                }
            }
        });
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TAIL_CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                Hub { shared }.check_tails().await;
            }
        });
        Ok(())
    }

    /// The broker.
    pub fn broker(&self) -> &SharedBroker {
        &self.shared.broker
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.shared.node_name
    }

    fn shard(&self, channel: &str) -> &Mutex<ChannelMap> {
        &self.shared.shards[stripe(channel, SHARDS)]
    }

    /// Publish through the broker (API or client), timing it for `/metrics`.
    pub async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        let started = Instant::now();
        let position = self
            .shared
            .broker
            .publish(channel, data, info, opts)
            .await?;
        let metrics = &self.shared.metrics;
        metrics
            .publish_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.publications.inc();
        Ok(position)
    }

    // ---- connections ------------------------------------------------------------------------

    /// Register a connection so the API can reach it by client id or user.
    pub fn register(&self, client: Arc<str>, user: Arc<str>, out: Arc<Outbound>) -> ConnKey {
        let key = ConnKey(self.shared.next_key.fetch_add(1, Ordering::Relaxed));
        let mut reg = self.shared.registry.lock().expect("registry lock");
        let slot = reg.add_to_user(&user, client.clone());
        reg.clients.insert(client, ClientEntry { user, out, slot });
        key
    }

    /// Forget a connection (after it unsubscribed from everything).
    pub fn unregister(&self, client: &str) {
        let mut reg = self.shared.registry.lock().expect("registry lock");
        if let Some(entry) = reg.clients.remove(client) {
            reg.remove_from_user(&entry.user, entry.slot);
        }
    }

    /// Change the user a registered connection is reachable by (a Pusher connection signs in
    /// after it connected).
    pub fn set_user(&self, client: &str, user: Arc<str>) {
        let mut reg = self.shared.registry.lock().expect("registry lock");
        let Some((key, entry)) = reg.clients.get_key_value(client) else {
            return;
        };
        let (client, old, old_slot) = (key.clone(), entry.user.clone(), entry.slot);
        reg.remove_from_user(&old, old_slot);
        let slot = reg.add_to_user(&user, client.clone());
        if let Some(e) = reg.clients.get_mut(&client) {
            e.user = user;
            e.slot = slot;
        }
    }

    /// Number of registered connections.
    pub fn connection_count(&self) -> usize {
        self.shared
            .registry
            .lock()
            .expect("registry lock")
            .clients
            .len()
    }

    /// The client ids of `user`'s connections on this node (for the admin UI; not on a hot path).
    pub fn user_clients(&self, user: &str) -> Vec<String> {
        let reg = self.shared.registry.lock().expect("registry lock");
        reg.users
            .get(user)
            .map(|list| list.iter().map(|c| c.to_string()).collect())
            .unwrap_or_default()
    }

    // ---- subscriptions ----------------------------------------------------------------------

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
        let generation = {
            let _transition = self.shared.transitions[stripe(channel, TRANSITION_STRIPES)]
                .lock()
                .await;
            let (first, generation) = {
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
                    },
                );
                (first, ch.generation)
            };
            if first {
                self.shared.metrics.channels.inc();
                if let Err(e) = self.shared.broker.subscribe(channel).await {
                    self.remove_subscriber(channel, key);
                    self.shared.metrics.channels.dec();
                    return Err(e);
                }
            }
            generation
        };
        self.shared.metrics.subscriptions.inc();
        let query = HistoryQuery {
            since: since.cloned(),
            limit: if since.is_some() { None } else { Some(0) },
        };
        let (history, shared) = self
            .shared
            .flights
            .history(&self.shared.broker, channel, &query, &opts, generation)
            .await;
        if shared {
            self.shared.metrics.history_reads_shared.inc();
        }
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
        let top = position.offset;
        match std::mem::replace(&mut sub.mode, Mode::Live { skip_until: top }) {
            Mode::Pending(waiting) => {
                // What the channel delivered after this subscriber became pending is contiguous
                // and ends at the baseline. If it does not reach down to the reply's position
                // (the reply is older than publications delivered before that), the subscriber
                // would miss the ones in between: tell it (4003) instead; it recovers with
                // `since` from history.
                let next = waiting
                    .iter()
                    .map(|p| p.offset)
                    .find(|o| *o > top)
                    .or(ch.last_offset.map(|l| l + 1));
                if next.is_some_and(|next| next > top + 1) {
                    sub.mode = Mode::Lost;
                    sub.out.control(Control::Lost {
                        channel: channel.to_owned(),
                        reason: "insufficient state: the reply is older than what was delivered"
                            .into(),
                    });
                    self.shared.metrics.continuity_lost.inc();
                    return;
                }
                for p in waiting.iter().filter(|p| p.offset > top) {
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
                self.deliver_to(channel, ch, &epoch, p);
            }
        }
    }

    /// Remove a subscriber without touching the broker (the caller holds the transition lock).
    fn remove_subscriber(&self, channel: &str, key: ConnKey) -> Option<bool> {
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

    // ---- fan-out ----------------------------------------------------------------------------

    /// A publication from the broker: deliver it in order, or catch up first if offsets skip.
    pub fn deliver(&self, channel: &str, epoch: &str, publication: Publication) {
        self.shared.metrics.publications_received.inc();
        let mut shard = self.shard(channel).lock().expect("hub lock");
        let Some(ch) = shard.get_mut(channel) else {
            self.shared.metrics.publications_without_subscriber.inc();
            return;
        };
        self.deliver_to(channel, ch, epoch, publication);
    }

    /// Deliver to a channel whose shard lock is held: buffer during a catch-up, start one on a
    /// gap.
    fn deliver_to(&self, channel: &str, ch: &mut Channel, epoch: &str, publication: Publication) {
        ch.generation += 1;
        if let Some(waiting) = &mut ch.catchup {
            waiting.push(publication);
            return;
        }
        if let Err(Gap) = self.deliver_in_order(channel, ch, epoch, publication.clone()) {
            self.begin_catchup(channel, ch, Some(publication));
        }
    }

    /// Deliver one publication if it is the next offset; skip it if already delivered.
    ///
    /// Lock: the channel's shard lock is held.
    fn deliver_in_order(
        &self,
        channel: &str,
        ch: &mut Channel,
        epoch: &str,
        p: Publication,
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
        let frame = push_publication(channel, &p);
        let mut delivered = 0;
        for sub in ch.subscribers.values_mut() {
            match &mut sub.mode {
                Mode::Pending(waiting) => waiting.push(p.clone()),
                Mode::Live { skip_until } if p.offset > *skip_until => {
                    if sub.out.push(frame.clone()) {
                        delivered += 1;
                    }
                }
                Mode::Live { .. } | Mode::Lost => {}
            }
        }
        self.shared.metrics.deliveries.inc_by(delivered);
        Ok(())
    }

    /// Start reading the gap from history; live publications wait in `ch.catchup`.
    ///
    /// Lock: the channel's shard lock is held.
    fn begin_catchup(&self, channel: &str, ch: &mut Channel, first: Option<Publication>) {
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

    fn finish_catchup(
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
            if let Err(Gap) = self.deliver_in_order(channel, ch, &epoch, p) {
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
    fn lose_continuity(&self, channel: &str, ch: &mut Channel, why: &str) {
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

    // ---- tail check -------------------------------------------------------------------------

    /// One tick of the tail check (see the module docs): channels that delivered since the last
    /// tick, channels whose tail was ahead last time, and every channel of one shard.
    async fn check_tails(&self) {
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
        let query = HistoryQuery {
            since: None,
            limit: Some(0),
        };
        for (channel, opts) in due {
            let Ok(h) = self.shared.broker.history(&channel, &query, &opts).await else {
                continue; // the broker is down: its reconnect triggers a catch-up anyway
            };
            self.tail_checked(&channel, h.position);
        }
    }

    /// The broker's newest position for a hosted channel: a gap seen twice in a row (not a
    /// publication still on its way) starts a catch-up; a changed epoch loses the channel.
    fn tail_checked(&self, channel: &str, top: StreamPosition) {
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

    // ---- control ----------------------------------------------------------------------------

    /// Act on a control message for local connections.
    pub fn apply_control(&self, message: ControlMessage) {
        match message {
            ControlMessage::Disconnect { user, client, code } => {
                for out in self.find(user.as_deref(), client.as_deref()) {
                    out.close(CloseRequest {
                        code: CloseCode(code),
                        reason: "disconnected by the server API".into(),
                        after_ms: None,
                    });
                }
            }
            ControlMessage::Subscribe { user, channel } => {
                for out in self.find(Some(&user), None) {
                    out.control(Control::Subscribe(channel.clone()));
                }
            }
            ControlMessage::Unsubscribe { user, channel } => {
                for out in self.find(Some(&user), None) {
                    out.control(Control::Unsubscribe(channel.clone()));
                }
            }
            ControlMessage::NodeInfo(info) => {
                if info.name != self.shared.node_name {
                    let mut nodes = self.shared.nodes.lock().expect("nodes lock");
                    nodes.insert(info.name.clone(), (info, Instant::now()));
                }
            }
        }
    }

    fn find(&self, user: Option<&str>, client: Option<&str>) -> Vec<Arc<Outbound>> {
        let reg = self.shared.registry.lock().expect("registry lock");
        if let Some(client) = client {
            return reg
                .clients
                .get(client)
                .map(|e| e.out.clone())
                .into_iter()
                .collect();
        }
        let Some(user) = user else { return Vec::new() };
        reg.users
            .get(user)
            .into_iter()
            .flatten()
            .filter_map(|c| reg.clients.get(c).map(|e| e.out.clone()))
            .collect()
    }

    /// This node's report.
    pub fn node_info(&self) -> NodeInfo {
        NodeInfo {
            name: self.shared.node_name.clone(),
            connections: self.connection_count() as u64,
            subscriptions: self.shared.metrics.subscriptions.get().max(0) as u64,
            channels: self.shared.metrics.channels.get().max(0) as u64,
            uptime_s: self.shared.started.elapsed().as_secs(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// This node and every other node heard from recently.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let mut nodes = self.shared.nodes.lock().expect("nodes lock");
        nodes.retain(|_, (_, at)| at.elapsed() < NODE_INFO_EXPIRES);
        let mut all = vec![self.node_info()];
        all.extend(nodes.values().map(|(info, _)| info.clone()));
        all
    }
}

/// Offsets skipped: catch up from history first.
struct Gap;

// Tests that wait for the catch-up task run on paused time: a sleep there returns once every task
// is idle (the in-memory broker does no I/O), however slow the machine, and costs no wall-clock time.
#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use herald_broker::{Broker, HistoryResult, MemoryBroker, PublishOptions};
    use std::collections::HashSet;

    /// A memory broker whose deliveries of chosen offsets never reach the hub (they are stored).
    struct LossyBroker {
        inner: MemoryBroker,
        lose: Arc<Mutex<HashSet<u64>>>,
    }

    impl LossyBroker {
        fn new() -> Self {
            LossyBroker {
                inner: MemoryBroker::new(),
                lose: Arc::default(),
            }
        }
        fn lose(&self, offsets: &[u64]) {
            self.lose.lock().unwrap().extend(offsets);
        }
    }

    struct Dropping {
        inner: Arc<dyn BrokerHandler>,
        lose: Arc<Mutex<HashSet<u64>>>,
    }

    impl BrokerHandler for Dropping {
        fn on_publication(&self, channel: &str, epoch: &str, p: Publication) {
            if !self.lose.lock().unwrap().remove(&p.offset) {
                self.inner.on_publication(channel, epoch, p);
            }
        }
        fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo) {
            self.inner.on_presence_change(channel, joined, who);
        }
        fn on_control(&self, message: ControlMessage) {
            self.inner.on_control(message);
        }
        fn on_reconnected(&self) {
            self.inner.on_reconnected();
        }
    }

    #[async_trait]
    impl Broker for LossyBroker {
        async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
            let lose = self.lose.clone();
            self.inner
                .start(Arc::new(Dropping {
                    inner: handler,
                    lose,
                }))
                .await
        }
        async fn publish(
            &self,
            channel: &str,
            data: Bytes,
            info: Option<ClientInfo>,
            opts: &PublishOptions,
        ) -> Result<StreamPosition, BrokerError> {
            self.inner.publish(channel, data, info, opts).await
        }
        async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
            self.inner.subscribe(channel).await
        }
        async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
            self.inner.unsubscribe(channel).await
        }
        async fn history(
            &self,
            channel: &str,
            query: &HistoryQuery,
            opts: &StreamOptions,
        ) -> Result<HistoryResult, BrokerError> {
            self.inner.history(channel, query, opts).await
        }
        async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
            self.inner.add_presence(channel, who).await
        }
        async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
            self.inner.remove_presence(channel, client).await
        }
        async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
            self.inner.presence(channel).await
        }
        async fn publish_presence_change(
            &self,
            channel: &str,
            joined: bool,
            who: &ClientInfo,
        ) -> Result<(), BrokerError> {
            self.inner
                .publish_presence_change(channel, joined, who)
                .await
        }
        async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
            self.inner.publish_control(message).await
        }
    }

    fn ns() -> NamespaceConfig {
        NamespaceConfig::default()
    }

    async fn hub() -> Hub {
        let hub = Hub::new(
            "test".into(),
            Arc::new(MemoryBroker::new()),
            Arc::new(Metrics::new()),
        );
        hub.start().await.unwrap();
        hub
    }

    fn offsets(out: &Outbound) -> Vec<u64> {
        out.drain()
            .frames
            .iter()
            .map(|f| {
                let v: serde_json::Value = serde_json::from_slice(f).unwrap();
                v["pub"]["offset"].as_u64().unwrap()
            })
            .collect()
    }

    async fn publish(hub: &Hub, channel: &str, n: u64) {
        for i in 0..n {
            let opts = PublishOptions {
                stream: ns().stream_options(),
                idempotency_key: None,
            };
            hub.broker()
                .publish(channel, Bytes::from(i.to_string()), None, &opts)
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn the_registry_finds_each_users_connections_after_removals_and_moves() {
        let hub = hub().await;
        let outs: Vec<Arc<Outbound>> = (0..5).map(|_| Arc::new(Outbound::new(1 << 10))).collect();
        for (i, out) in outs.iter().enumerate() {
            hub.register(format!("c{i}").into(), "".into(), out.clone());
        }
        let found = |user: &str| {
            let mut v: Vec<usize> = hub
                .find(Some(user), None)
                .iter()
                .map(|o| outs.iter().position(|x| Arc::ptr_eq(x, o)).unwrap())
                .collect();
            v.sort_unstable();
            v
        };
        hub.unregister("c1");
        hub.unregister("c0");
        assert_eq!(found(""), [2, 3, 4]);
        hub.set_user("c3", "alice".into());
        assert_eq!((found(""), found("alice")), (vec![2, 4], vec![3]));
        hub.unregister("c4");
        hub.unregister("c2");
        assert_eq!(found(""), Vec::<usize>::new());
        hub.set_user("c3", "".into());
        assert_eq!((found(""), found("alice")), (vec![3], vec![]));
        hub.unregister("c3");
        assert_eq!(hub.shared.registry.lock().unwrap().users.len(), 0);
    }

    #[tokio::test]
    async fn pending_subscriber_gets_what_arrived_after_its_reply_position() {
        let hub = hub().await;
        let out = Arc::new(Outbound::new(1 << 20));
        let key = hub.register("c1".into(), "u".into(), out.clone());
        publish(&hub, "ch", 3).await;
        let since = hub
            .prepare_subscription("ch", key, &out, None, &ns())
            .await
            .unwrap()
            .position;
        assert_eq!(since.offset, 3);
        // Published while the reply is being built: kept, then queued after it.
        publish(&hub, "ch", 2).await;
        assert!(
            out.drain().frames.is_empty(),
            "nothing goes out before the reply"
        );
        hub.activate("ch", key, &since);
        publish(&hub, "ch", 1).await;
        assert_eq!(offsets(&out), vec![4, 5, 6]);
    }

    /// What the session would be told: the channels it lost, in order.
    fn lost(out: &Outbound) -> Vec<String> {
        out.drain()
            .controls
            .into_iter()
            .filter_map(|c| match c {
                Control::Lost { channel, .. } => Some(channel),
                _ => None,
            })
            .collect()
    }

    /// Subscribe a registered connection to `channel` (both halves); returns the reply position.
    async fn join(hub: &Hub, channel: &str, key: ConnKey, out: &Arc<Outbound>) -> StreamPosition {
        let pos = hub
            .prepare_subscription(channel, key, out, None, &ns())
            .await
            .unwrap()
            .position;
        hub.activate(channel, key, &pos);
        pos
    }

    async fn subscribed(hub: &Hub, channel: &str, client: &str) -> (ConnKey, Arc<Outbound>) {
        let out = Arc::new(Outbound::new(1 << 20));
        let key = hub.register(client.into(), "u".into(), out.clone());
        join(hub, channel, key, &out).await;
        (key, out)
    }

    fn publication(offset: u64) -> Publication {
        Publication {
            offset,
            data: Bytes::from(offset.to_string()),
            info: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gap_that_history_cannot_fill_loses_only_that_channel() {
        let hub = hub().await;
        let (key, out) = subscribed(&hub, "ch", "c1").await;
        join(&hub, "other", key, &out).await;
        publish(&hub, "ch", 2).await;
        let epoch = hub
            .broker()
            .history("ch", &HistoryQuery::default(), &ns().stream_options())
            .await
            .unwrap()
            .position
            .epoch;
        // Offset 4 arrives after 2, but 3 was never stored: history cannot fill the gap.
        hub.deliver("ch", &epoch, publication(4));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let drained = out.drain();
        assert_eq!(drained.frames.len(), 2, "1 and 2 were delivered");
        assert!(drained.close.is_none(), "the connection stays");
        assert!(
            matches!(&drained.controls[..], [Control::Lost { channel, .. }] if channel == "ch")
        );
        assert_eq!(hub.metrics().continuity_lost.get(), 1);
        // The other channel still delivers.
        publish(&hub, "other", 1).await;
        assert_eq!(offsets(&out), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn gap_is_caught_up_from_history_in_order() {
        let broker = Arc::new(LossyBroker::new());
        let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
        hub.start().await.unwrap();
        let (_, out) = subscribed(&hub, "ch", "c1").await;
        publish(&hub, "ch", 1).await;
        broker.lose(&[2, 3]);
        publish(&hub, "ch", 2).await;
        assert_eq!(offsets(&out), vec![1], "2 and 3 never arrived");
        publish(&hub, "ch", 1).await; // 4 reveals the gap: 2 and 3 come from history first
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(offsets(&out), vec![2, 3, 4]);
        assert_eq!(hub.metrics().catchups.get(), 1);
        assert!(lost(&out).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn first_delivery_after_the_reply_is_checked_against_its_position() {
        let broker = Arc::new(LossyBroker::new());
        let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
        hub.start().await.unwrap();
        publish(&hub, "ch", 2).await;
        let out = Arc::new(Outbound::new(1 << 20));
        let key = hub.register("c1".into(), "u".into(), out.clone());
        let pos = hub
            .prepare_subscription("ch", key, &out, None, &ns())
            .await
            .unwrap()
            .position;
        assert_eq!(pos.offset, 2);
        // 3 is published but never reaches this node; 4 does, before the reply is queued.
        broker.lose(&[3]);
        publish(&hub, "ch", 2).await;
        hub.activate("ch", key, &pos);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(offsets(&out), vec![3, 4], "the hole at 3 is caught up");
    }

    /// Two subscribers pending on a channel without a baseline; the newer reply activates
    /// first and sets the baseline. The older one must still get everything after its own
    /// reply position, from the publications held meanwhile.
    #[tokio::test]
    async fn an_older_reply_activated_after_a_newer_one_misses_nothing() {
        let hub = hub().await;
        publish(&hub, "ch", 10).await;
        let (a_out, b_out) = (
            Arc::new(Outbound::new(1 << 20)),
            Arc::new(Outbound::new(1 << 20)),
        );
        let a = hub.register("a".into(), "u".into(), a_out.clone());
        let b = hub.register("b".into(), "u".into(), b_out.clone());
        let a_pos = hub
            .prepare_subscription("ch", a, &a_out, None, &ns())
            .await
            .unwrap()
            .position;
        publish(&hub, "ch", 2).await; // 11 and 12 are held: no baseline yet
        let b_pos = hub
            .prepare_subscription("ch", b, &b_out, None, &ns())
            .await
            .unwrap()
            .position;
        assert_eq!((a_pos.offset, b_pos.offset), (10, 12));
        publish(&hub, "ch", 1).await; // 13
        hub.activate("ch", b, &b_pos);
        hub.activate("ch", a, &a_pos);
        assert_eq!(offsets(&b_out), vec![13]);
        assert_eq!(offsets(&a_out), vec![11, 12, 13]);
        publish(&hub, "ch", 1).await;
        assert_eq!(offsets(&a_out), vec![14]);
        assert!(lost(&a_out).is_empty());
    }

    /// A reply older than what the channel already delivered before the subscriber was pending
    /// cannot be completed from what the hub holds: the subscriber is told (4003), not left
    /// with a hole.
    #[tokio::test]
    async fn a_reply_older_than_the_baseline_is_told_not_left_with_a_hole() {
        let hub = hub().await;
        let (_, first) = subscribed(&hub, "ch", "first").await;
        publish(&hub, "ch", 12).await;
        assert_eq!(offsets(&first).len(), 12);
        let out = Arc::new(Outbound::new(1 << 20));
        let key = hub.register("late".into(), "u".into(), out.clone());
        hub.prepare_subscription("ch", key, &out, None, &ns())
            .await
            .unwrap();
        // As if its history read had been stale: position 10 while 11 and 12 went out before.
        let stale = hub
            .broker()
            .history("ch", &HistoryQuery::default(), &ns().stream_options())
            .await
            .unwrap()
            .position;
        let stale = StreamPosition {
            epoch: stale.epoch,
            offset: 10,
        };
        hub.activate("ch", key, &stale);
        assert_eq!(lost(&out), vec!["ch".to_string()]);
        publish(&hub, "ch", 1).await;
        assert!(offsets(&out).is_empty(), "nothing after the hole");
        assert_eq!(offsets(&first), vec![13]);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_tail_is_found_by_the_tail_check() {
        let broker = Arc::new(LossyBroker::new());
        let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
        hub.start().await.unwrap();
        let (_, out) = subscribed(&hub, "ch", "c1").await;
        publish(&hub, "ch", 1).await;
        broker.lose(&[2]);
        publish(&hub, "ch", 1).await; // the last of the burst, lost: nothing follows it
        assert_eq!(offsets(&out), vec![1]);
        tokio::time::sleep(TAIL_CHECK_EVERY * 3).await;
        assert_eq!(offsets(&out), vec![2]);
        assert_eq!(hub.metrics().tail_gaps.get(), 1);
    }

    #[tokio::test]
    async fn changed_epoch_loses_the_channel_and_the_next_reply_sets_a_new_baseline() {
        let hub = hub().await;
        let (_, out) = subscribed(&hub, "ch", "c1").await;
        hub.deliver("ch", "another-epoch", publication(7));
        assert_eq!(lost(&out), vec!["ch".to_string()]);
        assert!(out.drain().frames.is_empty(), "nothing from the new epoch");
        hub.unsubscribe("ch", ConnKey(1)).await;
        let (_, again) = subscribed(&hub, "ch", "c2").await;
        publish(&hub, "ch", 2).await;
        assert_eq!(offsets(&again), vec![1, 2]);
    }

    #[tokio::test]
    async fn duplicates_are_dropped() {
        let hub = hub().await;
        let (_, out) = subscribed(&hub, "ch", "c1").await;
        let pos = hub
            .broker()
            .history("ch", &HistoryQuery::default(), &ns().stream_options())
            .await
            .unwrap()
            .position;
        publish(&hub, "ch", 2).await;
        let p = Publication {
            offset: 2,
            data: Bytes::from_static(b"x"),
            info: None,
        };
        hub.deliver("ch", &pos.epoch, p);
        assert_eq!(offsets(&out), vec![1, 2]);
    }

    #[tokio::test]
    async fn last_unsubscribe_removes_the_channel() {
        let hub = hub().await;
        let (key, _out) = subscribed(&hub, "ch", "c1").await;
        assert_eq!(hub.channels(), vec![("ch".to_string(), 1)]);
        hub.unsubscribe("ch", key).await;
        assert!(hub.channels().is_empty());
        publish(&hub, "ch", 1).await;
        assert_eq!(hub.metrics().publications_without_subscriber.get(), 1);
    }
}
