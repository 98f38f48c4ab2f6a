//! `NatsBroker`: the state shared by its tasks, and the `Broker` impl, which only routes each
//! call to the module that owns it (connecting is `topology`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use async_nats::connection::State;
use async_nats::{jetstream, Client, Event};
use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, BrokerHandler, ControlMessage, HistoryChannels, HistoryQuery,
    HistoryResult, PublishOptions, StreamOptions, Watermarks,
};
use herald_protocol::{ClientInfo, StreamPosition};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::boot::Boot;
use crate::codec::{encode_presence_change, encode_unstored};
use crate::config::NatsConfig;
use crate::markers::{self, Expiries};
use crate::metrics::Metrics;
use crate::names::Subjects;
use crate::presence::{self, LocalPresence};
use crate::publish::{self, Tails};
use crate::receive::{self, ChannelTask};
use crate::streams::{Kind, Streams};
use crate::topology;

/// State shared by the broker and its background tasks.
pub(crate) struct Inner {
    pub(crate) node: String,
    pub(crate) config: NatsConfig,
    pub(crate) client: Client,
    pub(crate) js: jetstream::Context,
    pub(crate) subjects: Subjects,
    pub(crate) streams: Streams,
    pub(crate) tails: Tails,
    /// The newest position this node saw per channel (published, received or read), to notice a
    /// NATS that came back behind (see `publish::rolled_back`).
    pub(crate) watermarks: Watermarks,
    /// The boot id this node stamps and checks messages with (see the `boot` module).
    pub(crate) boot: Boot,
    /// Epoch markers this node stored, to delete once they outlive `empty_ttl` unused.
    pub(crate) markers: Expiries,
    /// Hosted channels → their subscription task. std Mutex: held only to insert or remove.
    pub(crate) channels: Mutex<HashMap<String, ChannelTask>>,
    pub(crate) handler: OnceLock<Arc<dyn BrokerHandler>>,
    pub(crate) presence: Mutex<LocalPresence>,
    pub(crate) metrics: Arc<Metrics>,
    /// Slots for JetStream requests in flight (`max_requests_in_flight`).
    pub(crate) js_slots: Semaphore,
    /// Connection events, taken by `start`.
    events: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    shutdown: watch::Receiver<bool>,
}

impl Inner {
    /// Fail fast instead of queueing behind a reconnect: the caller answers 503 / error 111.
    pub(crate) fn ensure_connected(&self) -> Result<(), BrokerError> {
        match self.client.connection_state() {
            State::Connected => Ok(()),
            _ => Err(BrokerError::unavailable("not connected to NATS")),
        }
    }

    /// Return once the server has handled everything this client sent before (a subscription
    /// above all). `Client::flush` only writes the socket buffer; the server handles one
    /// connection's operations in order, so the answer to a request sent after them proves
    /// they are in effect. Nothing listens on the sync subject: the answer is "no responders".
    pub(crate) async fn round_trip(&self, what: &str) -> Result<(), BrokerError> {
        let answer = self
            .timed(
                what,
                self.client.request(self.subjects.sync(), Bytes::new()),
            )
            .await?;
        match answer {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => Ok(()),
            Err(e) => Err(BrokerError::unavailable(format!("NATS {what}: {e}")).caused_by(e)),
        }
    }

    /// Bound any NATS round trip by the request timeout.
    pub(crate) async fn timed<T>(
        &self,
        what: &str,
        fut: impl Future<Output = T>,
    ) -> Result<T, BrokerError> {
        tokio::time::timeout(self.config.request_timeout(), fut)
            .await
            .map_err(|_| BrokerError::unavailable(format!("NATS {what} timed out")))
    }

    /// A JetStream request (a read, a store), bounded by the request timeout once it is sent,
    /// with at most `max_requests_in_flight` of this node's in flight. `Ok(None)`: sent, but no
    /// answer within the request timeout (a store's outcome is then unknown); the caller decides
    /// whether to send it again.
    ///
    /// Why: a storm of first subscribes (each reads a channel's last message and may store its
    /// epoch marker) sent all at once queues thousands of requests at the server, which works
    /// through them at its own pace, and those at the back time out, not because NATS failed but
    /// because of the node's own backlog (error 111 to clients; 557 of 50,000 in a benchmark). Waiting
    /// for a slot here instead keeps the server's queue short, so each request's timeout measures
    /// the server, not the backlog. Throughput is the same (the server is the bottleneck either
    /// way); an uncontended slot costs an atomic operation, so the steady publish path, a few
    /// requests in flight, never waits. The wait for a slot is bounded too
    /// ([`NatsConfig::queue_timeout`]): a server that stops answering fails the queue in time.
    pub(crate) async fn jetstream<T>(
        &self,
        what: &str,
        fut: impl Future<Output = T>,
    ) -> Result<Option<T>, BrokerError> {
        let slot = tokio::time::timeout(self.config.queue_timeout(), self.js_slots.acquire())
            .await
            .map_err(|_| {
                BrokerError::unavailable(format!(
                    "NATS {what}: {} JetStream requests in flight for {:?}, retry",
                    self.config.max_requests_in_flight,
                    self.config.queue_timeout()
                ))
            })?
            .map_err(|_| BrokerError::unavailable("shutting down"))?;
        // Counted apart from the slots, so that the gauge shows what this node has at the server
        // whatever the slots do (the storm test reads it); a guard, since the caller may be dropped.
        let counted = InFlight::count(&self.metrics.requests_in_flight);
        let answer = tokio::time::timeout(self.config.request_timeout(), fut)
            .await
            .ok();
        drop(counted);
        drop(slot);
        Ok(answer)
    }

    /// Which stream holds the channel: history when its namespace keeps any.
    pub(crate) fn kind(&self, opts: &StreamOptions) -> Kind {
        if opts.history_size > 0 {
            Kind::History
        } else {
            Kind::Live
        }
    }

    /// The subject a channel's publications are stored under.
    pub(crate) fn stream_subject(&self, kind: Kind, channel: &str) -> String {
        match kind {
            Kind::History => self.subjects.history(channel),
            Kind::Live => self.subjects.live(channel),
        }
    }
}

/// Herald's broker on NATS. See the crate documentation for the design.
pub struct NatsBroker {
    inner: Arc<Inner>,
    notify_shutdown: watch::Sender<bool>,
}

impl NatsBroker {
    /// Connect, and create or update the streams. Fails with `Unavailable` when NATS cannot be
    /// reached within `connect_timeout_ms` or has no JetStream.
    pub async fn connect(config: NatsConfig, node: &str) -> Result<NatsBroker, BrokerError> {
        let metrics = Arc::new(Metrics::default());
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (client, js, streams) =
            topology::connect(&config, node, metrics.clone(), events_tx).await?;

        let (notify_shutdown, shutdown) = watch::channel(false);
        let js_slots = Semaphore::new(config.max_requests_in_flight.max(1));
        let inner = Arc::new(Inner {
            node: node.to_owned(),
            boot: Boot::new(config.synchronous_persistence),
            subjects: Subjects::new(&config.subject_prefix),
            config,
            client,
            js,
            streams,
            tails: Tails::default(),
            watermarks: Watermarks::new(),
            markers: Expiries::default(),
            channels: Mutex::default(),
            handler: OnceLock::new(),
            presence: Mutex::default(),
            metrics,
            js_slots,
            events: Mutex::new(Some(events_rx)),
            shutdown,
        });
        Ok(NatsBroker {
            inner,
            notify_shutdown,
        })
    }

    /// The node name given at connect.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The underlying NATS client (for tests and diagnostics).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
}

impl Drop for NatsBroker {
    fn drop(&mut self) {
        let _ = self.notify_shutdown.send(true);
        let tasks: Vec<ChannelTask> = {
            let mut channels = self.inner.channels.lock().expect("channels lock");
            channels.drain().map(|(_, task)| task).collect()
        };
        // Dropping the stop senders ends each channel task.
        drop(tasks);
    }
}

impl NatsBroker {
    /// A publication kept out of history (`skip_history`): a core NATS message on the channel's
    /// delivery subject only, never stored (see `codec::encode_unstored`). Being outside the
    /// stream, it may overtake stored publications published just before it.
    async fn publish_unstored(
        &self,
        channel: &str,
        data: &Bytes,
        info: Option<&ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        let inner = &self.inner;
        inner.ensure_connected()?;
        let (headers, payload) = encode_unstored(data, info, &opts.tags);
        let subject = inner.subjects.delivery(channel);
        inner
            .timed(
                "publish",
                inner.client.publish_with_headers(subject, headers, payload),
            )
            .await?
            .map_err(|e| BrokerError::unavailable(format!("publish: {e}")).caused_by(e))?;
        Ok(herald_broker::unstored())
    }
}

#[async_trait]
impl Broker for NatsBroker {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner
            .handler
            .set(handler)
            .map_err(|_| BrokerError::internal("broker started twice"))?;
        let control = inner
            .timed(
                "subscribe",
                inner.client.subscribe(inner.subjects.control()),
            )
            .await?
            .map_err(|e| {
                BrokerError::unavailable(format!("subscribe control: {e}")).caused_by(e)
            })?;
        inner.round_trip("subscribe control").await?;
        let shutdown = inner.shutdown.clone();
        tokio::spawn(receive::read_control(
            inner.clone(),
            control,
            shutdown.clone(),
        ));
        if let Some(events) = inner.events.lock().expect("events lock").take() {
            tokio::spawn(receive::watch_connection(
                inner.clone(),
                events,
                shutdown.clone(),
            ));
        }
        tokio::spawn(receive::watch_streams(inner.clone(), shutdown.clone()));
        tokio::spawn(markers::run_expiry(inner.clone(), shutdown.clone()));
        tokio::spawn(presence::run_refresher(inner.clone(), shutdown));
        Ok(())
    }

    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        if opts.skip_history {
            return self
                .publish_unstored(channel, &data, info.as_ref(), opts)
                .await;
        }
        publish::publish(&self.inner, channel, data, info, opts).await
    }

    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        receive::subscribe(&self.inner, channel).await
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        receive::unsubscribe(&self.inner, channel).await
    }

    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        crate::history::history(&self.inner, channel, query, opts).await
    }

    async fn positions(
        &self,
        channels: &[(Arc<str>, StreamOptions)],
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        crate::history::positions(&self.inner, channels).await
    }

    async fn remove_history(&self, channel: &str) -> Result<bool, BrokerError> {
        crate::admin::remove_history(&self.inner, channel)
            .await
            .map(|()| true)
    }

    async fn history_channels(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryChannels>, BrokerError> {
        crate::admin::history_channels(&self.inner, cursor, limit)
            .await
            .map(Some)
    }

    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        presence::add(&self.inner, channel, who).await
    }

    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        presence::remove(&self.inner, channel, client).await
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        presence::list(&self.inner, channel).await
    }

    /// Core NATS, at most once, to the nodes hosting the channel (no flush: like a publication,
    /// a lost join/leave is not worth a round trip).
    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner.ensure_connected()?;
        let (headers, payload) = encode_presence_change(joined, who);
        let subject = inner.subjects.delivery(channel);
        inner
            .timed(
                "publish",
                inner.client.publish_with_headers(subject, headers, payload),
            )
            .await?
            .map_err(|e| BrokerError::unavailable(format!("presence change: {e}")).caused_by(e))
    }

    /// Core NATS to every node; success means the server has it (a round trip, not a flush).
    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner.ensure_connected()?;
        let payload = serde_json::to_vec(message)
            .map_err(|e| BrokerError::internal(format!("encode control: {e}")).caused_by(e))?;
        inner
            .timed(
                "publish",
                inner
                    .client
                    .publish(inner.subjects.control(), payload.into()),
            )
            .await?
            .map_err(|e| BrokerError::unavailable(format!("control: {e}")).caused_by(e))?;
        inner.round_trip("control").await
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.inner.metrics.register(registry);
    }
}

/// One request counted in a gauge for as long as it lives.
struct InFlight<'a>(&'a Gauge);

impl<'a> InFlight<'a> {
    fn count(gauge: &'a Gauge) -> Self {
        gauge.inc();
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
