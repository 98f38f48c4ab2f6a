//! Subscription connections: which Redis channels this node listens to, and how it gets them back
//! after losing Redis.
//!
//! One task (the [`Actor`]) owns a subscription connection and the set of channels the node wants
//! (`desired`). Requests from the hub queue up while a `SUBSCRIBE` is in flight and go out together
//! in the next one (batched). Messages never pass through the actor: the connection's reader calls
//! [`Dispatch::deliver`] directly, in the order Redis sent them, so a channel's publications reach
//! the hub in offset order.
//!
//! When the connection is lost the actor reconnects with backoff, subscribes every desired channel
//! again, and only then calls `BrokerHandler::on_reconnected` so the hub catches up from history.
//! While it is down, `subscribe` fails at once with "unavailable" (never hangs).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use herald_broker::{Backoff, BrokerError, BrokerHandler, ControlMessage, Watermarks};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, RedisError, Value};
use tokio::sync::{mpsc, oneshot};

use crate::codec::{self, Envelope};
use crate::link::{broker_error, is_connection_error, Connector, Probe};
use crate::metrics::Metrics;
use crate::names::{self, Names};

/// Concurrent `SSUBSCRIBE` commands in flight on a Cluster (one per slot).
const CLUSTER_PARALLELISM: usize = 64;
/// Bound of the request queue; a full queue makes `subscribe` wait, never grows memory.
const REQUEST_QUEUE: usize = 4096;
/// Bound of the connection-event queue (losses are coalesced: one resync covers many).
const SIGNAL_QUEUE: usize = 1024;
/// Unanswered health checks in a row after which the subscription connection counts as lost.
/// One late `PING` is a busy or starved Redis more often than a dead link, and tearing the
/// connection down then makes things worse: every channel is subscribed again and caught up from
/// history, while requests in between fail. A connection error still counts at once.
const HEALTH_MISSES_TO_DROP: u32 = 3;

type Reply = oneshot::Sender<Result<(), BrokerError>>;

enum Request {
    Subscribe(String, Reply),
    Unsubscribe(String, Reply),
}

/// What a connection's push reader tells the actor.
pub(crate) enum Signal {
    /// The connection of this generation is gone.
    Broken(u64),
    /// Redis dropped this shard channel by itself (its slot moved).
    Unsubscribed(String),
}

/// Decodes pushes and hands them to the hub. Shared by every subscription connection.
pub(crate) struct Dispatch {
    pub(crate) names: Names,
    pub(crate) handler: OnceLock<Arc<dyn BrokerHandler>>,
    pub(crate) metrics: Arc<Metrics>,
    /// Newest positions seen, passed to the stream scripts to catch a Redis that rolled back.
    pub(crate) watermarks: Watermarks,
}

impl Dispatch {
    /// A message arrived on Redis channel `pubsub`: decode it and call the hub. Runs on the
    /// connection's reader, so it must not block.
    fn deliver(&self, pubsub: &[u8], payload: Vec<u8>) {
        let Some(handler) = self.handler.get() else {
            return;
        };
        let name = std::str::from_utf8(pubsub).unwrap_or("");
        if name == self.names.control {
            self.metrics.received_control.inc();
            match serde_json::from_slice::<ControlMessage>(&payload) {
                Ok(message) => handler.on_control(message),
                Err(_) => {
                    self.metrics.received_invalid.inc();
                }
            }
            return;
        }
        let Some(channel) = self.names.channel_of(name) else {
            self.metrics.received_invalid.inc();
            return;
        };
        match codec::decode(Bytes::from(payload)) {
            Some(Envelope::Publication {
                epoch,
                publication,
                traceparent,
            }) => {
                self.metrics.received_publications.inc();
                // A publication kept out of history (offset 0) has no position to watch.
                if publication.offset > 0 {
                    self.watermarks.observe(channel, &epoch, publication.offset);
                }
                match traceparent {
                    None => handler.on_publication(channel, &epoch, publication),
                    Some(tp) => handler.on_traced_publication(channel, &epoch, publication, &tp),
                }
            }
            Some(Envelope::Presence { joined, who }) => {
                self.metrics.received_presence.inc();
                handler.on_presence_change(channel, joined, who);
            }
            None => {
                self.metrics.received_invalid.inc();
                tracing::warn!(channel, "undecodable message on redis pub/sub");
            }
        }
    }
}

/// The push sender of one connection: delivers messages in place, reports losses.
fn push_sender(
    dispatch: Arc<Dispatch>,
    signals: mpsc::Sender<Signal>,
    generation: u64,
    cluster: bool,
) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static {
    move |push: PushInfo| {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                let mut data = push.data.into_iter();
                if let (Some(Value::BulkString(ch)), Some(Value::BulkString(payload))) =
                    (data.next(), data.next())
                {
                    dispatch.deliver(&ch, payload);
                }
            }
            PushKind::Disconnection => {
                let _ = signals.try_send(Signal::Broken(generation));
            }
            PushKind::SUnsubscribe if cluster => {
                if let Some(Value::BulkString(ch)) = push.data.first() {
                    let ch = String::from_utf8_lossy(ch).into_owned();
                    let _ = signals.try_send(Signal::Unsubscribed(ch));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// How the actor talks to Redis. One per subscriber, so the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    /// One standalone server (or a Sentinel master): `SUBSCRIBE`, reconnecting ourselves.
    Single {
        connector: Connector,
        config: AsyncConnectionConfig,
        client_name: String,
        conn: Option<MultiplexedConnection>,
        generation: u64,
    },
    /// A Redis Cluster: `SSUBSCRIBE` per slot; the connection repairs itself per node, we
    /// subscribe again and catch up.
    Cluster(ClusterConnection),
}

/// A handle of the live connection, cheap to clone, for one batch.
#[derive(Clone)]
enum SubConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl SubConn {
    /// Subscribe `channels`; one result per channel, in order.
    async fn subscribe(self, channels: Vec<String>, batch: usize) -> Vec<Result<(), RedisError>> {
        if channels.is_empty() {
            return Vec::new();
        }
        match self {
            SubConn::Single(mut c) => {
                let mut results = Vec::with_capacity(channels.len());
                for chunk in channels.chunks(batch.max(1)) {
                    let r = c.subscribe(chunk).await;
                    results.extend(chunk.iter().map(|_| r.clone()));
                }
                results
            }
            SubConn::Cluster(c) => {
                per_slot(c, channels, |mut c, group| async move {
                    c.ssubscribe(&group).await
                })
                .await
            }
        }
    }

    /// Unsubscribe `channels`; the first error, if any.
    async fn unsubscribe(self, channels: Vec<String>) -> Result<(), RedisError> {
        if channels.is_empty() {
            return Ok(());
        }
        match self {
            SubConn::Single(mut c) => c.unsubscribe(&channels).await,
            SubConn::Cluster(c) => {
                let results = per_slot(c, channels, |mut c, group| async move {
                    c.sunsubscribe(&group).await
                })
                .await;
                results.into_iter().collect()
            }
        }
    }

    /// `PING`; with `want_master`, `ROLE` instead, failing unless the server is a master (after a
    /// Sentinel failover the old master lives on as a replica that no longer gets publications).
    async fn ping(self, want_master: bool) -> Result<(), RedisError> {
        match self {
            SubConn::Single(mut c) if want_master => {
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut c).await?;
                match role.first() {
                    Some(Value::BulkString(r)) if r == b"master" => Ok(()),
                    _ => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "the server is no longer the master",
                    ))),
                }
            }
            SubConn::Single(mut c) => redis::cmd("PING").query_async::<()>(&mut c).await,
            // Routed to every primary.
            SubConn::Cluster(mut c) => redis::cmd("PING").query_async::<()>(&mut c).await,
        }
    }
}

/// Run `op` once per slot group (a multi-channel `SSUBSCRIBE` must stay within one slot), a few
/// groups at a time; one result per channel, in the order given.
async fn per_slot<F, Fut>(
    conn: ClusterConnection,
    channels: Vec<String>,
    op: F,
) -> Vec<Result<(), RedisError>>
where
    F: Fn(ClusterConnection, Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(), RedisError>>,
{
    let mut groups: HashMap<u16, Vec<String>> = HashMap::new();
    for ch in &channels {
        groups.entry(names::slot(ch)).or_default().push(ch.clone());
    }
    let outcomes: HashMap<u16, Result<(), RedisError>> = stream::iter(groups)
        .map(|(slot, group)| {
            let fut = op(conn.clone(), group);
            async move { (slot, fut.await) }
        })
        .buffer_unordered(CLUSTER_PARALLELISM)
        .collect()
        .await;
    channels
        .iter()
        .map(|ch| outcomes[&names::slot(ch)].clone())
        .collect()
}

/// The handle the broker holds: sends requests to the actor.
pub(crate) struct Subscriber {
    requests: mpsc::Sender<Request>,
}

impl Subscriber {
    /// Open the subscription connection and start its actor. Fails if Redis cannot be reached.
    pub(crate) async fn start(
        mut backend: Backend,
        dispatch: Arc<Dispatch>,
        backoff: Backoff,
        batch: usize,
        health_every: Duration,
        probe: Probe,
    ) -> Result<Subscriber, BrokerError> {
        let (signal_tx, signals) = mpsc::channel(SIGNAL_QUEUE);
        if let Backend::Single { .. } = backend {
            reconnect_single(&mut backend, &dispatch, &signal_tx)
                .await
                .map_err(|e| {
                    BrokerError::unavailable(format!("redis subscription connection: {e}"))
                        .caused_by(e)
                })?;
        }
        let (tx, requests) = mpsc::channel(REQUEST_QUEUE);
        let actor = Actor {
            requests,
            signals,
            signal_tx,
            backend,
            desired: HashSet::new(),
            needs_resync: false,
            dispatch,
            batch: batch.max(1),
            backoff,
            health_every,
            health_misses: 0,
            probe,
        };
        tokio::spawn(actor.run());
        Ok(Subscriber { requests: tx })
    }

    /// Subscribe Redis channel `pubsub`; returns once Redis confirmed it.
    pub(crate) async fn subscribe(&self, pubsub: String) -> Result<(), BrokerError> {
        self.call(|tx| Request::Subscribe(pubsub, tx)).await
    }

    /// Unsubscribe Redis channel `pubsub`.
    pub(crate) async fn unsubscribe(&self, pubsub: String) -> Result<(), BrokerError> {
        self.call(|tx| Request::Unsubscribe(pubsub, tx)).await
    }

    async fn call(&self, make: impl FnOnce(Reply) -> Request) -> Result<(), BrokerError> {
        let (tx, rx) = oneshot::channel();
        let gone = || BrokerError::internal("redis subscriber stopped");
        self.requests.send(make(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

/// Make the `ClusterConnection` push sender for a cluster subscriber (created before the
/// connection, because the cluster client takes it at build time).
pub(crate) fn cluster_push_sender(
    dispatch: Arc<Dispatch>,
) -> (
    impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static,
    mpsc::Sender<Signal>,
    mpsc::Receiver<Signal>,
) {
    let (signal_tx, signals) = mpsc::channel(SIGNAL_QUEUE);
    (
        push_sender(dispatch, signal_tx.clone(), 0, true),
        signal_tx,
        signals,
    )
}

impl Subscriber {
    /// Start the actor of a cluster subscriber whose connection already carries the push sender
    /// from [`cluster_push_sender`].
    pub(crate) fn start_cluster(
        conn: ClusterConnection,
        (signal_tx, signals): (mpsc::Sender<Signal>, mpsc::Receiver<Signal>),
        dispatch: Arc<Dispatch>,
        backoff: Backoff,
        batch: usize,
        health_every: Duration,
        probe: Probe,
    ) -> Subscriber {
        let (tx, requests) = mpsc::channel(REQUEST_QUEUE);
        let actor = Actor {
            requests,
            signals,
            signal_tx,
            backend: Backend::Cluster(conn),
            desired: HashSet::new(),
            needs_resync: false,
            dispatch,
            batch: batch.max(1),
            backoff,
            health_every,
            health_misses: 0,
            probe,
        };
        tokio::spawn(actor.run());
        Subscriber { requests: tx }
    }
}

/// Replace a `Single` backend's connection with a new one (next generation).
async fn reconnect_single(
    backend: &mut Backend,
    dispatch: &Arc<Dispatch>,
    signal_tx: &mpsc::Sender<Signal>,
) -> Result<(), RedisError> {
    let Backend::Single {
        connector,
        config,
        client_name,
        conn,
        generation,
    } = backend
    else {
        return Ok(());
    };
    *conn = None;
    *generation += 1;
    let sender = push_sender(dispatch.clone(), signal_tx.clone(), *generation, false);
    let mut c = connector
        .connect(config.clone().set_push_sender(sender))
        .await?;
    redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(&*client_name)
        .query_async::<()>(&mut c)
        .await?;
    *conn = Some(c);
    Ok(())
}

/// Owns one subscription connection and the set of channels this node wants on it.
struct Actor {
    requests: mpsc::Receiver<Request>,
    signals: mpsc::Receiver<Signal>,
    signal_tx: mpsc::Sender<Signal>,
    backend: Backend,
    /// Redis channels this node wants, subscribed or to be subscribed again after a loss.
    desired: HashSet<String>,
    needs_resync: bool,
    dispatch: Arc<Dispatch>,
    batch: usize,
    backoff: Backoff,
    health_every: Duration,
    /// Health checks unanswered in a row (see [`HEALTH_MISSES_TO_DROP`]).
    health_misses: u32,
    /// Checked after reconnecting and before subscribing again, so that the catch-up that
    /// follows can read history.
    probe: Probe,
}

impl Actor {
    async fn run(mut self) {
        let mut health = tokio::time::interval(self.health_every);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.needs_resync {
                if !self.resync().await {
                    return;
                }
                continue;
            }
            tokio::select! {
                req = self.requests.recv() => match req {
                    Some(req) => self.handle_batch(req).await,
                    None => return,
                },
                Some(signal) = self.signals.recv() => self.on_signal(signal),
                _ = health.tick() => self.health_check().await,
            }
        }
    }

    /// The connection is gone (or suspect): resubscribe before anything else, and show it in
    /// `herald_broker_connected` at once.
    fn mark_down(&mut self) {
        if !self.needs_resync {
            self.needs_resync = true;
            self.dispatch.metrics.disconnected.inc();
        }
    }

    fn conn(&self) -> Option<SubConn> {
        match &self.backend {
            Backend::Single { conn, .. } => conn.clone().map(SubConn::Single),
            Backend::Cluster(c) => Some(SubConn::Cluster(c.clone())),
        }
    }

    fn is_control(&self, pubsub: &str) -> bool {
        pubsub == self.dispatch.names.control
    }

    fn on_signal(&mut self, signal: Signal) {
        match signal {
            Signal::Broken(generation) => {
                let current = match &self.backend {
                    Backend::Single { generation, .. } => *generation,
                    Backend::Cluster(_) => 0,
                };
                if generation == current {
                    tracing::warn!("redis subscription connection lost");
                    self.mark_down();
                }
            }
            Signal::Unsubscribed(ch) => {
                if self.desired.contains(&ch) {
                    tracing::warn!(channel = %ch, "redis dropped a shard channel subscription (slot moved?)");
                    self.mark_down();
                }
            }
        }
    }

    /// Take `first` and whatever else is queued (up to `batch`), and send one `SUBSCRIBE` and one
    /// `UNSUBSCRIBE` for all of them.
    async fn handle_batch(&mut self, first: Request) {
        let mut subs: Vec<(String, Reply)> = Vec::new();
        let mut unsubs: Vec<(String, Reply)> = Vec::new();
        let mut take = |r: Request| match r {
            Request::Subscribe(c, tx) => subs.push((c, tx)),
            Request::Unsubscribe(c, tx) => unsubs.push((c, tx)),
        };
        take(first);
        let mut n = 1;
        while n < self.batch {
            match self.requests.try_recv() {
                Ok(r) => take(r),
                Err(_) => break,
            }
            n += 1;
        }
        let Some(conn) = self.conn() else {
            self.mark_down();
            for (_, tx) in subs {
                let _ = tx.send(Err(unavailable()));
            }
            for (c, tx) in unsubs {
                self.forget(&c);
                let _ = tx.send(Ok(()));
            }
            return;
        };
        // Into `desired` before sending: a resync that follows a loss includes them.
        for (c, _) in &subs {
            self.desired.insert(c.clone());
        }
        let mut unsub_names = Vec::with_capacity(unsubs.len());
        for (c, _) in &unsubs {
            if self.forget(c) {
                unsub_names.push(c.clone());
            }
        }
        let sub_names: Vec<String> = subs.iter().map(|(c, _)| c.clone()).collect();
        let (sub_results, unsub_result) = futures_util::future::join(
            conn.clone().subscribe(sub_names, self.batch),
            conn.clone().unsubscribe(unsub_names.clone()),
        )
        .await;
        let mut failed = Vec::new();
        // A late reply counts like a late health check (see `HEALTH_MISSES_TO_DROP`), once a batch.
        let mut timed_out = false;
        for ((c, tx), result) in subs.into_iter().zip(sub_results) {
            match result {
                Ok(()) => {
                    self.health_misses = 0;
                    if !self.is_control(&c) {
                        self.dispatch.metrics.subscribed_channels.inc();
                    }
                    let _ = tx.send(Ok(()));
                }
                Err(e) => {
                    self.desired.remove(&c);
                    if e.is_timeout() {
                        timed_out = true;
                    } else if is_connection_error(&e) {
                        self.mark_down();
                    }
                    tracing::warn!(channel = %c, cause = %e, "redis subscribe failed");
                    failed.push(c);
                    let _ = tx.send(Err(broker_error(e)));
                }
            }
        }
        let mut unsub_again = Vec::new();
        if let Err(e) = unsub_result {
            if e.is_timeout() {
                timed_out = true;
                unsub_again = unsub_names;
            } else if is_connection_error(&e) {
                self.mark_down();
            }
        }
        if timed_out && !self.needs_resync {
            self.missed_health_check();
        }
        for (_, tx) in unsubs {
            let _ = tx.send(Ok(()));
        }
        // A failed subscribe may still have reached Redis, and an unsubscribe that timed out may
        // not have: undo or repeat them, best effort, so that the node never listens to a channel
        // nobody here wants. Awaited, not spawned: a later batch that subscribes the same channel
        // again must reach Redis after this.
        failed.extend(unsub_again);
        if !failed.is_empty() && !self.needs_resync {
            if let Err(e) = conn.unsubscribe(failed).await {
                if e.is_timeout() {
                    self.missed_health_check();
                } else if is_connection_error(&e) {
                    self.mark_down();
                }
            }
        }
    }

    /// Drop a channel from `desired`; whether it was there.
    fn forget(&mut self, pubsub: &str) -> bool {
        let was = self.desired.remove(pubsub);
        if was && !self.is_control(pubsub) {
            self.dispatch.metrics.subscribed_channels.dec();
        }
        was
    }

    async fn health_check(&mut self) {
        let Some(conn) = self.conn() else {
            self.mark_down();
            return;
        };
        let want_master = matches!(
            &self.backend,
            Backend::Single {
                connector: Connector::Sentinel(_),
                ..
            }
        );
        let r = tokio::time::timeout(self.health_every, conn.ping(want_master)).await;
        match r {
            Ok(Ok(())) => self.health_misses = 0,
            Err(_) => self.missed_health_check(),
            Ok(Err(e)) if e.is_timeout() => self.missed_health_check(),
            Ok(Err(e)) if is_connection_error(&e) => {
                tracing::warn!(cause = %e, "redis subscription connection failed its health check");
                self.mark_down();
            }
            // An error reply: Redis answered.
            Ok(Err(_)) => self.health_misses = 0,
        }
    }

    /// A health check (or a subscription command) not answered in time: the link counts as lost
    /// on the [`HEALTH_MISSES_TO_DROP`]th in a row.
    fn missed_health_check(&mut self) {
        self.health_misses += 1;
        if self.health_misses < HEALTH_MISSES_TO_DROP {
            tracing::debug!(
                missed = self.health_misses,
                "redis subscription connection did not answer in time; Redis busy?"
            );
            return;
        }
        tracing::warn!(
            missed = self.health_misses,
            "redis subscription connection did not answer, several times in a row"
        );
        self.health_misses = 0;
        self.mark_down();
    }

    /// Reconnect (standalone) and subscribe every desired channel again, with backoff; then tell
    /// the hub to catch up. Requests that arrive while waiting are answered at once. Returns false
    /// when the broker is gone.
    async fn resync(&mut self) -> bool {
        if let Backend::Single { conn, .. } = &mut self.backend {
            // Drop the old connection now: Redis forgets its subscriptions with it.
            *conn = None;
        }
        loop {
            let delay = self.backoff.next_delay();
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    req = self.requests.recv() => match req {
                        Some(Request::Subscribe(_, tx)) => {
                            let _ = tx.send(Err(unavailable()));
                        }
                        Some(Request::Unsubscribe(c, tx)) => {
                            self.forget(&c);
                            let _ = tx.send(Ok(()));
                        }
                        None => return false,
                    },
                    // Further losses are covered by this resync.
                    Some(_) = self.signals.recv() => {}
                }
            }
            match self.try_resync().await {
                Ok(n) => {
                    let m = &self.dispatch.metrics;
                    m.resubscriptions.inc_by(n as u64);
                    m.reconnects.inc();
                    m.disconnected.dec();
                    self.needs_resync = false;
                    self.health_misses = 0;
                    self.backoff.reset();
                    tracing::info!(
                        channels = n,
                        "redis subscriptions restored; catching up from history"
                    );
                    if let Some(handler) = self.dispatch.handler.get() {
                        m.catchups.inc();
                        handler.on_reconnected();
                    }
                    return true;
                }
                Err(e) => tracing::debug!(cause = %e, "redis resubscribe failed; retrying"),
            }
        }
    }

    async fn try_resync(&mut self) -> Result<usize, RedisError> {
        reconnect_single(&mut self.backend, &self.dispatch, &self.signal_tx).await?;
        self.probe.check(self.health_every).await?;
        let conn = self.conn().expect("connected after reconnect");
        let channels: Vec<String> = self.desired.iter().cloned().collect();
        let n = channels.len();
        for result in conn.subscribe(channels, self.batch).await {
            result?;
        }
        Ok(n)
    }
}

fn unavailable() -> BrokerError {
    BrokerError::unavailable("redis subscription connection is down; reconnecting")
}
