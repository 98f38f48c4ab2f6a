//! # Herald's Broker on Redis
//!
//! Any number of Herald nodes share one Redis (or standalone shards, a Sentinel-managed master, or
//! a Redis Cluster) and behave as one server:
//! - a node subscribes to a channel's Redis channel only while it hosts a subscriber of it
//!   (`SUBSCRIBE`, or `SSUBSCRIBE` on a Cluster so a message stays on the shard that owns its slot);
//!   never a pattern subscription, so broker work grows with the nodes that host a channel, not
//!   with all nodes;
//! - publishing is one Lua script that assigns the offset, appends to the channel's history stream
//!   and publishes, atomically; history, recovery and presence are read from Redis, so a client
//!   can reconnect to any node and recover with `since`;
//! - a node that loses Redis keeps serving its local clients, fails publishes fast with
//!   "unavailable", reconnects with backoff, subscribes every hosted channel again and then asks
//!   the hub to catch up from history.
//!
//! ```no_run
//! # async fn f() -> Result<(), herald_broker::BrokerError> {
//! let broker = herald_broker_redis::connect("redis://127.0.0.1:6379", "node-a").await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`config`]: [`RedisConfig`], the `[redis]` table and the URL forms.
//! - `names`: key and pub/sub names (hash-tagged per channel), slots and shards.
//! - `codec`: how publications and presence changes are laid out in a pub/sub message.
//! - `scripts`: the Lua scripts for publish, history and presence.
//! - `link`: command connections that fail fast and reconnect in the background.
//! - `topology`: connecting to standalone shards, a Sentinel-managed master or a Cluster.
//! - `publish`: the atomic publish script; presence changes and control messages.
//! - `masters`: a broadcast on a Cluster, one pipeline per master.
//! - `history`: the history script and its reply.
//! - `presence`: presence entries, their expiry and this node's refresh.
//! - `receive`: subscription connections, batching, resubscribe and catch-up after a loss
//!   (the receiving side).
//! - `broker`: [`RedisBroker`], shared state, routing the `Broker` trait's calls.
//! - `metrics`: the `herald_broker_*` Prometheus lines.

mod admin;
mod broker;
mod codec;
pub mod config;
mod history;
mod link;
mod masters;
mod metrics;
mod names;
mod presence;
mod publish;
mod receive;
mod scripts;
mod topology;

pub use broker::RedisBroker;
pub use config::{RedisConfig, SentinelConfig};

use herald_broker::{BrokerError, SharedBroker};

/// Connect to the broker at `url` as node `node`: `redis://host:port`, `rediss://…`,
/// `redis+cluster://host1:port1,host2:port2`, `redis+sentinel://h1:p1,h2:p2/master` or
/// `redis+shards://h1:p1,h2:p2`. Fails if Redis cannot be reached now.
pub async fn connect(url: &str, node: &str) -> Result<SharedBroker, BrokerError> {
    connect_with(RedisConfig::from_url(url), node).await
}

/// Connect with a full [`RedisConfig`] (the server's `[redis]` table).
pub async fn connect_with(config: RedisConfig, node: &str) -> Result<SharedBroker, BrokerError> {
    Ok(RedisBroker::connect(config, node).await?.shared())
}
