//! Choosing the broker from `broker_url`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use herald_broker::{redact_url, MemoryBroker, SharedBroker};
use herald_core::Config;

/// The in-memory broker forgets expired streams at least this often.
const SWEEP_AT_MOST: Duration = Duration::from_secs(60);

/// Connect the broker the config names: `memory`, `redis://…`, `rediss://…`,
/// `redis+cluster://…` or `nats://…`.
pub async fn connect(config: &Config) -> anyhow::Result<SharedBroker> {
    let url = config.broker_url.trim();
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        "" | "memory" => {
            let broker = Arc::new(MemoryBroker::new());
            // Often enough that a stream outlives its TTL by at most half the shortest one.
            let shortest_empty = std::iter::once(&config.default_namespace)
                .chain(&config.namespaces)
                .map(|ns| ns.stream_options().empty_ttl)
                .min()
                .unwrap_or_default();
            let every = (shortest_empty / 2).clamp(Duration::from_millis(500), SWEEP_AT_MOST);
            broker.spawn_sweeper(every);
            Ok(broker)
        }
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel"
        | "redis+shards" | "rediss+shards" => {
            // The `[redis]` table wins; `broker_url` fills in the servers when it names none.
            let table = config.redis.clone().unwrap_or_else(|| serde_json::json!({}));
            let redis: herald_broker_redis::RedisConfig =
                serde_json::from_value(table).context("invalid [redis] table")?;
            let redis = if url.contains("://") { redis.or_url(url) } else { redis };
            herald_broker_redis::connect_with(redis, &config.node_name)
                .await
                .with_context(|| format!("connecting to Redis at {}", redact_url(url)))
        }
        "nats" | "tls" => {
            let table = config.nats.clone().unwrap_or_else(|| serde_json::json!({}));
            let nats: herald_broker_nats::NatsConfig =
                serde_json::from_value(table).context("invalid [nats] table")?;
            let nats = if url.contains("://") { nats.or_url(url) } else { nats };
            herald_broker_nats::connect_with(nats, &config.node_name)
                .await
                .with_context(|| format!("connecting to NATS at {}", redact_url(url)))
        }
        other => bail!(
            "unknown broker {other:?} in broker_url (memory, redis://, rediss://, redis+cluster://, \
             redis+sentinel://, redis+shards://, nats://)"
        ),
    }
}
