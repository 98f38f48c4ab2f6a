//! Consumers: publish and broadcast commands taken from outside sources instead of the HTTP API.
//!
//! An application that must not lose a publication when its HTTP publish fails writes the
//! command somewhere durable in its own transaction, and the node drains it. The `[consumers]`
//! section of the config names the sources; [`spawn_all`] starts one task per configured
//! consumer, and [`Consumers::stop`] ends them on shutdown. Each source has its own module:
//! [`postgres`] drains a transactional-outbox table (docs/consumers.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_core::{Config, NodeContext};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod postgres;

/// How long consumers get on shutdown to finish the row they publish and commit.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The `[consumers]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumersConfig {
    /// PostgreSQL outboxes by name (`[consumers.postgres.NAME]`); the name labels metrics and
    /// logs.
    pub postgres: BTreeMap<String, postgres::PostgresConsumerConfig>,
}

impl ConsumersConfig {
    /// The section from the node's config (none configured when it is absent), checked.
    pub fn from_config(config: &Config) -> anyhow::Result<ConsumersConfig> {
        let Some(table) = &config.consumers else {
            return Ok(ConsumersConfig::default());
        };
        let consumers: ConsumersConfig =
            serde_json::from_value(table.clone()).context("invalid [consumers] section")?;
        for (name, pg) in &consumers.postgres {
            pg.validate()
                .with_context(|| format!("invalid [consumers.postgres.{name}]"))?;
        }
        Ok(consumers)
    }

    /// Whether no consumer is configured.
    pub fn is_empty(&self) -> bool {
        self.postgres.is_empty()
    }
}

/// The running consumers of a node.
pub struct Consumers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Start every configured consumer on `ctx`'s hub.
pub fn spawn_all(ctx: &Arc<NodeContext>, config: &ConsumersConfig) -> Consumers {
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    for (name, pg) in &config.postgres {
        tracing::info!(consumer = %name, table = %pg.table, partitions = pg.partitions, "PostgreSQL outbox consumer started");
        tasks.push(tokio::spawn(postgres::run(
            ctx.clone(),
            name.clone(),
            pg.clone(),
            stopped.clone(),
        )));
    }
    Consumers { stop, tasks }
}

impl Consumers {
    /// Ask every consumer to stop after the row in hand, and wait for them (at most a few
    /// seconds; a row left behind in an open transaction is rolled back and taken again later,
    /// under the same idempotency key).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_GRACE, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // figment's Jail closures return figment::Error, which is large by design.
    #[allow(clippy::result_large_err)]
    fn postgres_consumers_come_from_the_file_and_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "herald.toml",
                "[consumers.postgres.orders]\ndsn = \"host=127.0.0.1 user=app\"\npartitions = 4\n",
            )?;
            jail.set_env("HERALD_CONSUMERS__POSTGRES__ORDERS__BATCH_SIZE", "10");
            jail.set_env("HERALD_CONSUMERS__POSTGRES__ORDERS__TABLE", "app.outbox");
            let config = crate::settings::load(&crate::settings::Overrides {
                config: Some("herald.toml".into()),
                ..Default::default()
            })
            .expect("loads");
            let c = ConsumersConfig::from_config(&config).expect("valid");
            let orders = &c.postgres["orders"];
            assert_eq!(orders.dsn, "host=127.0.0.1 user=app");
            assert_eq!(orders.partitions, 4);
            assert_eq!(orders.batch_size, 10);
            assert_eq!(orders.table, "app.outbox");
            assert_eq!(orders.poll_interval_ms, 1000);
            assert!(!orders.create_table);
            Ok(())
        });
    }

    #[test]
    fn bad_consumer_sections_are_refused() {
        // The section reaches the server as a JSON value, whatever the file's format.
        let refused = |json: &str| {
            let config = Config {
                consumers: Some(serde_json::from_str(json).expect("test JSON")),
                ..Config::default()
            };
            ConsumersConfig::from_config(&config).is_err()
        };
        assert!(refused(
            r#"{"postgres": {"a": {"dsn": "host=h", "tabel": "t"}}}"#
        ));
        assert!(refused(
            r#"{"postgres": {"a": {"dsn": "host=h", "table": "Bad-Name"}}}"#
        ));
        assert!(refused(
            r#"{"postgres": {"a": {"dsn": "host=h", "partitions": 0}}}"#
        ));
        assert!(refused(r#"{"postgres": {"a": {"table": "t"}}}"#));
        assert!(refused(r#"{"rabbit": {}}"#));
        assert!(refused(
            r#"{"postgres": {"a": {"dsn": "host=h", "ca_file": "/no/such/ca.pem"}}}"#
        ));
        assert!(!refused(r#"{"postgres": {"a": {"dsn": "host=h"}}}"#));
    }
}
