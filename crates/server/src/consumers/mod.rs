//! Consumers: publish and broadcast commands taken from outside sources instead of the HTTP API,
//! in its shape, run through [`crate::publishing`].
//!
//! An application that must not lose a publication when its HTTP publish fails writes the
//! command somewhere durable in its own transaction, and the node drains it. The `[consumers]`
//! section names the sources; [`Consumers::start`] starts one task per configured consumer and
//! [`Consumers::stopped`] waits for them when the node drains. Each source has its own module:
//! [`postgres`] drains a transactional-outbox table (docs/consumers.md), [`kafka`] consumes Kafka
//! topics in a consumer group (docs/consumers-kafka.md).

pub mod batch;
pub mod kafka;
pub mod postgres;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_core::{Config, NodeContext};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The `[consumers]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumersConfig {
    /// PostgreSQL outboxes by name (`[consumers.postgres.NAME]`); the name labels metrics and
    /// logs.
    pub postgres: BTreeMap<String, postgres::PostgresConsumerConfig>,
    /// `[consumers.kafka]` or `[[consumers.kafka]]`.
    pub kafka: Option<kafka::KafkaConfigs>,
}

impl ConsumersConfig {
    /// The section from the node's config (none configured when it is absent), checked.
    pub fn from_config(config: &Config) -> anyhow::Result<ConsumersConfig> {
        ConsumersConfig::load(config.consumers.as_ref())
    }

    /// Read and check the section as the config loader left it.
    pub fn load(value: Option<&serde_json::Value>) -> anyhow::Result<ConsumersConfig> {
        let config: ConsumersConfig = match value {
            Some(v) => serde_json::from_value(v.clone()).context("invalid [consumers] section")?,
            None => ConsumersConfig::default(),
        };
        for (name, pg) in &config.postgres {
            pg.validate()
                .with_context(|| format!("invalid [consumers.postgres.{name}]"))?;
        }
        kafka::ensure_supported(config.kafka_consumers().len(), kafka::SUPPORTED)?;
        let mut names = BTreeSet::new();
        for k in config.kafka_consumers() {
            k.validate()?;
            if !names.insert(k.name().to_owned()) {
                anyhow::bail!(
                    "consumers.kafka: two consumers named {:?} (set name)",
                    k.name()
                );
            }
        }
        Ok(config)
    }

    /// Whether no consumer is configured.
    pub fn is_empty(&self) -> bool {
        self.postgres.is_empty() && self.kafka_consumers().is_empty()
    }

    fn kafka_consumers(&self) -> Vec<kafka::KafkaConfig> {
        self.kafka.clone().map(|k| k.into_vec()).unwrap_or_default()
    }
}

/// The running consumers of a node.
pub struct Consumers {
    tasks: Vec<JoinHandle<()>>,
}

impl Consumers {
    /// Start every configured consumer on `ctx`'s hub; each stops taking work once `stop` turns
    /// true (the node drains). A consumer whose client cannot be created is an error (the node
    /// does not start).
    pub fn start(
        config: &ConsumersConfig,
        ctx: &Arc<NodeContext>,
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<Consumers> {
        let mut tasks = Vec::new();
        for (name, pg) in &config.postgres {
            tracing::info!(consumer = %name, table = %pg.table, partitions = pg.partitions, "PostgreSQL outbox consumer started");
            tasks.push(tokio::spawn(postgres::run(
                ctx.clone(),
                name.clone(),
                pg.clone(),
                stop.clone(),
            )));
        }
        kafka::ensure_supported(config.kafka_consumers().len(), kafka::SUPPORTED)?;
        #[cfg(feature = "kafka")]
        for k in config.kafka_consumers() {
            let consumer = kafka::KafkaConsumer::new(k, ctx.clone())?;
            tasks.push(tokio::spawn(consumer.run(stop.clone())));
        }
        Ok(Consumers { tasks })
    }

    /// Wait up to `within` for the consumers to finish the row or record in hand, commit and
    /// leave; the rest are aborted (a row left in an open transaction is rolled back and taken
    /// again later, an uncommitted record is read again: both under the same idempotency key).
    pub async fn stopped(self, within: Duration) {
        let aborts: Vec<_> = self.tasks.iter().map(|t| t.abort_handle()).collect();
        let all = futures_util::future::join_all(self.tasks);
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!("consumers did not stop in time");
            for a in aborts {
                a.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{load, Overrides};

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
            let config = load(&Overrides {
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

    #[cfg(feature = "kafka")]
    #[test]
    // figment's Jail closures return figment::Error, which is large by design.
    #[allow(clippy::result_large_err)]
    fn kafka_keys_come_from_the_file_and_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "herald.toml",
                "[consumers.kafka]\ntopics = [\"orders\"]\nbatch_size = 50\n\
                 [consumers.kafka.properties]\n\"fetch.wait.max.ms\" = \"100\"\n",
            )?;
            jail.set_env("HERALD_CONSUMERS__KAFKA__BROKERS", "k1:9092,k2:9092");
            jail.set_env("HERALD_CONSUMERS__KAFKA__SASL_PASSWORD", "12345");
            jail.set_env("HERALD_CONSUMERS__KAFKA__GROUP_ID", "fanout");
            let c = load(&Overrides {
                config: Some("herald.toml".into()),
                ..Overrides::default()
            })
            .expect("loads");
            let consumers = ConsumersConfig::load(c.consumers.as_ref()).expect("valid");
            let k = &consumers.kafka_consumers()[0];
            assert_eq!(k.brokers, ["k1:9092", "k2:9092"]);
            assert_eq!(k.topics, ["orders"]);
            assert_eq!(k.group_id, "fanout");
            assert_eq!(k.name(), "fanout");
            assert_eq!(k.sasl_password, Some(kafka::Secret("12345".into())));
            assert_eq!(k.batch_size, 50);
            assert_eq!(k.properties["fetch.wait.max.ms"], "100");
            Ok(())
        });
    }

    /// Built without the `kafka` feature, a config naming a Kafka consumer fails to load
    /// instead of being ignored.
    #[cfg(not(feature = "kafka"))]
    #[test]
    fn kafka_consumers_are_refused_by_a_build_without_kafka() {
        let one = serde_json::json!({"kafka": {"brokers": "k:9092", "topics": "a"}});
        let e = ConsumersConfig::load(Some(&one)).unwrap_err().to_string();
        assert!(e.contains("rebuild with --features kafka"), "{e}");
        let pg = serde_json::json!({"postgres": {"a": {"dsn": "host=h"}}});
        assert!(ConsumersConfig::load(Some(&pg)).is_ok());
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn a_consumer_without_brokers_or_topics_is_refused() {
        let bad = serde_json::json!({"kafka": {"brokers": "k:9092", "topics": []}});
        assert!(ConsumersConfig::load(Some(&bad)).is_err());
        let bad = serde_json::json!({"kafka": {"topics": "t"}});
        assert!(ConsumersConfig::load(Some(&bad)).is_err());
        let twice = serde_json::json!({"kafka": [
            {"brokers": "k:9092", "topics": "a"}, {"brokers": "k:9092", "topics": "b"}
        ]});
        assert!(
            ConsumersConfig::load(Some(&twice)).is_err(),
            "same name twice"
        );
        let into_itself = serde_json::json!({"kafka": {
            "brokers": "k:9092", "topics": "a", "dead_letter_topic": "a"
        }});
        assert!(ConsumersConfig::load(Some(&into_itself)).is_err());
        let dead = serde_json::json!({"kafka": {
            "brokers": "k:9092", "topics": "a", "dead_letter_topic": "a-dead"
        }});
        let c = ConsumersConfig::load(Some(&dead)).expect("valid");
        assert_eq!(
            c.kafka_consumers()[0].dead_letter_topic.as_deref(),
            Some("a-dead")
        );
    }
}
