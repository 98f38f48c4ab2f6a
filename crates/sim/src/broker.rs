//! The simulated broker: a server model with the failure modes Redis, Redis Cluster and NATS
//! JetStream really have, and the node-side [`Broker`] that talks to it.
//!
//! # The server ([`Server`])
//! One task owns the streams and serves requests in simulated time. A request, a reply and a
//! pub/sub delivery each travel with a latency; the server handles everything due at one instant
//! in an order fixed by the content of the messages (never by which node's task ran first), so a
//! seed replays the same trace. Streams follow the Redis scripts (`broker-redis/src/scripts.rs`):
//! a stream is bound to the server identity (`run_id`) that created it, a stream below the node's
//! watermark in the same epoch starts over, history is trimmed by size and age, an idempotency key
//! returns the earlier position, and a read creates the stream so that readers and the first
//! publisher agree on the epoch.
//!
//! Faults ([`Faults`] for the steady ones, [`Fault`] for the events):
//! - a pub/sub message lost while history keeps it;
//! - a pub/sub message delayed past later ones (a publish acknowledged, its message late);
//! - slow commands, and failed ones (before or after they took effect: a publish may be stored
//!   and its reply lost);
//! - a node's link dropped (and, for a while, refused: a partition), restored by the node;
//! - a restart with all data, a restart from an older snapshot (rollback), a lagging replica
//!   promoted (the same data loss under another server identity), a restart with no data.
//!
//! # The node side ([`NodeBroker`])
//! What `herald-broker-redis` does on the node, reduced to its decisions: it reads the server's
//! identity when its link opens and passes it, with the node's [`Watermarks`], to every publish and
//! read; a lost link fails calls fast with "unavailable", reconnects with backoff, subscribes every
//! hosted channel again and then calls [`BrokerHandler::on_reconnected`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, BrokerHandler, ControlMessage, HistoryQuery, HistoryResult,
    PublishOptions, StreamOptions, Watermarks,
};
use herald_protocol::{ClientInfo, Publication, StreamPosition};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::rng::{stable_hash, Rng};

/// The steady fault rates of a run (all zero: a perfect broker with a little latency).
#[derive(Debug, Clone)]
pub struct Faults {
    /// One-way latency of a request, a reply or a delivery, in ms (inclusive range).
    pub latency_ms: (u64, u64),
    /// Probability that a pub/sub delivery to a node is lost (history keeps it).
    pub pubsub_loss: f64,
    /// Probability that a delivery is held back 50–400 ms, past later ones.
    pub pubsub_late: f64,
    /// Probability that a command takes 50–600 ms longer.
    pub slow_command: f64,
    /// Probability that a command fails ("unavailable"): half before it takes effect, half after.
    pub failed_command: f64,
    /// Probability that a history read is served from the stream as it was 10–300 ms earlier (same
    /// epoch), as a read served by a replica behind the pub/sub messages can be (NATS reads from a
    /// replica): a reply older than deliveries the node already had.
    pub stale_read: f64,
}

impl Faults {
    /// No faults, 0–1 ms latency (the conformance suite).
    pub fn none() -> Self {
        Faults {
            latency_ms: (0, 1),
            pubsub_loss: 0.0,
            pubsub_late: 0.0,
            slow_command: 0.0,
            failed_command: 0.0,
            stale_read: 0.0,
        }
    }
}

/// A fault event, injected at a moment of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Drop this node's link; refuse its reconnects for this long (0: a plain reset).
    CutLink { node: String, refuse_ms: u64 },
    /// Restart: down for `down_ms`, then up with a new identity and the data as `data` says.
    Restart { down_ms: u64, data: Restored },
    /// The faults stopped: commands no longer fail. Pub/sub messages are still lost and late now
    /// and then, so a lost tail must be found by the tail check, whose bound (one sweep of the
    /// hub's shards) holds only while its broker reads succeed: a failed read is retried a sweep
    /// later.
    Calm,
}

/// What a restarted server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// Everything it had (AOF `always`, a NATS file store that lost nothing).
    All,
    /// A snapshot about this many ms old (RDB after `kill -9`, a restored file store).
    Snapshot { age_ms: u64 },
    /// A replica this many ms behind, promoted (failover): the same loss, another identity.
    Replica { lag_ms: u64 },
    /// Nothing (no persistence).
    Nothing,
}

/// How the node side binds epochs (the rollback defences; both on by default).
#[derive(Debug, Clone, Copy)]
pub struct NodeOptions {
    /// Pass the server identity read at link open (Redis `run_id`, NATS boot id): a stream made by
    /// another server life starts a new epoch. Off: `synchronous_persistence = true`.
    pub bind_identity: bool,
    /// Pass the node's watermark: a stream below what the node saw starts a new epoch.
    pub watermarks: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            bind_identity: true,
            watermarks: true,
        }
    }
}

#[derive(Clone)]
struct Stream {
    epoch: String,
    top: u64,
    /// Identity of the server life that created the stream (0: bound to none).
    ident: u64,
    entries: VecDeque<(Publication, Instant)>,
    /// Idempotency key → (epoch, offset).
    keys: BTreeMap<String, (String, u64)>,
}

/// What a server persists (and what snapshots copy).
#[derive(Clone, Default)]
struct Data {
    streams: BTreeMap<String, Stream>,
}

/// A node's pub/sub link.
struct Link {
    node: String,
    tx: mpsc::UnboundedSender<Push>,
    /// When the last in-order delivery on this link arrives (a link is FIFO).
    last_delivery: Instant,
}

/// What the server pushes to a node over its link.
#[derive(Debug)]
pub enum Push {
    /// A publication on a subscribed channel.
    Publication {
        channel: String,
        epoch: String,
        publication: Publication,
    },
    /// A presence change.
    Presence {
        channel: String,
        joined: bool,
        who: ClientInfo,
    },
    /// A control message.
    Control(ControlMessage),
}

/// A command from a node.
#[derive(Debug, Clone)]
pub enum Request {
    Publish {
        channel: String,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: PublishOptions,
        floor: (String, u64),
        ident: u64,
    },
    History {
        channel: String,
        query: HistoryQuery,
        opts: StreamOptions,
        floor: (String, u64),
        ident: u64,
    },
    Subscribe(String),
    Unsubscribe(String),
    AddPresence(String, ClientInfo),
    RemovePresence(String, String),
    Presence(String),
    PresenceChange(String, bool, ClientInfo),
    Control(ControlMessage),
}

impl Request {
    /// A key fixed by the content: the order among commands due at the same instant.
    fn key(&self, link: u64) -> u64 {
        let text = match self {
            Request::Publish {
                channel,
                data,
                opts,
                ..
            } => format!("p{channel}{data:?}{:?}", opts.idempotency_key),
            Request::History { channel, query, .. } => format!("h{channel}{query:?}"),
            Request::Subscribe(c) => format!("s{c}"),
            Request::Unsubscribe(c) => format!("u{c}"),
            Request::AddPresence(c, w) => format!("a{c}{}", w.client),
            Request::RemovePresence(c, w) => format!("r{c}{w}"),
            Request::Presence(c) => format!("q{c}"),
            Request::PresenceChange(c, j, w) => format!("j{c}{j}{}", w.client),
            Request::Control(m) => match m {
                // Node info carries the uptime of a real clock: order by the sender only.
                ControlMessage::NodeInfo(i) => format!("n{}", i.name),
                other => format!("c{other:?}"),
            },
        };
        stable_hash(&(link, text))
    }
}

/// A server's answer.
#[derive(Debug)]
pub enum Reply {
    Position(StreamPosition),
    History(HistoryResult),
    Presence(Vec<ClientInfo>),
    Done,
}

type ReplyTx = oneshot::Sender<Result<Reply, BrokerError>>;

enum Event {
    Request {
        link: u64,
        req: Request,
        reply: ReplyTx,
    },
    Reply {
        link: u64,
        reply: ReplyTx,
        result: Result<Reply, BrokerError>,
    },
    Deliver {
        link: u64,
        push: Push,
    },
    Fault(Fault),
    Up,
}

/// Counts of what happened at the server, for the run's report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServerStats {
    pub publishes: u64,
    pub deliveries: u64,
    pub deliveries_lost: u64,
    pub deliveries_late: u64,
    pub commands_failed: u64,
    pub commands_slow: u64,
    pub restarts: u64,
    pub rollbacks: u64,
    pub link_cuts: u64,
    pub new_epochs_on_rollback: u64,
    pub stale_reads: u64,
}

struct State {
    data: Data,
    /// The identity of this server life (Redis `run_id`, NATS boot id).
    ident: u64,
    up: bool,
    links: BTreeMap<u64, Link>,
    next_link: u64,
    subs: BTreeMap<String, BTreeSet<u64>>,
    presence: BTreeMap<String, BTreeMap<String, ClientInfo>>,
    /// Nodes refused until then (a partition).
    refused: BTreeMap<String, Instant>,
    /// Due events: (when, content key, arrival sequence) → event.
    queue: BTreeMap<(Instant, u64, u64), Event>,
    seq: u64,
    /// Arrived, not yet given a time: (extra delay, key, event).
    inbox: Vec<(Duration, u64, Event)>,
    /// (when, data), oldest first: what a restart from a snapshot or a replica may come back with.
    snapshots: VecDeque<(Instant, Data)>,
    last_snapshot: Option<Instant>,
    rng: Rng,
    faults: Faults,
    stats: ServerStats,
    /// The server's clock as last seen by its task.
    now: Option<Instant>,
    /// When its task first ran (for `HERALD_SIM_DEBUG`'s times).
    started: Option<Instant>,
    /// (link, reply?) → when its last command arrives / its last reply leaves: links are FIFO.
    fifo: BTreeMap<(u64, bool), Instant>,
}

/// The simulated broker server. See the module docs.
pub struct Server {
    state: Mutex<State>,
    wake: Notify,
}

const SNAPSHOT_EVERY: Duration = Duration::from_millis(100);
const SNAPSHOTS_KEPT: usize = 100;

impl Server {
    /// A server whose random choices come from `seed`.
    pub fn new(seed: u64, faults: Faults) -> Arc<Self> {
        let mut rng = Rng::new(seed, "broker");
        let ident = rng.next_u64() | 1;
        Arc::new(Server {
            state: Mutex::new(State {
                data: Data::default(),
                ident,
                up: true,
                links: BTreeMap::new(),
                next_link: 1,
                subs: BTreeMap::new(),
                presence: BTreeMap::new(),
                refused: BTreeMap::new(),
                queue: BTreeMap::new(),
                seq: 0,
                inbox: Vec::new(),
                snapshots: VecDeque::new(),
                last_snapshot: None,
                rng,
                faults,
                stats: ServerStats::default(),
                now: None,
                started: None,
                fifo: BTreeMap::new(),
            }),
            wake: Notify::new(),
        })
    }

    /// What happened so far.
    pub fn stats(&self) -> ServerStats {
        self.lock().stats.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("server lock")
    }

    /// Inject a fault; the server's task acts on it at its next instant.
    pub fn inject(&self, fault: Fault) {
        let key = stable_hash(&format!("{fault:?}"));
        self.lock()
            .inbox
            .push((Duration::ZERO, key, Event::Fault(fault)));
        self.wake.notify_one();
    }

    /// Open a link for `node`: its id, the server identity, and the receiving end of its pushes.
    /// Fails while the server is down or the node is partitioned from it.
    #[allow(clippy::type_complexity)]
    pub fn connect(
        &self,
        node: &str,
    ) -> Result<(u64, u64, mpsc::UnboundedReceiver<Push>), BrokerError> {
        let mut s = self.lock();
        if !s.up {
            return Err(BrokerError::unavailable("connection refused (broker down)"));
        }
        if let (Some(until), Some(now)) = (s.refused.get(node), s.now) {
            if *until > now {
                return Err(BrokerError::unavailable("connection refused (partition)"));
            }
        }
        let id = s.next_link;
        s.next_link += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        let last_delivery = s.now.unwrap_or_else(Instant::now);
        s.links.insert(
            id,
            Link {
                node: node.to_owned(),
                tx,
                last_delivery,
            },
        );
        Ok((id, s.ident, rx))
    }

    /// Send a command over link `link`; the answer comes back through the returned receiver.
    pub fn submit(&self, link: u64, req: Request) -> oneshot::Receiver<Result<Reply, BrokerError>> {
        let (tx, rx) = oneshot::channel();
        let key = req.key(link);
        self.lock().inbox.push((
            Duration::ZERO,
            key,
            Event::Request {
                link,
                req,
                reply: tx,
            },
        ));
        self.wake.notify_one();
        rx
    }

    /// The server's task: serve events as they fall due. Runs until the runtime ends.
    pub async fn run(self: Arc<Self>) {
        loop {
            let next = {
                let mut s = self.lock();
                let now = Instant::now();
                s.now = Some(now);
                s.started.get_or_insert(now);
                s.take_inbox(now);
                s.snapshot(now);
                while let Some((&(at, key, seq), _)) = s.queue.first_key_value() {
                    if at > now {
                        break;
                    }
                    let event = s.queue.remove(&(at, key, seq)).expect("first");
                    s.handle(now, event);
                    s.take_inbox(now);
                }
                s.queue.first_key_value().map(|(&(at, _, _), _)| at)
            };
            let notified = self.wake.notified();
            match next {
                Some(at) => {
                    tokio::select! {
                        biased;
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

impl State {
    fn latency(&mut self) -> Duration {
        let (lo, hi) = self.faults.latency_ms;
        Duration::from_millis(self.rng.range(lo, hi))
    }

    fn schedule(&mut self, at: Instant, key: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at, key, self.seq), event);
    }

    /// Give every event that arrived a time: now plus a latency, drawn in content order.
    fn take_inbox(&mut self, now: Instant) {
        let mut inbox = std::mem::take(&mut self.inbox);
        // A link is one connection: its commands arrive in the order it sent them. Links (and
        // faults) are taken in a fixed order, whichever node's task ran first.
        inbox.sort_by_key(|(_, key, event)| match event {
            Event::Request { link, .. } => (*link, 0),
            _ => (0, *key),
        });
        for (extra, key, event) in inbox {
            let at = match &event {
                Event::Fault(_) => now,
                Event::Request { link, .. } => {
                    let at = now + extra + self.latency();
                    let last = self.fifo.entry((*link, false)).or_insert(at);
                    *last = (*last).max(at);
                    *last
                }
                _ => now + extra + self.latency(),
            };
            self.schedule(at, key, event);
        }
    }

    fn snapshot(&mut self, now: Instant) {
        if self.last_snapshot.is_some_and(|t| now < t + SNAPSHOT_EVERY) {
            return;
        }
        self.last_snapshot = Some(now);
        self.snapshots.push_back((now, self.data.clone()));
        while self.snapshots.len() > SNAPSHOTS_KEPT {
            self.snapshots.pop_front();
        }
    }

    fn handle(&mut self, now: Instant, event: Event) {
        match event {
            Event::Request { link, req, reply } => self.request(now, link, req, reply),
            Event::Reply {
                link,
                reply,
                result,
            } => {
                // A reply on a link that was cut meanwhile never arrives: the caller learns of the
                // cut instead (its command may have taken effect).
                let result = if self.links.contains_key(&link) {
                    result
                } else {
                    Err(BrokerError::unavailable("connection reset"))
                };
                let _ = reply.send(result);
            }
            Event::Deliver { link, push } => {
                if let Some(l) = self.links.get(&link) {
                    if l.tx.send(push).is_err() {
                        self.drop_link(link);
                    } else {
                        self.stats.deliveries += 1;
                    }
                }
            }
            Event::Fault(f) => self.fault(now, f),
            Event::Up => {
                self.up = true;
            }
        }
    }

    fn request(&mut self, now: Instant, link: u64, req: Request, reply: ReplyTx) {
        if std::env::var_os("HERALD_SIM_DEBUG").is_some() {
            let what = match &req {
                Request::Control(_) => "control".to_owned(),
                other => format!("{other:?}"),
            };
            let node = self.links.get(&link).map_or("-", |l| l.node.as_str());
            eprintln!(
                "{} ms link {link} ({node}) {}",
                now.duration_since(self.started.unwrap_or(now)).as_millis(),
                &what[..what.len().min(160)]
            );
        }
        if !self.up || !self.links.contains_key(&link) {
            let _ = reply.send(Err(BrokerError::unavailable("connection reset")));
            return;
        }
        let key = req.key(link);
        let fail = self.rng.chance(self.faults.failed_command);
        let fail_before = fail && self.rng.chance(0.5);
        let slow = self.rng.chance(self.faults.slow_command);
        let extra = if slow {
            self.stats.commands_slow += 1;
            Duration::from_millis(self.rng.range(50, 600))
        } else {
            Duration::ZERO
        };
        let result = if fail_before {
            Err(BrokerError::unavailable("command failed"))
        } else {
            Ok(self.apply(now, link, req))
        };
        let result = if fail {
            self.stats.commands_failed += 1;
            Err(BrokerError::unavailable("command timed out"))
        } else {
            result
        };
        if std::env::var_os("HERALD_SIM_DEBUG").is_some() && (fail || slow) {
            eprintln!(
                "{} ms link {link}: the command above {}",
                now.duration_since(self.started.unwrap_or(now)).as_millis(),
                if fail { "failed" } else { "is slow" }
            );
        }
        // Replies come back in order on the link (a slow command holds up the ones behind it).
        let at = now + extra + self.latency();
        let last = self.fifo.entry((link, true)).or_insert(at);
        *last = (*last).max(at);
        let at = *last;
        self.schedule(
            at,
            key,
            Event::Reply {
                link,
                reply,
                result,
            },
        );
    }

    fn new_epoch(&mut self) -> String {
        format!("{:016x}", self.rng.next_u64())
    }

    /// The channel's stream as the scripts see it: created, or started over when it was bound to
    /// another server life or is below the node's watermark.
    fn stream(&mut self, channel: &str, floor: &(String, u64), ident: u64) -> &mut Stream {
        let stale = match self.data.streams.get(channel) {
            None => true,
            Some(s) if ident != 0 && s.ident != ident => {
                self.stats.new_epochs_on_rollback += 1;
                true
            }
            Some(s) if s.epoch == floor.0 && s.top < floor.1 => {
                self.stats.new_epochs_on_rollback += 1;
                true
            }
            Some(_) => false,
        };
        if stale {
            let epoch = self.new_epoch();
            self.data.streams.insert(
                channel.to_owned(),
                Stream {
                    epoch,
                    top: 0,
                    ident,
                    entries: VecDeque::new(),
                    keys: BTreeMap::new(),
                },
            );
        }
        self.data.streams.get_mut(channel).expect("inserted")
    }

    fn apply(&mut self, now: Instant, link: u64, req: Request) -> Reply {
        match req {
            Request::Publish {
                channel,
                data,
                info,
                opts,
                floor,
                ident,
            } => {
                let stream = self.stream(&channel, &floor, ident);
                if let Some(key) = &opts.idempotency_key {
                    if let Some((epoch, offset)) = stream.keys.get(key) {
                        if *epoch == stream.epoch {
                            return Reply::Position(StreamPosition {
                                epoch: epoch.clone(),
                                offset: *offset,
                            });
                        }
                    }
                }
                stream.top += 1;
                let publication = Publication {
                    offset: stream.top,
                    data,
                    info,
                    tags: opts.tags.clone(),
                };
                if let Some(key) = &opts.idempotency_key {
                    stream
                        .keys
                        .insert(key.clone(), (stream.epoch.clone(), stream.top));
                }
                let size = opts.stream.history_size;
                if size > 0 {
                    stream.entries.push_back((publication.clone(), now));
                    while stream.entries.len() > size {
                        stream.entries.pop_front();
                    }
                } else {
                    stream.entries.clear();
                }
                trim_age(stream, &opts.stream, now);
                let position = StreamPosition {
                    epoch: stream.epoch.clone(),
                    offset: stream.top,
                };
                self.stats.publishes += 1;
                let _ = link;
                self.fan_out(now, &channel, &position.epoch, publication);
                Reply::Position(position)
            }
            Request::History {
                channel,
                query,
                opts,
                floor,
                ident,
            } => {
                let stale = self.faults.stale_read > 0.0 && self.rng.chance(self.faults.stale_read);
                let lag = if stale {
                    Duration::from_millis(self.rng.range(10, 300))
                } else {
                    Duration::ZERO
                };
                let stream = self.stream(&channel, &floor, ident);
                trim_age(stream, &opts, now);
                let (epoch, top) = (stream.epoch.clone(), stream.top);
                if stale {
                    let old = self
                        .snapshots
                        .iter()
                        .rev()
                        .find(|(t, _)| *t + lag <= now)
                        .and_then(|(_, d)| d.streams.get(&channel))
                        .filter(|s| s.epoch == epoch && s.top <= top);
                    if let Some(old) = old {
                        self.stats.stale_reads += 1;
                        return Reply::History(read_history(old, &query));
                    }
                }
                let stream = self.data.streams.get(&channel).expect("stream");
                Reply::History(read_history(stream, &query))
            }
            Request::Subscribe(channel) => {
                self.subs.entry(channel).or_default().insert(link);
                Reply::Done
            }
            Request::Unsubscribe(channel) => {
                if let Some(links) = self.subs.get_mut(&channel) {
                    links.remove(&link);
                }
                Reply::Done
            }
            Request::AddPresence(channel, who) => {
                self.presence
                    .entry(channel)
                    .or_default()
                    .insert(who.client.clone(), who);
                Reply::Done
            }
            Request::RemovePresence(channel, client) => {
                if let Some(p) = self.presence.get_mut(&channel) {
                    p.remove(&client);
                }
                Reply::Done
            }
            Request::Presence(channel) => Reply::Presence(
                self.presence
                    .get(&channel)
                    .map(|p| p.values().cloned().collect())
                    .unwrap_or_default(),
            ),
            Request::PresenceChange(channel, joined, who) => {
                let links: Vec<u64> = self
                    .subs
                    .get(&channel)
                    .map(|l| l.iter().copied().collect())
                    .unwrap_or_default();
                for l in links {
                    let at = self.in_order_at(now, l);
                    let push = Push::Presence {
                        channel: channel.clone(),
                        joined,
                        who: who.clone(),
                    };
                    self.schedule(at, l, Event::Deliver { link: l, push });
                }
                Reply::Done
            }
            Request::Control(message) => {
                let links: Vec<u64> = self.links.keys().copied().collect();
                for l in links {
                    let at = self.in_order_at(now, l);
                    let push = Push::Control(message.clone());
                    self.schedule(at, l, Event::Deliver { link: l, push });
                }
                Reply::Done
            }
        }
    }

    /// When a delivery sent now on link `l` arrives, after everything sent before it.
    fn in_order_at(&mut self, now: Instant, l: u64) -> Instant {
        let at = now + self.latency();
        let link = self.links.get_mut(&l).expect("link");
        link.last_delivery = link.last_delivery.max(at);
        link.last_delivery
    }

    fn fan_out(&mut self, now: Instant, channel: &str, epoch: &str, publication: Publication) {
        let links: Vec<u64> = self
            .subs
            .get(channel)
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default();
        for l in links {
            if !self.links.contains_key(&l) {
                continue;
            }
            if self.rng.chance(self.faults.pubsub_loss) {
                self.stats.deliveries_lost += 1;
                continue;
            }
            let at = if self.rng.chance(self.faults.pubsub_late) {
                self.stats.deliveries_late += 1;
                now + Duration::from_millis(self.rng.range(50, 400))
            } else {
                self.in_order_at(now, l)
            };
            let push = Push::Publication {
                channel: channel.to_owned(),
                epoch: epoch.to_owned(),
                publication: publication.clone(),
            };
            self.schedule(at, l, Event::Deliver { link: l, push });
        }
    }

    fn drop_link(&mut self, link: u64) {
        if self.links.remove(&link).is_some() {
            for links in self.subs.values_mut() {
                links.remove(&link);
            }
        }
    }

    fn fault(&mut self, now: Instant, fault: Fault) {
        match fault {
            Fault::CutLink { node, refuse_ms } => {
                self.stats.link_cuts += 1;
                let cut: Vec<u64> = self
                    .links
                    .iter()
                    .filter(|(_, l)| l.node == node)
                    .map(|(id, _)| *id)
                    .collect();
                for id in cut {
                    self.drop_link(id);
                }
                self.refused
                    .insert(node, now + Duration::from_millis(refuse_ms));
            }
            Fault::Restart { down_ms, data } => {
                self.stats.restarts += 1;
                let ids: Vec<u64> = self.links.keys().copied().collect();
                for id in ids {
                    self.drop_link(id);
                }
                self.subs.clear();
                self.presence.clear();
                self.ident = self.rng.next_u64() | 1;
                let older = |age_ms: u64, snaps: &VecDeque<(Instant, Data)>| {
                    let cutoff = now.checked_sub(Duration::from_millis(age_ms));
                    snaps
                        .iter()
                        .rev()
                        .find(|(t, _)| cutoff.is_none_or(|c| *t <= c))
                        .or(snaps.front())
                        .map(|(_, d)| d.clone())
                        .unwrap_or_default()
                };
                match data {
                    Restored::All => {}
                    Restored::Snapshot { age_ms: ms } | Restored::Replica { lag_ms: ms } => {
                        self.stats.rollbacks += 1;
                        self.data = older(ms, &self.snapshots);
                        // What the snapshots after it held never happened, as far as this server
                        // knows.
                        let keep = self
                            .snapshots
                            .iter()
                            .filter(|(t, _)| *t + Duration::from_millis(ms) <= now)
                            .count();
                        self.snapshots.truncate(keep.max(1));
                    }
                    Restored::Nothing => self.data = Data::default(),
                }
                if down_ms > 0 {
                    self.up = false;
                    self.schedule(now + Duration::from_millis(down_ms), 0, Event::Up);
                }
            }
            Fault::Calm => self.faults.failed_command = 0.0,
        }
    }
}

fn trim_age(stream: &mut Stream, opts: &StreamOptions, now: Instant) {
    while let Some((_, at)) = stream.entries.front() {
        if now.duration_since(*at) < opts.history_ttl {
            break;
        }
        stream.entries.pop_front();
    }
}

/// The history script's answer: all or nothing with `since` (the in-memory broker's rule).
fn read_history(stream: &Stream, query: &HistoryQuery) -> HistoryResult {
    herald_broker::memory::answer_history(&stream.epoch, stream.top, &stream.entries, query)
}

/// The link a node holds: its id and the server identity read when it opened.
#[derive(Clone, Copy)]
struct LinkInfo {
    id: u64,
    ident: u64,
}

/// The node side of the simulated broker. See the module docs.
pub struct NodeBroker {
    me: Weak<NodeBroker>,
    node: String,
    server: Arc<Server>,
    options: NodeOptions,
    watermarks: Watermarks,
    link: Mutex<Option<LinkInfo>>,
    handler: OnceLock<Arc<dyn BrokerHandler>>,
    /// Channels this node subscribed: subscribed again after a reconnect.
    channels: Mutex<BTreeSet<String>>,
}

/// Reconnect delays: 100 ms doubling to 1.6 s (no jitter: the run's only randomness is its seed).
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_LAST: Duration = Duration::from_millis(1600);

/// The node's reconnect delays: the project's one `Backoff`, without jitter (its jitter draws
/// from an unseeded source, and a seed must replay).
fn reconnect_backoff() -> herald_broker::Backoff {
    herald_broker::Backoff::new(RECONNECT_FIRST, RECONNECT_LAST).exact()
}

impl NodeBroker {
    /// The broker of node `node` on `server`.
    pub fn new(node: &str, server: Arc<Server>, options: NodeOptions) -> Arc<Self> {
        Arc::new_cyclic(|me| NodeBroker {
            me: me.clone(),
            node: node.to_owned(),
            server,
            options,
            watermarks: Watermarks::new(),
            link: Mutex::new(None),
            handler: OnceLock::new(),
            channels: Mutex::new(BTreeSet::new()),
        })
    }

    fn link(&self) -> Result<LinkInfo, BrokerError> {
        self.link
            .lock()
            .expect("link lock")
            .ok_or_else(|| BrokerError::unavailable("broker link down"))
    }

    fn floor(&self, channel: &str) -> (String, u64) {
        if self.options.watermarks {
            self.watermarks.floor(channel)
        } else {
            (String::new(), 0)
        }
    }

    fn ident(&self, link: LinkInfo) -> u64 {
        if self.options.bind_identity {
            link.ident
        } else {
            0
        }
    }

    async fn call(&self, link: LinkInfo, req: Request) -> Result<Reply, BrokerError> {
        let rx = self.server.submit(link.id, req);
        rx.await
            .unwrap_or_else(|_| Err(BrokerError::unavailable("connection reset")))
    }

    /// Open a link and subscribe every hosted channel on it; the link counts as up only then.
    async fn open(self: &Arc<Self>) -> Result<mpsc::UnboundedReceiver<Push>, BrokerError> {
        let (id, ident, rx) = self.server.connect(&self.node)?;
        let link = LinkInfo { id, ident };
        let channels: Vec<String> = self
            .channels
            .lock()
            .expect("lock")
            .iter()
            .cloned()
            .collect();
        for channel in channels {
            self.call(link, Request::Subscribe(channel)).await?;
        }
        *self.link.lock().expect("link lock") = Some(link);
        Ok(rx)
    }

    /// Receive pushes; when the link ends, reconnect with backoff, subscribe again, and ask the
    /// hub to catch up.
    async fn receive(self: Arc<Self>, mut rx: Option<mpsc::UnboundedReceiver<Push>>) {
        let handler = self.handler.get().expect("started").clone();
        loop {
            if let Some(rx) = rx.as_mut() {
                while let Some(push) = rx.recv().await {
                    match push {
                        Push::Publication {
                            channel,
                            epoch,
                            publication,
                        } => {
                            self.watermarks
                                .observe(&channel, &epoch, publication.offset);
                            handler.on_publication(&channel, &epoch, publication);
                        }
                        Push::Presence {
                            channel,
                            joined,
                            who,
                        } => handler.on_presence_change(&channel, joined, who),
                        Push::Control(m) => handler.on_control(m),
                    }
                }
            }
            *self.link.lock().expect("link lock") = None;
            let mut backoff = reconnect_backoff();
            rx = loop {
                tokio::time::sleep(backoff.next_delay()).await;
                if let Ok(rx) = self.open().await {
                    break Some(rx);
                }
            };
            handler.on_reconnected();
        }
    }
}

#[async_trait]
impl Broker for NodeBroker {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        self.handler
            .set(handler)
            .map_err(|_| BrokerError::internal("broker started twice"))?;
        let me = self.me.upgrade().expect("alive");
        let mut backoff = reconnect_backoff();
        let rx = loop {
            match me.open().await {
                Ok(rx) => break rx,
                Err(_) => tokio::time::sleep(backoff.next_delay()).await,
            }
        };
        tokio::spawn(me.receive(Some(rx)));
        Ok(())
    }

    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        let link = self.link()?;
        let req = Request::Publish {
            channel: channel.to_owned(),
            data,
            info,
            opts: opts.clone(),
            floor: self.floor(channel),
            ident: self.ident(link),
        };
        match self.call(link, req).await? {
            Reply::Position(p) => {
                self.watermarks.observe(channel, &p.epoch, p.offset);
                Ok(p)
            }
            other => Err(BrokerError::internal(format!("unexpected {other:?}"))),
        }
    }

    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let link = self.link()?;
        self.call(link, Request::Subscribe(channel.to_owned()))
            .await?;
        self.channels
            .lock()
            .expect("lock")
            .insert(channel.to_owned());
        Ok(())
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.channels.lock().expect("lock").remove(channel);
        let link = self.link()?;
        self.call(link, Request::Unsubscribe(channel.to_owned()))
            .await
            .map(|_| ())
    }

    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        let link = self.link()?;
        let req = Request::History {
            channel: channel.to_owned(),
            query: query.clone(),
            opts: opts.clone(),
            floor: self.floor(channel),
            ident: self.ident(link),
        };
        match self.call(link, req).await? {
            Reply::History(h) => {
                self.watermarks
                    .observe(channel, &h.position.epoch, h.position.offset);
                Ok(h)
            }
            other => Err(BrokerError::internal(format!("unexpected {other:?}"))),
        }
    }

    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        let link = self.link()?;
        self.call(link, Request::AddPresence(channel.to_owned(), who.clone()))
            .await
            .map(|_| ())
    }

    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let link = self.link()?;
        self.call(
            link,
            Request::RemovePresence(channel.to_owned(), client.to_owned()),
        )
        .await
        .map(|_| ())
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        let link = self.link()?;
        match self
            .call(link, Request::Presence(channel.to_owned()))
            .await?
        {
            Reply::Presence(p) => Ok(p),
            other => Err(BrokerError::internal(format!("unexpected {other:?}"))),
        }
    }

    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        let link = self.link()?;
        self.call(
            link,
            Request::PresenceChange(channel.to_owned(), joined, who.clone()),
        )
        .await
        .map(|_| ())
    }

    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        let link = self.link()?;
        self.call(link, Request::Control(message.clone()))
            .await
            .map(|_| ())
    }
}
