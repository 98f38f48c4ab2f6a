//! `NatsBroker`: the connection, the state shared by its tasks, and the `Broker` impl, which
//! only routes each call to the module that owns it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::{jetstream, Client, ConnectOptions, Event};
use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, BrokerHandler, ControlMessage, HistoryQuery, HistoryResult,
    PublishOptions, StreamOptions, Watermarks,
};
use herald_protocol::{ClientInfo, StreamPosition};
use tokio::sync::{mpsc, watch};
use tracing::info;

use crate::codec::encode_presence_change;
use crate::config::{redact_url, NatsConfig};
use crate::metrics::{inc, Metrics};
use crate::presence::{self, LocalPresence};
use crate::publish::{self, Tails};
use crate::receive::{self, ChannelTask};
use crate::streams::{Kind, Streams};
use crate::subject::Subjects;

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
    /// Hosted channels → their subscription task. std Mutex: held only to insert or remove.
    pub(crate) channels: Mutex<HashMap<String, ChannelTask>>,
    pub(crate) handler: OnceLock<Arc<dyn BrokerHandler>>,
    pub(crate) presence: Mutex<LocalPresence>,
    pub(crate) metrics: Arc<Metrics>,
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
        let options = connect_options(&config, node, metrics.clone(), events_tx).await?;
        let urls = if config.urls.is_empty() {
            vec!["nats://127.0.0.1:4222".to_owned()]
        } else {
            config.urls.clone()
        };
        let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
        let addrs = urls
            .iter()
            .map(|u| u.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                BrokerError::internal(format!("bad NATS url in {shown:?}: {e}")).caused_by(e)
            })?;
        let client = options.connect(addrs).await.map_err(|e| {
            BrokerError::unavailable(format!("connect to NATS {shown:?}: {e}")).caused_by(e)
        })?;
        metrics.connected.store(1, Ordering::Relaxed);
        let mut js = match &config.jetstream_domain {
            Some(domain) => jetstream::with_domain(client.clone(), domain),
            None => jetstream::new(client.clone()),
        };
        js.set_timeout(config.request_timeout());
        let streams = Streams::new(js.clone(), &config)?;
        streams.ensure().await?;
        info!(urls = ?shown, %node, stream = %config.stream, "connected to NATS");

        let (notify_shutdown, shutdown) = watch::channel(false);
        let inner = Arc::new(Inner {
            node: node.to_owned(),
            subjects: Subjects::new(&config.subject_prefix),
            config,
            client,
            js,
            streams,
            tails: Tails::default(),
            watermarks: Watermarks::new(),
            channels: Mutex::default(),
            handler: OnceLock::new(),
            presence: Mutex::default(),
            metrics,
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

async fn connect_options(
    config: &NatsConfig,
    node: &str,
    metrics: Arc<Metrics>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<ConnectOptions, BrokerError> {
    let max_delay = Duration::from_millis(config.reconnect_max_delay_ms.max(10));
    let mut options = ConnectOptions::new()
        .name(format!("herald-{node}"))
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms.max(100)))
        .request_timeout(Some(config.request_timeout()))
        .max_reconnects(None)
        .ping_interval(Duration::from_secs(config.ping_interval_s.max(1)))
        .reconnect_delay_callback(move |attempts| {
            let exp = Duration::from_millis(50u64 << attempts.min(10));
            exp.min(max_delay)
        })
        .event_callback(move |event| {
            match &event {
                Event::Connected => metrics.connected.store(1, Ordering::Relaxed),
                Event::Disconnected => {
                    metrics.connected.store(0, Ordering::Relaxed);
                    inc(&metrics.disconnects);
                }
                Event::SlowConsumer(_) => inc(&metrics.slow_consumer_events),
                _ => {}
            }
            let _ = events.send(event);
            async {}
        });
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(seed) = &config.nkey_seed {
        options = options.nkey(seed.clone());
    }
    if let Some(path) = &config.creds_file {
        options = options.credentials_file(path).await.map_err(|e| {
            BrokerError::internal(format!("creds_file {}: {e}", path.display())).caused_by(e)
        })?;
    }
    if config.tls_required {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        (None, None) => {}
        _ => {
            return Err(BrokerError::internal(
                "tls_cert_file and tls_key_file go together",
            ))
        }
    }
    Ok(options)
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
        inner
            .timed("flush", inner.client.flush())
            .await?
            .map_err(|e| {
                BrokerError::unavailable(format!("subscribe control: {e}")).caused_by(e)
            })?;
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

    /// Core NATS to every node, flushed so that success means the server has it.
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
        inner
            .timed("flush", inner.client.flush())
            .await?
            .map_err(|e| BrokerError::unavailable(format!("control: {e}")).caused_by(e))
    }

    fn metrics_text(&self) -> String {
        self.inner.metrics.render()
    }
}
