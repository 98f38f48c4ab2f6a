//! [`RedisBroker`]: the `Broker` trait on Redis: publish through the atomic script, history and
//! presence from Redis, delivery through targeted (or sharded) pub/sub subscriptions.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    new_epoch, Broker, BrokerError, BrokerHandler, ControlMessage, HistoryQuery, HistoryResult,
    PublishOptions, SharedBroker, StreamOptions, Watermarks,
};
use herald_protocol::{ClientInfo, Publication, StreamPosition};
use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, ProtocolVersion, Value};

use crate::config::{RedisConfig, Topology};
use crate::keys::{self, Names};
use crate::link::{self, Backoff, Commands, Connector, Link, Probe};
use crate::metrics::Metrics;
use crate::scripts;
use crate::subscriber::{self, Backend, Dispatch, Subscriber};

/// How long an idempotency key is remembered (as in the memory broker).
const IDEMPOTENCY_TTL_S: u64 = 300;
/// Presence entries refreshed per script call.
const PRESENCE_CHUNK: usize = 200;

/// The Broker on Redis. Build it with [`crate::connect`] or [`crate::connect_with`].
pub struct RedisBroker {
    inner: Arc<Inner>,
}

struct Inner {
    node: String,
    cfg: RedisConfig,
    names: Names,
    cluster: bool,
    commands: Commands,
    /// One per standalone shard, or one for the Cluster.
    subscribers: Vec<Subscriber>,
    dispatch: Arc<Dispatch>,
    metrics: Arc<Metrics>,
    /// Presence entries this node added: channel → client → info. Refreshed periodically, so
    /// they expire in Redis only when this node stops refreshing (crash).
    local_presence: Mutex<HashMap<String, HashMap<String, ClientInfo>>>,
    started: OnceLock<()>,
}

impl RedisBroker {
    /// Connect to the servers `cfg` names, as node `node`. Fails if Redis cannot be reached now.
    pub async fn connect(cfg: RedisConfig, node: &str) -> Result<RedisBroker, BrokerError> {
        let topology = cfg.topology()?;
        let names = Names::new(&cfg.key_prefix);
        let metrics = Arc::new(Metrics::default());
        let dispatch = Arc::new(Dispatch {
            names: names.clone(),
            handler: OnceLock::new(),
            metrics: metrics.clone(),
            watermarks: Watermarks::new(),
        });
        let backoff = Backoff::new(&cfg);
        let health = Duration::from_millis(cfg.health_check_ms.max(100));
        let client_name = format!(
            "herald-{}-sub",
            node.chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                })
                .collect::<String>()
        );
        let (cluster, commands, subscribers) = match topology {
            Topology::Standalone(urls) => {
                let mut links = Vec::new();
                let mut subs = Vec::new();
                for url in &urls {
                    let cmd = connector_for(url, &cfg, ProtocolVersion::RESP3)?;
                    let link = Link::connect(cmd, &cfg).await?;
                    let probe = Probe::Link(link.clone());
                    links.push(link);
                    let sub = connector_for(url, &cfg, ProtocolVersion::RESP3)?;
                    subs.push(
                        single_subscriber(
                            sub,
                            &cfg,
                            &client_name,
                            &dispatch,
                            backoff,
                            health,
                            probe,
                        )
                        .await?,
                    );
                }
                (false, Commands::Shards(links), subs)
            }
            Topology::Sentinel { nodes, master } => {
                let cmd = sentinel_connector(&nodes, &master, &cfg, ProtocolVersion::RESP3)?;
                let link = Link::connect(cmd, &cfg).await?;
                let sub = sentinel_connector(&nodes, &master, &cfg, ProtocolVersion::RESP3)?;
                let probe = Probe::Link(link.clone());
                let subscriber =
                    single_subscriber(sub, &cfg, &client_name, &dispatch, backoff, health, probe)
                        .await?;
                (false, Commands::Shards(vec![link]), vec![subscriber])
            }
            Topology::Cluster(seeds) => {
                let cmd = cluster_builder(&seeds, &cfg)?
                    .build()
                    .map_err(config_error)?
                    .get_async_connection()
                    .await
                    .map_err(|e| {
                        BrokerError::unavailable(format!("redis cluster: {e}")).caused_by(e)
                    })?;
                let (push, signal_tx, signals) = subscriber::cluster_push_sender(dispatch.clone());
                let sub = cluster_builder(&seeds, &cfg)?
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(push)
                    .build()
                    .map_err(config_error)?
                    .get_async_connection()
                    .await
                    .map_err(|e| {
                        BrokerError::unavailable(format!("redis cluster: {e}")).caused_by(e)
                    })?;
                let subscriber = Subscriber::start_cluster(
                    sub,
                    (signal_tx, signals),
                    dispatch.clone(),
                    backoff,
                    cfg.subscribe_batch,
                    health,
                    Probe::Cluster(cmd.clone()),
                );
                (true, Commands::Cluster(cmd), vec![subscriber])
            }
        };
        Ok(RedisBroker {
            inner: Arc::new(Inner {
                node: node.to_owned(),
                cfg,
                names,
                cluster,
                commands,
                subscribers,
                dispatch,
                metrics,
                local_presence: Mutex::new(HashMap::new()),
                started: OnceLock::new(),
            }),
        })
    }

    /// This broker as the server's shared handle.
    pub fn shared(self) -> SharedBroker {
        Arc::new(self)
    }
}

fn config_error(e: redis::RedisError) -> BrokerError {
    BrokerError::internal(format!("redis config: {e}")).caused_by(e)
}

fn connector_for(
    url: &str,
    cfg: &RedisConfig,
    protocol: ProtocolVersion,
) -> Result<Connector, BrokerError> {
    let info = link::connection_info(url, cfg, protocol)?;
    Ok(Connector::Client(link::client(info, cfg)?))
}

fn sentinel_connector(
    nodes: &[String],
    master: &str,
    cfg: &RedisConfig,
    protocol: ProtocolVersion,
) -> Result<Connector, BrokerError> {
    use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
    let mut sentinels = Vec::new();
    for n in nodes {
        let mut info = link::connection_info(n, &RedisConfig::default(), ProtocolVersion::RESP2)?;
        if let Some(pw) = cfg
            .sentinel
            .as_ref()
            .and_then(|s| s.sentinel_password.as_ref())
        {
            let settings = info.redis_settings().clone().set_password(pw);
            info = info.set_redis_settings(settings);
        }
        sentinels.push(info);
    }
    let mut settings = redis::RedisConnectionInfo::default().set_protocol(protocol);
    if let Some(u) = &cfg.username {
        settings = settings.set_username(u);
    }
    if let Some(p) = &cfg.password {
        settings = settings.set_password(p);
    }
    let mut node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
    if cfg.tls {
        let mode = if cfg.tls_insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        };
        node_info = node_info.set_tls_mode(mode);
    }
    // `build` takes a String without the `tls` feature and `impl AsRef<str>` with it.
    #[allow(clippy::unnecessary_to_owned)]
    let client = SentinelClient::build(
        sentinels,
        master.to_owned(),
        Some(node_info),
        SentinelServerType::Master,
    )
    .map_err(config_error)?;
    Ok(Connector::Sentinel(tokio::sync::Mutex::new(client)))
}

fn cluster_builder(
    seeds: &[String],
    cfg: &RedisConfig,
) -> Result<ClusterClientBuilder, BrokerError> {
    let mut infos = Vec::new();
    for s in seeds {
        infos.push(link::connection_info(s, cfg, ProtocolVersion::RESP2)?);
    }
    let mut b = ClusterClientBuilder::new(infos)
        .connection_timeout(cfg.connect_timeout())
        .response_timeout(cfg.command_timeout())
        // Fail fast when a shard is down: a publish must answer "unavailable" within about
        // the command timeout, not after a long retry schedule.
        .retries(2)
        .min_retry_wait(20)
        .max_retry_wait(500);
    if let Some(u) = &cfg.username {
        b = b.username(u);
    }
    if let Some(p) = &cfg.password {
        b = b.password(p);
    }
    #[cfg(feature = "tls")]
    {
        let tls = cfg.tls || seeds.iter().any(|s| s.starts_with("rediss://"));
        if tls {
            let mode = if cfg.tls_insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            };
            b = b.tls(mode);
        }
        if let Some(certs) = link::tls_certificates(cfg)? {
            b = b.certs(certs);
        }
    }
    Ok(b)
}

async fn single_subscriber(
    connector: Connector,
    cfg: &RedisConfig,
    client_name: &str,
    dispatch: &Arc<Dispatch>,
    backoff: Backoff,
    health: Duration,
    probe: Probe,
) -> Result<Subscriber, BrokerError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout()))
        .set_response_timeout(Some(cfg.command_timeout()));
    let backend = Backend::Single {
        connector,
        config,
        client_name: client_name.to_owned(),
        conn: None,
        generation: 0,
    };
    Subscriber::start(
        backend,
        dispatch.clone(),
        backoff,
        cfg.subscribe_batch,
        health,
        probe,
    )
    .await
}

impl Inner {
    fn shard(&self, channel: &str) -> usize {
        match &self.commands {
            Commands::Shards(links) => keys::shard_of(channel, links.len()),
            Commands::Cluster(_) => 0,
        }
    }

    fn subscriber(&self, channel: &str) -> &Subscriber {
        &self.subscribers[if self.cluster { 0 } else { self.shard(channel) }]
    }

    fn publish_command(&self) -> &'static str {
        if self.cluster {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Run a presence script for `channel` with `ARGV` = TTL, then (client, info JSON) pairs.
    async fn presence_add(
        &self,
        channel: &str,
        entries: &[(String, String)],
    ) -> Result<(), BrokerError> {
        let k = self.names.channel(channel);
        let ttl_ms = self.cfg.presence_ttl_s.max(1) * 1000;
        let conn = self.commands.conn(self.shard(channel))?;
        link::run(
            &self.metrics,
            self.cfg.command_timeout(),
            conn,
            |mut c| async move {
                let mut inv = scripts::PRESENCE_ADD.prepare_invoke();
                inv.key(&k.presence).key(&k.presence_expiry).arg(ttl_ms);
                for (client, info) in entries {
                    inv.arg(client).arg(info);
                }
                inv.invoke_async::<()>(&mut c).await
            },
        )
        .await
    }

    /// Re-add every presence entry this node holds, so they outlive the TTL while it lives.
    async fn refresh_presence(&self) {
        let snapshot: Vec<(String, Vec<(String, String)>)> = {
            let local = self.local_presence.lock().expect("presence lock");
            local
                .iter()
                .map(|(ch, clients)| {
                    let entries = clients
                        .iter()
                        .map(|(id, who)| {
                            (id.clone(), serde_json::to_string(who).unwrap_or_default())
                        })
                        .collect();
                    (ch.clone(), entries)
                })
                .collect()
        };
        for (channel, entries) in snapshot {
            for chunk in entries.chunks(PRESENCE_CHUNK) {
                if let Err(e) = self.presence_add(&channel, chunk).await {
                    tracing::debug!(channel, cause = %e, "presence refresh failed");
                    continue;
                }
                // Entries removed while the refresh ran were just re-added: remove them again.
                let gone: Vec<String> = {
                    let local = self.local_presence.lock().expect("presence lock");
                    let clients = local.get(&channel);
                    chunk
                        .iter()
                        .filter(|(id, _)| !clients.is_some_and(|c| c.contains_key(id)))
                        .map(|(id, _)| id.clone())
                        .collect()
                };
                for id in gone {
                    let _ = self.presence_remove(&channel, &id).await;
                }
            }
        }
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let k = self.names.channel(channel);
        let conn = self.commands.conn(self.shard(channel))?;
        link::run(
            &self.metrics,
            self.cfg.command_timeout(),
            conn,
            |mut c| async move {
                scripts::PRESENCE_REMOVE
                    .key(&k.presence)
                    .key(&k.presence_expiry)
                    .arg(client)
                    .invoke_async::<()>(&mut c)
                    .await
            },
        )
        .await
    }

    /// `PUBLISH`/`SPUBLISH` a raw payload on a Redis channel that lives on `channel`'s shard.
    async fn publish_raw(
        &self,
        shard_of: &str,
        pubsub: &str,
        payload: Vec<u8>,
    ) -> Result<(), BrokerError> {
        let conn = self.commands.conn(self.shard(shard_of))?;
        let command = self.publish_command();
        link::run(
            &self.metrics,
            self.cfg.command_timeout(),
            conn,
            |mut c| async move {
                redis::cmd(command)
                    .arg(pubsub)
                    .arg(payload)
                    .query_async::<()>(&mut c)
                    .await
            },
        )
        .await
    }
}

/// Spawn the presence refresher; it stops when the broker is dropped.
fn spawn_presence_refresh(inner: &Arc<Inner>) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let every = Duration::from_millis((inner.cfg.presence_ttl_s.max(1) * 1000 / 3).max(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            inner.refresh_presence().await;
        }
    });
}

fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, u128::from(u64::MAX)) as u64
}

fn bad_reply(what: &str) -> BrokerError {
    BrokerError::internal(format!("redis: unexpected reply to {what}"))
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

fn into_string(v: Value) -> Option<String> {
    String::from_utf8(into_bytes(v)?).ok()
}

/// Parse the history script's reply.
fn parse_history(reply: Vec<Value>) -> Result<HistoryResult, BrokerError> {
    let mut it = reply.into_iter();
    let epoch = it
        .next()
        .and_then(into_string)
        .ok_or_else(|| bad_reply("history"))?;
    let top = it
        .next()
        .as_ref()
        .and_then(as_u64)
        .ok_or_else(|| bad_reply("history"))?;
    let continuous = it
        .next()
        .as_ref()
        .and_then(as_u64)
        .ok_or_else(|| bad_reply("history"))?
        == 1;
    let mut publications = Vec::new();
    while let Some(offset) = it.next() {
        let offset = as_u64(&offset).ok_or_else(|| bad_reply("history"))?;
        let data = it
            .next()
            .and_then(into_bytes)
            .ok_or_else(|| bad_reply("history"))?;
        let info = it
            .next()
            .and_then(into_bytes)
            .ok_or_else(|| bad_reply("history"))?;
        let info = if info.is_empty() {
            None
        } else {
            Some(serde_json::from_slice(&info).map_err(|_| bad_reply("history info"))?)
        };
        publications.push(Publication {
            offset,
            data: Bytes::from(data),
            info,
        });
    }
    Ok(HistoryResult {
        position: StreamPosition { epoch, offset: top },
        publications,
        continuous,
    })
}

#[async_trait]
impl Broker for RedisBroker {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        let inner = &self.inner;
        if inner.started.set(()).is_err() {
            return Err(BrokerError::internal("broker started twice"));
        }
        let _ = inner.dispatch.handler.set(handler);
        // The one always-on subscription: control messages for every node.
        let control = inner.names.control.clone();
        inner.subscribers[0].subscribe(control).await?;
        spawn_presence_refresh(inner);
        tracing::info!(node = %inner.node, cluster = inner.cluster, "redis broker started");
        Ok(())
    }

    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        let inner = &self.inner;
        let k = inner.names.channel(channel);
        let idem = opts
            .idempotency_key
            .as_ref()
            .map(|key| inner.names.idempotency(channel, key));
        let info_json = match &info {
            Some(i) => serde_json::to_vec(i)
                .map_err(|e| BrokerError::internal(e.to_string()).caused_by(e))?,
            None => Vec::new(),
        };
        let s = &opts.stream;
        let command = inner.publish_command();
        let (floor_epoch, floor_offset) = inner.dispatch.watermarks.floor(channel);
        let result = match inner.commands.conn(inner.shard(channel)) {
            Ok(conn) => {
                link::run(
                    &inner.metrics,
                    inner.cfg.command_timeout(),
                    conn,
                    |mut c| async move {
                        let mut inv = scripts::PUBLISH.prepare_invoke();
                        inv.key(&k.meta).key(&k.history);
                        if let Some(idem) = &idem {
                            inv.key(idem);
                        }
                        inv.arg(&k.pubsub)
                            .arg(command)
                            .arg(new_epoch())
                            .arg(s.history_size)
                            .arg(ms(s.history_ttl))
                            .arg(ms(s.meta_ttl))
                            .arg(&info_json[..])
                            .arg(&data[..])
                            .arg(IDEMPOTENCY_TTL_S)
                            .arg(&floor_epoch)
                            .arg(floor_offset);
                        inv.invoke_async::<(String, u64, u8)>(&mut c).await
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok((epoch, offset, duplicate)) => {
                inner.dispatch.watermarks.observe(channel, &epoch, offset);
                if duplicate == 0 {
                    inner.metrics.published.fetch_add(1, Relaxed);
                }
                Ok(StreamPosition { epoch, offset })
            }
            Err(e) => {
                inner.metrics.publish_errors.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner
            .subscriber(channel)
            .subscribe(inner.names.pubsub(channel))
            .await
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let inner = &self.inner;
        inner
            .subscriber(channel)
            .unsubscribe(inner.names.pubsub(channel))
            .await
    }

    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        let inner = &self.inner;
        let k = inner.names.channel(channel);
        let conn = inner.commands.conn(inner.shard(channel))?;
        let (since_epoch, since_offset) = match &query.since {
            Some(p) => (p.epoch.clone(), p.offset),
            None => (String::new(), 0),
        };
        let limit: i64 = query
            .limit
            .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
        let (floor_epoch, floor_offset) = inner.dispatch.watermarks.floor(channel);
        let reply = link::run(
            &inner.metrics,
            inner.cfg.command_timeout(),
            conn,
            |mut c| async move {
                scripts::HISTORY
                    .key(&k.meta)
                    .key(&k.history)
                    .arg(new_epoch())
                    .arg(ms(opts.meta_ttl))
                    .arg(ms(opts.history_ttl))
                    .arg(&since_epoch)
                    .arg(since_offset)
                    .arg(limit)
                    .arg(&floor_epoch)
                    .arg(floor_offset)
                    .invoke_async::<Vec<Value>>(&mut c)
                    .await
            },
        )
        .await?;
        let result = parse_history(reply)?;
        let top = &result.position;
        inner
            .dispatch
            .watermarks
            .observe(channel, &top.epoch, top.offset);
        Ok(result)
    }

    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        let inner = &self.inner;
        let json = serde_json::to_string(who)
            .map_err(|e| BrokerError::internal(e.to_string()).caused_by(e))?;
        inner
            .local_presence
            .lock()
            .expect("presence lock")
            .entry(channel.to_owned())
            .or_default()
            .insert(who.client.clone(), who.clone());
        let result = inner
            .presence_add(channel, &[(who.client.clone(), json)])
            .await;
        if result.is_err() {
            // Not refreshed later either: the hub treats the subscribe as failed.
            forget_local(&inner.local_presence, channel, &who.client);
        }
        result
    }

    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let inner = &self.inner;
        forget_local(&inner.local_presence, channel, client);
        inner.presence_remove(channel, client).await
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        let inner = &self.inner;
        let k = inner.names.channel(channel);
        let conn = inner.commands.conn(inner.shard(channel))?;
        let raw = link::run(
            &inner.metrics,
            inner.cfg.command_timeout(),
            conn,
            |mut c| async move {
                scripts::PRESENCE_LIST
                    .key(&k.presence)
                    .key(&k.presence_expiry)
                    .invoke_async::<Vec<Vec<u8>>>(&mut c)
                    .await
            },
        )
        .await?;
        Ok(raw
            .iter()
            .filter_map(|j| serde_json::from_slice(j).ok())
            .collect())
    }

    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        let inner = &self.inner;
        let payload = keys::encode_presence(joined, who);
        inner
            .publish_raw(channel, &inner.names.pubsub(channel), payload)
            .await
    }

    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        let inner = &self.inner;
        let payload = serde_json::to_vec(message)
            .map_err(|e| BrokerError::internal(e.to_string()).caused_by(e))?;
        let control = inner.names.control.clone();
        // Standalone shards: the control channel lives on shard 0 (every node subscribes there).
        let conn = inner.commands.conn(0)?;
        let command = inner.publish_command();
        link::run(
            &inner.metrics,
            inner.cfg.command_timeout(),
            conn,
            |mut c| async move {
                redis::cmd(command)
                    .arg(&control)
                    .arg(payload)
                    .query_async::<()>(&mut c)
                    .await
            },
        )
        .await
    }

    fn metrics_text(&self) -> String {
        let inner = &self.inner;
        let mode = match (&inner.commands, inner.cluster) {
            (_, true) => "cluster",
            (Commands::Shards(l), _) if l.len() > 1 => "shards",
            _ => "standalone",
        };
        inner.metrics.render(mode)
    }
}

fn forget_local(
    local: &Mutex<HashMap<String, HashMap<String, ClientInfo>>>,
    channel: &str,
    client: &str,
) {
    let mut local = local.lock().expect("presence lock");
    if let Some(clients) = local.get_mut(channel) {
        clients.remove(client);
        if clients.is_empty() {
            local.remove(channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_history_reply() {
        let reply = vec![
            Value::BulkString(b"ep".to_vec()),
            Value::Int(9),
            Value::Int(1),
            Value::BulkString(b"8".to_vec()),
            Value::BulkString(b"{\"a\":1}".to_vec()),
            Value::BulkString(Vec::new()),
            Value::BulkString(b"9".to_vec()),
            Value::BulkString(b"2".to_vec()),
            Value::BulkString(br#"{"user":"u","client":"c"}"#.to_vec()),
        ];
        let h = parse_history(reply).unwrap();
        assert_eq!(
            h.position,
            StreamPosition {
                epoch: "ep".into(),
                offset: 9
            }
        );
        assert!(h.continuous);
        assert_eq!(h.publications.len(), 2);
        assert!(h.publications[0].info.is_none());
        assert_eq!(h.publications[1].info.as_ref().unwrap().client, "c");
        assert!(parse_history(vec![Value::Nil]).is_err());
    }
}
