//! Command connections: how a node reaches the Redis server that owns a channel, fails fast while
//! that server is unreachable, and reconnects in the background.
//!
//! Commands and subscriptions never share a connection: a slow pub/sub reader must not delay a
//! publish, and a command timeout must not tear down subscriptions.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use herald_broker::{Backoff, BrokerError};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError, RedisFuture, Value,
};

use crate::config::RedisConfig;
use crate::metrics::Metrics;

/// How many command timeouts a command connection may stay silent for (commands waiting, nothing
/// answered) before it counts as lost. One late reply is usually a busy or stalled server, and
/// replacing the connection then only makes every command fail until a new one is open; a dead
/// link still times out again and again.
const SILENT_TIMEOUTS_TO_DROP: u32 = 3;

/// Whether an error means the connection is gone (or hopeless) and must be replaced.
pub(crate) fn is_connection_error(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
}

/// Map a Redis error to what it means for the caller: retry later (111 / 503) or a bug (100).
pub(crate) fn broker_error(err: RedisError) -> BrokerError {
    const RETRYABLE: [&str; 9] = [
        "LOADING",
        "BUSY",
        "OOM",
        "CLUSTERDOWN",
        "TRYAGAIN",
        "MASTERDOWN",
        "READONLY",
        "NOREPLICAS",
        "MOVED",
    ];
    if is_connection_error(&err) || err.code().is_some_and(|c| RETRYABLE.contains(&c)) {
        BrokerError::unavailable(format!("redis: {err}")).caused_by(err)
    } else {
        BrokerError::internal(format!("redis: {err}")).caused_by(err)
    }
}

/// Turn a URL plus the config's overrides into connection settings.
pub(crate) fn connection_info(
    url: &str,
    cfg: &RedisConfig,
    protocol: ProtocolVersion,
) -> Result<ConnectionInfo, BrokerError> {
    let url = match url.strip_prefix("redis://") {
        Some(rest) if cfg.tls => format!("rediss://{rest}"),
        _ => url.to_owned(),
    };
    let info = url.as_str().into_connection_info().map_err(|e| {
        BrokerError::internal(format!("redis config: bad URL {url}: {e}")).caused_by(e)
    })?;
    let mut redis = info.redis_settings().clone().set_protocol(protocol);
    if let Some(u) = &cfg.username {
        redis = redis.set_username(u);
    }
    if let Some(p) = &cfg.password {
        redis = redis.set_password(p);
    }
    let mut info = info.set_redis_settings(redis);
    if cfg.tls_insecure {
        if let ConnectionAddr::TcpTls {
            host,
            port,
            tls_params,
            ..
        } = info.addr().clone()
        {
            info = info.set_addr(ConnectionAddr::TcpTls {
                host,
                port,
                insecure: true,
                tls_params,
            });
        }
    }
    Ok(info)
}

/// Client certificates and CA from the config, when any is set.
#[cfg(feature = "tls")]
pub(crate) fn tls_certificates(
    cfg: &RedisConfig,
) -> Result<Option<redis::TlsCertificates>, BrokerError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            BrokerError::internal(format!("redis config: {}: {e}", p.display())).caused_by(e)
        })
    };
    let root_cert = cfg.tls_ca_file.as_deref().map(read).transpose()?;
    let client_tls = match (&cfg.tls_client_cert_file, &cfg.tls_client_key_file) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read(c)?,
            client_key: read(k)?,
        }),
        (None, None) => None,
        _ => {
            return Err(BrokerError::internal(
                "redis config: set both tls_client_cert_file and tls_client_key_file",
            ))
        }
    };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

/// A `Client` for one server, with the config's TLS files when there are any.
pub(crate) fn client(info: ConnectionInfo, cfg: &RedisConfig) -> Result<Client, BrokerError> {
    #[cfg(feature = "tls")]
    if let Some(certs) = tls_certificates(cfg)? {
        return Client::build_with_tls(info, certs)
            .map_err(|e| BrokerError::internal(format!("redis config: {e}")).caused_by(e));
    }
    let _ = cfg;
    Client::open(info).map_err(|e| BrokerError::internal(format!("redis config: {e}")).caused_by(e))
}

/// How to open a new connection to one standalone server: a fixed address, or whatever master
/// Sentinel names right now (asked again on every reconnect, so a failover is followed).
pub(crate) enum Connector {
    /// A fixed server.
    Client(Client),
    /// The master of a Sentinel group.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

impl Connector {
    /// Open a connection with the given timeouts and push sender.
    pub(crate) async fn connect(
        &self,
        config: AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection, RedisError> {
        match self {
            Connector::Client(c) => {
                c.get_multiplexed_async_connection_with_config(&config)
                    .await
            }
            Connector::Sentinel(s) => {
                let client = s.lock().await.async_get_client().await?;
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
        }
    }

    /// Where this connector points, for logs.
    pub(crate) fn describe(&self) -> String {
        match self {
            Connector::Client(c) => c.get_connection_info().addr().to_string(),
            Connector::Sentinel(_) => "sentinel master".into(),
        }
    }
}

/// Backoff between reconnect attempts: from `reconnect_min_ms` doubling to `reconnect_max_ms`,
/// ±25 % jitter.
pub(crate) fn backoff(cfg: &RedisConfig) -> Backoff {
    Backoff::new(
        Duration::from_millis(cfg.reconnect_min_ms),
        Duration::from_millis(cfg.reconnect_max_ms),
    )
}

/// What the publish and history scripts get as the server's identity on a Cluster, where a call
/// may land on any master: read `run_id` from `INFO server` inside the script (about 7 µs of
/// Redis time per call, measured on Redis 7.0).
pub(crate) const IDENTITY_IN_SCRIPT: &str = "*";

/// The `run_id` in an `INFO server` reply: random for every start of the Redis process, so a
/// restart (from whatever data) or a failover to another process changes it.
pub(crate) fn run_id(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
}

/// Read the server's `run_id` on a fresh connection.
async fn read_run_id(c: &mut MultiplexedConnection) -> Result<Arc<str>, RedisError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(c).await?;
    run_id(&info).map(Arc::from).ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "INFO server has no run_id",
        ))
    })
}

/// The live connection of a [`Link`].
pub(crate) type Live = (u64, MultiplexedConnection, Arc<str>);

/// The command connection to one standalone server. While the server is unreachable, commands
/// fail at once with [`BrokerError::Unavailable`] and one background task reconnects with backoff.
pub(crate) struct Link {
    connector: Connector,
    config: AsyncConnectionConfig,
    backoff: Backoff,
    /// Read the server's `run_id` on every new connection (not with `synchronous_persistence`).
    read_identity: bool,
    /// The live connection, its generation and the `run_id` of the server it reaches (empty when
    /// not read); `None` while reconnecting. A connection never outlives its server process, so
    /// the `run_id` read when it opened stays true for its whole life.
    conn: Mutex<Option<Live>>,
    generation: AtomicU64,
    reconnecting: AtomicBool,
    /// The command timeout: a link silent for [`SILENT_TIMEOUTS_TO_DROP`] of them is lost.
    command_timeout: Duration,
    /// Since when the live connection has been silent: the start of the first command that timed
    /// out after its last answer (with that connection's generation); `None` once one answers.
    silent_since: Mutex<Option<(u64, Instant)>>,
}

impl Link {
    /// Connect now; fails if the server cannot be reached.
    pub(crate) async fn connect(
        connector: Connector,
        cfg: &RedisConfig,
    ) -> Result<Arc<Link>, BrokerError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout()))
            .set_response_timeout(Some(cfg.command_timeout()));
        let link = Arc::new(Link {
            connector,
            config,
            backoff: backoff(cfg),
            read_identity: !cfg.synchronous_persistence,
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            reconnecting: AtomicBool::new(true),
            command_timeout: cfg.command_timeout(),
            silent_since: Mutex::new(None),
        });
        link.open().await.map_err(|e| {
            BrokerError::unavailable(format!("redis at {}: {e}", link.connector.describe()))
                .caused_by(e)
        })?;
        link.reconnecting.store(false, Ordering::Release);
        Ok(link)
    }

    /// Open a new connection (next generation) whose loss is noticed at once, not at the next
    /// command: the connection's reader reports `Disconnection` and a reconnect starts.
    async fn open(self: &Arc<Self>) -> Result<(), RedisError> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let weak = Arc::downgrade(self);
        let on_push = move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                if let Some(link) = weak.upgrade() {
                    link.lost(generation, "connection closed");
                }
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let config = self.config.clone().set_push_sender(on_push);
        let mut c = self.connector.connect(config).await?;
        let identity = if self.read_identity {
            read_run_id(&mut c).await?
        } else {
            Arc::from("")
        };
        *self.conn.lock().expect("link lock") = Some((generation, c, identity));
        Ok(())
    }

    /// The live connection, or `Unavailable` at once (and a reconnect starts).
    pub(crate) fn get(self: &Arc<Self>) -> Result<Live, BrokerError> {
        if let Some(c) = self.conn.lock().expect("link lock").clone() {
            return Ok(c);
        }
        self.start_reconnect();
        Err(BrokerError::unavailable(format!(
            "redis at {} is unreachable; reconnecting",
            self.connector.describe()
        )))
    }

    /// A command on connection `generation` was answered (a Redis error is an answer too): the
    /// connection is not silent.
    pub(crate) fn answered(&self, generation: u64) {
        let mut silent = self.silent_since.lock().expect("link lock");
        if silent.is_some_and(|(g, _)| g == generation) {
            *silent = None;
        }
    }

    /// A command started at `started` on connection `generation` failed with `err`: drop that
    /// connection if the error says it is gone. A timeout says so only once the connection has
    /// been silent for [`SILENT_TIMEOUTS_TO_DROP`] command timeouts: a short stall of the server
    /// costs the commands sent into it, not the connection.
    pub(crate) fn failed(self: &Arc<Self>, generation: u64, started: Instant, err: &RedisError) {
        if err.is_timeout() {
            let silent_for = {
                let mut silent = self.silent_since.lock().expect("link lock");
                let since = match *silent {
                    Some((g, since)) if g == generation => since,
                    _ => {
                        *silent = Some((generation, started));
                        started
                    }
                };
                since.elapsed()
            };
            if silent_for < self.command_timeout * SILENT_TIMEOUTS_TO_DROP {
                tracing::debug!(server = %self.connector.describe(), silent_ms = silent_for.as_millis() as u64, "redis command did not answer in time; keeping the connection");
                return;
            }
            self.lost(generation, &err.to_string());
        } else if is_connection_error(err) || err.code() == Some("READONLY") {
            // READONLY: the server became a replica (Sentinel failover); a new connection asks
            // Sentinel for the new master.
            self.lost(generation, &err.to_string());
        } else {
            self.answered(generation);
        }
    }

    fn lost(self: &Arc<Self>, generation: u64, cause: &str) {
        {
            let mut conn = self.conn.lock().expect("link lock");
            if conn.as_ref().is_some_and(|(g, _, _)| *g == generation) {
                tracing::warn!(server = %self.connector.describe(), cause, "redis command connection lost");
                *conn = None;
            }
        }
        self.start_reconnect();
    }

    /// `PING` on the live connection: whether commands work right now.
    pub(crate) async fn probe(self: &Arc<Self>, timeout: Duration) -> Result<(), RedisError> {
        let started = Instant::now();
        let (generation, mut c, _) = self.get().map_err(|e| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                e.to_string(),
            ))
        })?;
        let result =
            match tokio::time::timeout(timeout, redis::cmd("PING").query_async::<()>(&mut c)).await
            {
                Ok(r) => r,
                Err(_) => Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "PING timed out",
                ))),
            };
        match &result {
            Ok(()) => self.answered(generation),
            Err(e) => self.failed(generation, started, e),
        }
        result
    }

    fn start_reconnect(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Link> = Arc::downgrade(self);
        let mut backoff = self.backoff;
        tokio::spawn(async move {
            loop {
                let delay = backoff.next_delay();
                tokio::time::sleep(delay).await;
                let Some(link) = weak.upgrade() else { return };
                match link.open().await {
                    Ok(()) => {
                        link.reconnecting.store(false, Ordering::Release);
                        tracing::info!(server = %link.connector.describe(), "redis command connection restored");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(server = %link.connector.describe(), cause = %e, "redis reconnect failed");
                    }
                }
            }
        });
    }
}

/// How a subscriber checks that commands work before it asks the hub to catch up (a catch-up
/// reads history through the command connection).
#[derive(Clone)]
pub(crate) enum Probe {
    /// The command link of the same standalone server.
    Link(Arc<Link>),
    /// The cluster command connection (`PING` goes to every primary).
    Cluster(ClusterConnection),
}

impl Probe {
    pub(crate) async fn check(&self, timeout: Duration) -> Result<(), RedisError> {
        match self {
            Probe::Link(link) => link.probe(timeout).await,
            Probe::Cluster(c) => {
                let mut c = c.clone();
                match tokio::time::timeout(timeout, redis::cmd("PING").query_async::<()>(&mut c))
                    .await
                {
                    Ok(r) => r,
                    Err(_) => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "PING timed out",
                    ))),
                }
            }
        }
    }
}

/// Where commands go: standalone shards (one [`Link`] each) or a Cluster connection that routes
/// by slot and follows `MOVED` itself.
pub(crate) enum Commands {
    /// One or more standalone servers; a channel lives on `names::shard_of(channel, n)`.
    Shards(Vec<Arc<Link>>),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

/// One connection picked for one command.
pub(crate) enum Conn {
    /// A standalone server's connection, with its link and generation to report failures, and
    /// its server's `run_id` (empty when not read).
    Single(Arc<Link>, u64, MultiplexedConnection, Arc<str>),
    /// The cluster connection.
    Cluster(ClusterConnection),
}

impl Conn {
    /// The server identity the scripts bind a stream's epoch to: the `run_id` read when the
    /// connection opened, [`IDENTITY_IN_SCRIPT`] on a Cluster. Empty: do not bind (the operator
    /// declared `synchronous_persistence`; the caller checks that for a Cluster).
    pub(crate) fn identity(&self) -> Arc<str> {
        match self {
            Conn::Single(_, _, _, id) => id.clone(),
            Conn::Cluster(_) => Arc::from(IDENTITY_IN_SCRIPT),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(_, _, c, _) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(_, _, c, _) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(_, _, c, _) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Commands {
    /// The connection for shard `shard` (standalone) or the cluster connection.
    pub(crate) fn conn(&self, shard: usize) -> Result<Conn, BrokerError> {
        match self {
            Commands::Shards(links) => {
                let link = &links[shard];
                let (generation, c, identity) = link.get()?;
                Ok(Conn::Single(link.clone(), generation, c, identity))
            }
            Commands::Cluster(c) => Ok(Conn::Cluster(c.clone())),
        }
    }
}

/// Run one command (or script) with the round trip measured, a hard timeout, and failures
/// reported to the link so that a dead connection is replaced.
pub(crate) async fn run<T, F, Fut>(
    metrics: &Metrics,
    timeout: Duration,
    conn: Conn,
    f: F,
) -> Result<T, BrokerError>
where
    F: FnOnce(Conn) -> Fut,
    Fut: std::future::Future<Output = Result<T, RedisError>>,
{
    let origin = match &conn {
        Conn::Single(link, generation, _, _) => Some((link.clone(), *generation)),
        Conn::Cluster(_) => None,
    };
    let started = Instant::now();
    let result = tokio::time::timeout(timeout, f(conn)).await;
    metrics.observe_rtt(started.elapsed());
    let err = match result {
        Ok(Ok(v)) => {
            if let Some((link, generation)) = origin {
                link.answered(generation);
            }
            return Ok(v);
        }
        Ok(Err(e)) => e,
        Err(_) => RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "redis command timed out",
        )),
    };
    if let Some((link, generation)) = origin {
        link.failed(generation, started, &err);
    }
    Err(broker_error(err))
}

#[cfg(test)]
mod tests {
    use super::run_id;

    #[test]
    fn run_id_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:bf96ef19\r\ntcp_port:6379\r\n";
        assert_eq!(run_id(info), Some("bf96ef19"));
        assert_eq!(run_id("# Server\r\nrun_id:\r\n"), None);
        assert_eq!(run_id(""), None);
    }
}
