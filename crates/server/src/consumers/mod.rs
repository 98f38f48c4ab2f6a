//! Consumers: publish and broadcast commands that come from outside the HTTP API, in its shape,
//! run through [`crate::publishing`]. `[consumers.kafka]` takes them from Kafka topics
//! ([`kafka`]). Each consumer is a task of its own, started with the node and stopped when it
//! drains.

pub mod kafka;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_core::NodeContext;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The `[consumers]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumersConfig {
    /// `[consumers.kafka]` or `[[consumers.kafka]]`.
    #[serde(default)]
    pub kafka: Option<kafka::KafkaConfigs>,
}

impl ConsumersConfig {
    /// Read and check the section as the config loader left it.
    pub fn load(value: Option<&serde_json::Value>) -> anyhow::Result<ConsumersConfig> {
        let config: ConsumersConfig = match value {
            Some(v) => serde_json::from_value(v.clone()).context("invalid [consumers] section")?,
            None => ConsumersConfig::default(),
        };
        let mut names = std::collections::BTreeSet::new();
        for k in config.kafka_consumers() {
            k.validate().map_err(anyhow::Error::msg)?;
            if !names.insert(k.name().to_owned()) {
                anyhow::bail!(
                    "consumers.kafka: two consumers named {:?} (set name)",
                    k.name()
                );
            }
        }
        Ok(config)
    }

    fn kafka_consumers(&self) -> Vec<kafka::KafkaConfig> {
        self.kafka.clone().map(|k| k.into_vec()).unwrap_or_default()
    }
}

/// The running consumers.
pub struct Consumers {
    tasks: Vec<JoinHandle<()>>,
}

impl Consumers {
    /// Start every configured consumer; each stops once `stop` turns true. A consumer whose
    /// client cannot be created is an error (the node does not start).
    pub fn start(
        config: &ConsumersConfig,
        ctx: &Arc<NodeContext>,
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<Consumers> {
        let mut tasks = Vec::new();
        for k in config.kafka_consumers() {
            let consumer = kafka::KafkaConsumer::new(k, ctx.clone())?;
            tasks.push(tokio::spawn(consumer.run(stop.clone())));
        }
        Ok(Consumers { tasks })
    }

    /// Wait up to `within` for the consumers to commit and leave.
    pub async fn stopped(self, within: Duration) {
        let all = futures_util::future::join_all(self.tasks);
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!("consumers did not stop in time");
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
    }
}
