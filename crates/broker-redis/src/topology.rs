//! Connecting: the command links and subscription connections for each topology (standalone
//! shards, Sentinel, Cluster), built from [`RedisConfig`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use herald_broker::{Backoff, BrokerError, Watermarks};
use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, ProtocolVersion};

use crate::broker::Inner;
use crate::config::{RedisConfig, Topology};
use crate::link::{self, Commands, Connector, Link, Probe};
use crate::masters::Masters;
use crate::metrics::Metrics;
use crate::names::Names;
use crate::receive::{self, Backend, Dispatch, Subscriber};

/// Connect to the servers `cfg` names, as node `node`. Fails if Redis cannot be reached now.
pub(crate) async fn connect(cfg: RedisConfig, node: &str) -> Result<Inner, BrokerError> {
    let topology = cfg.topology()?;
    let names = Names::new(&cfg.key_prefix);
    let metrics = Arc::new(Metrics::default());
    let dispatch = Arc::new(Dispatch {
        names: names.clone(),
        handler: OnceLock::new(),
        metrics: metrics.clone(),
        watermarks: Watermarks::new(),
    });
    let backoff = link::backoff(&cfg);
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
    let mut masters = Masters::default();
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
                    single_subscriber(sub, &cfg, &client_name, &dispatch, backoff, health, probe)
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
            let first = seeds.first().map(String::as_str).unwrap_or_default();
            let settings = link::connection_info(first, &cfg, ProtocolVersion::RESP2)?
                .redis_settings()
                .clone();
            masters = Masters::new(
                cfg.tls || seeds.iter().any(|s| s.starts_with("rediss://")),
                settings,
            );
            let cmd = cluster_builder(&seeds, &cfg)?
                .build()
                .map_err(config_error)?
                .get_async_connection()
                .await
                .map_err(|e| {
                    BrokerError::unavailable(format!("redis cluster: {e}")).caused_by(e)
                })?;
            let (push, signal_tx, signals) = receive::cluster_push_sender(dispatch.clone());
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
    Ok(Inner {
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
        masters,
    })
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
