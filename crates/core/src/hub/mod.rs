//! The hub: channels → local subscribers, fan-out, continuity (gap catch-up) and the client
//! registry the HTTP API acts through.
//!
//! # Data path of one publication
//! broker → [`Hub::deliver`] → the channel's subscriber map → the frame, encoded once, is pushed
//! to each connection's [`Outbound`] queue → once the channel's lock is released, the hub writes
//! it to the connections that allow direct writes (spread over the runtime's workers for a large
//! channel), and each connection's task writes the rest, woken by its queue.
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
//! delivered since the last check is looked at on the next tick, every other channel about once a
//! minute (see [`TAIL_CHECK_EVERY`]); a gap seen on two checks in a row is caught up.
//!
//! # Locks
//! Channel maps are sharded `std::sync::Mutex`es, never held across an `.await` and never held
//! while calling the broker. Broker subscribe/unsubscribe for one channel are serialized by a
//! striped async mutex, so a last-leave and a first-join cannot reorder at the broker.
//!
//! # Layout
//! - this file: the types, construction, the broker handler and publishing;
//! - [`connections`]: the client registry the HTTP API acts through;
//! - [`subscriptions`]: subscribe (pending → live) and unsubscribe;
//! - [`fanout`]: in-order delivery, gap catch-up and losing a channel;
//! - [`membership`]: presence and the join/leave pushes, for every protocol;
//! - [`presence_batch`]: join/leave pushes collected per channel and interval;
//! - [`tail`]: the periodic tail check;
//! - [`control`]: control messages between nodes and node liveness.
//! - [`traced`]: the `fanout` span of a traced publication.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::flights::Flights;
use bytes::Bytes;
use herald_broker::{
    Backoff, BrokerError, BrokerHandler, ControlMessage, HistoryQuery, HistoryResult, NodeInfo,
    PublishOptions, PublishTarget, SharedBroker, StreamOptions,
};
use herald_protocol::encode::{push_presence_change, push_publication};
use herald_protocol::tags::TagFilter;
use herald_protocol::{ClientInfo, CloseCode, Publication, StreamPosition};

use crate::config::{Backpressure, NamespaceConfig};
use crate::delta::{DeltaFrames, DeltaSubscriber};
use crate::metrics::Metrics;
use crate::outbound::{CloseRequest, Control, Outbound, Sheddable};
use crate::recovery::{decide, SubscribeResult};

mod connections;
mod control;
mod fanout;
mod membership;
mod presence_batch;
pub use presence_batch::JoinLeaveBatch;
mod subscriptions;
mod tail;
mod traced;

const SHARDS: usize = 64;
const TRANSITION_STRIPES: usize = 256;
/// How often a node tells the others about itself, and when it is forgotten.
const NODE_INFO_EVERY: Duration = Duration::from_secs(5);
const NODE_INFO_EXPIRES: Duration = Duration::from_secs(15);
/// Catch-up retries while the broker is unavailable: 100 ms doubling to 3.2 s (about 6 s in all).
const CATCHUP_RETRY_FIRST: Duration = Duration::from_millis(100);
const CATCHUP_RETRY_LAST: Duration = Duration::from_millis(3200);
/// How often the tail check runs. A gap at the tail of a channel that delivered in the last tick
/// is caught up within about two ticks; any other channel's within [`TAIL_SWEEP_TICKS`] ticks
/// (about a minute). Both while a node has at most [`TAIL_CHECKS_PER_TICK`] channels due a tick;
/// past that they take turns (see `Hub::check_tails`).
pub const TAIL_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Broker reads the tail check makes at most per tick (the rest wait for the next tick): bounds
/// what a node with many busy channels asks of the broker.
const TAIL_CHECKS_PER_TICK: usize = 512;
/// Ticks after which a channel that delivered nothing is checked again.
const TAIL_SWEEP_TICKS: u32 = 64;
/// Deliveries held for a channel that has no baseline yet (while its first reply is built).
const EARLY_MAX: usize = 10_000;
/// The newest publications a channel keeps on its node, so that a subscriber coming back with
/// `since` a few publications behind is answered without a broker read (a reconnect storm
/// otherwise sends the broker one read per channel and `since`): at most this many and
/// [`RECENT_MAX_BYTES`] of data, and only for channels with [`RECENT_MIN_SUBSCRIBERS`] or more
/// subscribers on the node, so that many small channels hold nothing extra.
const RECENT_MAX: usize = 64;
const RECENT_MAX_BYTES: usize = 64 * 1024;
const RECENT_MIN_SUBSCRIBERS: usize = 16;

/// The hasher of maps keyed by [`ConnKey`]: SipHash with fixed keys, as fast as the default and
/// safe here (the node assigns the keys, no client chooses them), and the same in every process,
/// so that a fan-out wakes connections in one order and a simulation (crates/sim) replays a seed.
type FixedState = std::hash::BuildHasherDefault<DefaultHasher>;

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
    /// The namespace's answer to this subscriber falling behind (see [`crate::outbound`]).
    backpressure: Backpressure,
    /// Set when the subscription asked for delta compression (see [`crate::delta`]).
    delta: Option<DeltaSubscriber>,
    /// Set when the subscription has a tag filter: only matching publications reach it (boxed:
    /// most subscribers have none, and pay one pointer for it).
    filter: Option<Box<TagFilter>>,
}

struct Channel {
    subscribers: HashMap<ConnKey, Subscriber, FixedState>,
    /// The baseline: epoch and last offset delivered (both `None` until the first activation).
    epoch: Option<String>,
    last_offset: Option<u64>,
    /// Deliveries that arrived while the channel had no baseline (with their epoch).
    early: Vec<(String, Publication)>,
    /// Some while a catch-up from history runs: live publications wait here.
    catchup: Option<Vec<Publication>>,
    /// The newest publications delivered, contiguous and ending at `last_offset` (see
    /// [`RECENT_MAX`]), and the bytes of their data.
    recent: VecDeque<Publication>,
    recent_bytes: usize,
    /// Delivered since the last tail check.
    active: bool,
    /// The tail-check tick that last read this channel's position (0: never).
    checked_at: u32,
    /// The broker's position when the last tail check found it ahead of the baseline.
    tail_ahead: Option<StreamPosition>,
    /// Moves on with every publication that reaches the channel; unique per incarnation of the
    /// channel on this node (its base comes from [`Shared::incarnations`]). Subscribers that
    /// registered at the same generation may share a history read (see [`crate::flights`]).
    generation: u64,
    opts: StreamOptions,
    /// The last publication delivered (offset, data), kept while the channel has delta
    /// subscribers: the base of the next publication's delta.
    delta_base: Option<(u64, Bytes)>,
}

impl Channel {
    fn new(opts: StreamOptions, generation: u64) -> Self {
        Channel {
            generation,
            subscribers: HashMap::default(),
            epoch: None,
            last_offset: None,
            early: Vec::new(),
            catchup: None,
            recent: VecDeque::new(),
            recent_bytes: 0,
            active: false,
            checked_at: 0,
            tail_ahead: None,
            opts,
            delta_base: None,
        }
    }

    /// Keep `p`, just delivered in order, among the channel's recent publications.
    fn remember(&mut self, p: &Publication) {
        if self.subscribers.len() < RECENT_MIN_SUBSCRIBERS || p.data.len() > RECENT_MAX_BYTES {
            // Skipping one would leave a hole: start again from the next.
            self.forget_recent();
            return;
        }
        self.recent_bytes += p.data.len();
        self.recent.push_back(p.clone());
        while self.recent.len() > RECENT_MAX || self.recent_bytes > RECENT_MAX_BYTES {
            let dropped = self.recent.pop_front().expect("not empty");
            self.recent_bytes -= dropped.data.len();
        }
    }

    fn forget_recent(&mut self) {
        self.recent = VecDeque::new();
        self.recent_bytes = 0;
    }

    /// The history a new subscriber's reply needs, if the node holds it: the channel's position
    /// (its baseline) and, with `since` in the same epoch, the publications after it, at most
    /// `max` of them (the namespace's history size, so never more than the broker would keep).
    /// `None`: ask the broker.
    ///
    /// Answering from the baseline is what a broker read followed by the first deliveries gives:
    /// publications the broker holds beyond the baseline reach the subscriber (pending from the
    /// same moment) through delivery, and an epoch the node has not seen change yet is found by
    /// the next delivery or tail check, which tells the subscriber (`unsub` 4003).
    fn local_history(&self, since: Option<&StreamPosition>, max: usize) -> Option<HistoryResult> {
        if self.catchup.is_some() {
            return None;
        }
        let (epoch, last) = (self.epoch.as_ref()?, self.last_offset?);
        let position = StreamPosition {
            epoch: epoch.clone(),
            offset: last,
        };
        let publications = match since {
            None => Vec::new(),
            Some(since) if since.epoch == *epoch && since.offset <= last => {
                let missed = usize::try_from(last - since.offset).ok()?;
                if missed > max || missed > self.recent.len() {
                    return None;
                }
                self.recent
                    .range(self.recent.len() - missed..)
                    .cloned()
                    .collect()
            }
            Some(_) => return None,
        };
        Some(HistoryResult {
            position,
            publications,
            continuous: true,
            stored_at_ms: Vec::new(),
        })
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
    /// The tail check's next tick number.
    tail_tick: AtomicU64,
    /// Channel incarnations created so far; each starts its generation at this << 32.
    incarnations: AtomicU64,
    /// History reads in flight, shared by subscribers asking the same at the same generation.
    flights: Flights,
    /// Joins and leaves waiting for their channel's batch.
    presence_batches: presence_batch::PresenceBatches,
    /// Where lifecycle events go, when the server installed a sink.
    lifecycle: std::sync::OnceLock<Arc<dyn crate::lifecycle::LifecycleSink>>,
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
    fn on_traced_publication(
        &self,
        channel: &str,
        epoch: &str,
        publication: Publication,
        traceparent: &str,
    ) {
        if let Some(shared) = self.0.upgrade() {
            Hub { shared }.deliver_traced(channel, epoch, publication, traceparent);
        }
    }
    fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo) {
        if let Some(shared) = self.0.upgrade() {
            Hub { shared }.on_presence_change(channel, joined, who);
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
                tail_tick: AtomicU64::new(1),
                incarnations: AtomicU64::new(0),
                flights: Flights::default(),
                presence_batches: Default::default(),
                lifecycle: std::sync::OnceLock::new(),
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

    /// Install the lifecycle sink (once, at startup; a second call is ignored).
    pub fn set_lifecycle(&self, sink: Arc<dyn crate::lifecycle::LifecycleSink>) {
        let _ = self.shared.lifecycle.set(sink);
    }

    /// The lifecycle sink, when one is installed.
    pub fn lifecycle(&self) -> Option<&Arc<dyn crate::lifecycle::LifecycleSink>> {
        self.shared.lifecycle.get()
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

    /// Publish the same data to several channels through the broker (a broadcast), timing it
    /// for `/metrics` as one publish per channel stored. Results in `targets`' order.
    pub async fn publish_many(
        &self,
        targets: &[PublishTarget],
        data: Bytes,
        info: Option<ClientInfo>,
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        let started = Instant::now();
        let results = self.shared.broker.publish_many(targets, data, info).await;
        let seconds = started.elapsed().as_secs_f64();
        let metrics = &self.shared.metrics;
        for _ in results.iter().filter(|r| r.is_ok()) {
            metrics.publish_seconds.observe(seconds);
            metrics.publications.inc();
        }
        results
    }
}

// Tests that wait for the catch-up task run on paused time: a sleep there returns once every task
// is idle (the in-memory broker does no I/O), however slow the machine, and costs no wall-clock time.
#[cfg(test)]
mod tests;
