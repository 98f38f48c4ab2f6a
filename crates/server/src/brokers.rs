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
        "redis" | "rediss" | "redis+cluster" => {
            herald_broker_redis::connect(url, &config.node_name)
                .await
                .with_context(|| format!("connecting to Redis at {url}"))
        }
        "nats" => herald_broker_nats::connect(url, &config.node_name)
            .await
            .with_context(|| format!("connecting to NATS at {url}")),
        other => bail!(
            "unknown broker {other:?} in broker_url (memory, redis://, redis+cluster://, nats://)"
        ),
    }
}
