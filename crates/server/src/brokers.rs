//! Choosing the broker from `broker_url`.

use std::sync::Arc;

use anyhow::{bail, Context};
use herald_broker::{MemoryBroker, SharedBroker};
use herald_core::Config;

/// Connect the broker the config names: `memory`, `redis://…`, `rediss://…`,
/// `redis+cluster://…` or `nats://…`.
pub async fn connect(config: &Config) -> anyhow::Result<SharedBroker> {
    let url = config.broker_url.trim();
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        "" | "memory" => {
            let broker = Arc::new(MemoryBroker::new());
            let longest_meta = std::iter::once(&config.default_namespace)
                .chain(&config.namespaces)
                .map(|ns| ns.stream_options().meta_ttl)
                .max()
                .unwrap_or_default();
            broker.spawn_sweeper(longest_meta);
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
                .with_context(|| format!("connecting to Redis at {url}"))
        }
        "nats" | "tls" => {
            let table = config.nats.clone().unwrap_or_else(|| serde_json::json!({}));
            let nats: herald_broker_nats::NatsConfig =
                serde_json::from_value(table).context("invalid [nats] table")?;
            let nats = if url.contains("://") { nats.or_url(url) } else { nats };
            herald_broker_nats::connect_with(nats, &config.node_name)
                .await
                .with_context(|| format!("connecting to NATS at {url}"))
        }
        other => bail!(
            "unknown broker {other:?} in broker_url (memory, redis://, rediss://, redis+cluster://, \
             redis+sentinel://, redis+shards://, nats://)"
        ),
    }
}
