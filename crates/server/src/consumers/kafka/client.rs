//! The Kafka client itself (built with the `kafka` feature only): librdkafka's configuration,
//! callbacks, and the loop that consumes records and publishes them (see the parent module).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::centrifugo::command::Action;
use futures_util::FutureExt;
use herald_core::metrics::Labels;
use herald_core::{Metrics, NodeContext};
use herald_protocol::ErrorCode;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;
use tokio::sync::watch;

use super::dead_letter::{DeadLetter, Skipped};
use super::{parse_message, record_key, KafkaConfig, Record, Secret};
use crate::batch::Batch;
use crate::consumers::batch as consumer_batch;
use crate::publishing::execute;

impl KafkaConfig {
    /// The librdkafka configuration: offsets are stored by Herald after each publish and
    /// committed in the background (never before the publish).
    fn client_config(&self, node_name: &str) -> ClientConfig {
        let mut c = self.connection_config(node_name);
        c.set("group.id", &self.group_id)
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.commit.interval.ms",
                self.commit_interval_ms.to_string(),
            )
            .set("auto.offset.reset", &self.auto_offset_reset)
            .set("statistics.interval.ms", self.stats_interval_ms.to_string())
            .set("session.timeout.ms", self.session_timeout_ms.to_string())
            // librdkafka's advice: a third of the session timeout.
            .set(
                "heartbeat.interval.ms",
                (self.session_timeout_ms / 3).max(100).to_string(),
            );
        // `properties` last: they may tune anything but Herald's own keys.
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    /// The dead-letter producer's configuration: the consumer's brokers and credentials,
    /// idempotent (a retried produce is written once), each produce given up after 30 s and
    /// then retried by Herald with the consumer's backoff.
    fn producer_config(&self, node_name: &str) -> ClientConfig {
        let mut c = self.connection_config(node_name);
        c.set("enable.idempotence", "true")
            .set("message.timeout.ms", "30000");
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    /// What the consumer and the dead-letter producer share: brokers, client id, security.
    fn connection_config(&self, node_name: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.brokers.join(","))
            .set(
                "client.id",
                self.client_id
                    .clone()
                    .unwrap_or_else(|| format!("herald-{node_name}")),
            )
            // Reconnect quickly to a restarted broker, and no slower than every 5 s.
            .set("reconnect.backoff.ms", "100")
            .set("reconnect.backoff.max.ms", "5000");
        let optional = [
            ("security.protocol", &self.security_protocol),
            ("sasl.mechanism", &self.sasl_mechanism),
            ("sasl.username", &self.sasl_username),
            ("ssl.ca.location", &self.ssl_ca_location),
            ("ssl.certificate.location", &self.ssl_certificate_location),
            ("ssl.key.location", &self.ssl_key_location),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                c.set(key, v);
            }
        }
        let secrets = [
            ("sasl.password", &self.sasl_password),
            ("ssl.key.password", &self.ssl_key_password),
        ];
        for (key, value) in secrets {
            if let Some(Secret(v)) = value {
                c.set(key, v);
            }
        }
        if !self.ssl_verify_hostname {
            c.set("ssl.endpoint.identification.algorithm", "none");
        }
        c
    }
}

/// Callbacks librdkafka makes: its log lines and errors into `tracing` (a broker that is down is
/// a warning: the client reconnects by itself), its statistics into the lag gauges.
pub(super) struct Callbacks {
    name: String,
    metrics: Arc<Metrics>,
    /// Whether statistics update the lag gauges (the consumer's; not the dead-letter
    /// producer's, whose partitions are not consumed).
    lag: bool,
    /// When each error was last logged: librdkafka repeats "all brokers are down" or an
    /// authentication failure several times a second while it lasts.
    logged: Mutex<HashMap<String, Instant>>,
}

/// How long a stopping consumer waits for its last commit and for leaving the group.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The same client error is logged again only after this long.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

impl Callbacks {
    /// Whether `message` was not logged within [`ERROR_LOG_EVERY`] (and note it now).
    fn first_in_a_while(&self, message: &str) -> bool {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged
            .get(message)
            .is_some_and(|at| at.elapsed() < ERROR_LOG_EVERY)
        {
            return false;
        }
        logged.retain(|_, at| at.elapsed() < ERROR_LOG_EVERY);
        logged.insert(message.to_owned(), Instant::now());
        true
    }
}

impl ClientContext for Callbacks {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let consumer = &self.name;
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                if self.first_in_a_while(message) {
                    tracing::warn!(consumer, fac, "kafka: {message}")
                } else {
                    tracing::debug!(consumer, fac, "kafka: {message}")
                }
            }
            // Connection failures come as warnings and again through `error`: once is enough.
            RDKafkaLogLevel::Warning | RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(consumer, fac, "kafka: {message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(consumer, fac, "kafka: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.first_in_a_while(&format!("{error} {reason}")) {
            tracing::warn!(consumer = %self.name, cause = %error, "kafka: {reason}");
        } else {
            tracing::debug!(consumer = %self.name, cause = %error, "kafka: {reason}");
        }
    }

    fn stats(&self, stats: Statistics) {
        if !self.lag {
            return;
        }
        for (topic, t) in &stats.topics {
            for (partition, p) in &t.partitions {
                if *partition < 0 {
                    continue; // librdkafka's internal "unassigned" partition
                }
                let labels: Labels = vec![
                    ("consumer".into(), self.name.clone()),
                    ("topic".into(), topic.clone()),
                    ("partition".into(), partition.to_string()),
                ];
                // Only partitions this node consumes; a revoked one's series goes away.
                if p.fetch_state == "none" || p.hi_offset < 0 {
                    self.metrics.kafka_lag.remove(&labels);
                    continue;
                }
                let from = if p.committed_offset >= 0 {
                    p.committed_offset
                } else {
                    p.lo_offset.max(0)
                };
                self.metrics
                    .kafka_lag
                    .get_or_create(&labels)
                    .set((p.hi_offset - from).max(0));
            }
        }
    }
}

impl ConsumerContext for Callbacks {
    fn post_rebalance(
        &self,
        _consumer: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &Rebalance<'_>,
    ) {
        match rebalance {
            Rebalance::Assign(tpl) => tracing::info!(
                consumer = %self.name,
                partitions = ?partitions(tpl),
                "kafka: partitions assigned"
            ),
            Rebalance::Revoke(tpl) => tracing::info!(
                consumer = %self.name,
                partitions = ?partitions(tpl),
                "kafka: partitions revoked"
            ),
            Rebalance::Error(e) => {
                tracing::warn!(consumer = %self.name, cause = %e, "kafka: rebalance failed")
            }
        }
    }
}

fn partitions(tpl: &rdkafka::TopicPartitionList) -> Vec<String> {
    tpl.elements()
        .iter()
        .map(|e| format!("{}/{}", e.topic(), e.partition()))
        .collect()
}

/// How handling one record ended.
enum Handled {
    /// Published, or skipped for good: its offset may be committed.
    Done,
    /// Shutdown came while the record was still being retried: not committed, so it is
    /// redelivered.
    Stopped,
}

/// One running consumer and what it needs.
struct Runner {
    config: KafkaConfig,
    ctx: Arc<NodeContext>,
    labels: Labels,
    stop: watch::Receiver<bool>,
    dead_letter: Option<DeadLetter>,
}

/// A consumer created and subscribed, not consuming yet.
pub struct KafkaConsumer {
    consumer: StreamConsumer<Callbacks>,
    dead_letter: Option<DeadLetter>,
    config: KafkaConfig,
    ctx: Arc<NodeContext>,
}

impl KafkaConsumer {
    /// Create the client and subscribe. Nothing connects yet (Kafka may be down); a property
    /// librdkafka refuses (an unknown one, a missing certificate file) fails here, at start.
    pub fn new(config: KafkaConfig, ctx: Arc<NodeContext>) -> anyhow::Result<KafkaConsumer> {
        let name = config.name().to_owned();
        let consumer: StreamConsumer<Callbacks> = config
            .client_config(&ctx.config.node_name)
            .set_log_level(RDKafkaLogLevel::Warning)
            .create_with_context(Callbacks {
                name: name.clone(),
                metrics: ctx.hub.metrics().clone(),
                lag: true,
                logged: Mutex::new(HashMap::new()),
            })
            .map_err(|e| anyhow::anyhow!("consumers.kafka {name:?}: {e}"))?;
        let dead_letter = match &config.dead_letter_topic {
            None => None,
            Some(topic) => {
                let producer: FutureProducer<Callbacks> = config
                    .producer_config(&ctx.config.node_name)
                    .set_log_level(RDKafkaLogLevel::Warning)
                    .create_with_context(Callbacks {
                        name: name.clone(),
                        metrics: ctx.hub.metrics().clone(),
                        lag: false,
                        logged: Mutex::new(HashMap::new()),
                    })
                    .map_err(|e| {
                        anyhow::anyhow!("consumers.kafka {name:?}: dead-letter producer: {e}")
                    })?;
                Some(DeadLetter {
                    producer,
                    topic: topic.clone(),
                    group: config.group_id.clone(),
                })
            }
        };
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| anyhow::anyhow!("consumers.kafka {name:?}: {e}"))?;
        Ok(KafkaConsumer {
            consumer,
            dead_letter,
            config,
            ctx,
        })
    }

    /// Consume until `stop` turns true: publish each record's command, commit. Returns once the
    /// consumer left the group (its last published offsets committed).
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let KafkaConsumer {
            consumer,
            dead_letter,
            config,
            ctx,
        } = self;
        let name = config.name().to_owned();
        tracing::info!(consumer = %name, topics = ?config.topics, group = %config.group_id, dead_letter_topic = ?config.dead_letter_topic, "kafka consumer started");
        let mut runner = Runner {
            labels: vec![("consumer".into(), name.clone())],
            config,
            ctx,
            stop,
            dead_letter,
        };
        runner.consume(&consumer).await;
        // Closing the producer may wait a moment for what it still has in flight.
        let dead_letter = runner.dead_letter.take();
        // Commit what was stored since the last periodic commit, then close: leaving the group
        // hands the partitions to the other nodes at once instead of after the session timeout.
        // Both block (and may wait long for a Kafka that is down), so they run on a thread of
        // their own that cannot hold up the node's exit.
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        let thread_name = name.clone();
        std::thread::spawn(move || {
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(())
                | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => {
                    tracing::warn!(consumer = %thread_name, cause = %e, "kafka: final commit failed")
                }
            }
            drop(consumer);
            drop(dead_letter);
            let _ = closed_tx.send(());
        });
        if tokio::time::timeout(CLOSE_TIMEOUT, closed_rx)
            .await
            .is_err()
        {
            tracing::warn!(consumer = %name, "kafka: leaving the group took too long, left behind");
            return;
        }
        tracing::info!(consumer = %name, "kafka consumer stopped");
    }
}

impl Runner {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    async fn consume(&self, consumer: &StreamConsumer<Callbacks>) {
        let mut stop = self.stop.clone();
        loop {
            let first = tokio::select! {
                m = consumer.recv() => m,
                _ = stop.wait_for(|s| *s) => return,
            };
            let first = match first {
                Ok(m) => m.detach(),
                Err(e) => {
                    // librdkafka reconnects and rejoins by itself; errors here repeat what
                    // `Callbacks::error` logged.
                    tracing::debug!(consumer = %self.config.name(), cause = %e, "kafka: consume error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // Take whatever else is already fetched, without waiting, up to batch_size.
            let mut batch = vec![first];
            while batch.len() < self.config.batch_size {
                match consumer.recv().now_or_never() {
                    Some(Ok(m)) => batch.push(m.detach()),
                    Some(Err(e)) => {
                        tracing::debug!(consumer = %self.config.name(), cause = %e, "kafka: consume error");
                        break;
                    }
                    None => break,
                }
            }
            // Order holds within a partition; partitions go side by side.
            let mut by_partition: Vec<Vec<OwnedMessage>> = Vec::new();
            let mut index: HashMap<(String, i32), usize> = HashMap::new();
            for m in batch {
                let key = (m.topic().to_owned(), m.partition());
                let i = *index.entry(key).or_insert_with(|| {
                    by_partition.push(Vec::new());
                    by_partition.len() - 1
                });
                by_partition[i].push(m);
            }
            let runs = by_partition
                .iter()
                .map(|records| self.partition_run(consumer, records));
            futures_util::future::join_all(runs).await;
            if self.stopping() {
                return;
            }
        }
    }

    /// Publish a partition's records of this batch in order, storing each one's offset once it
    /// is done; stops at the first one interrupted by shutdown.
    async fn partition_run(&self, consumer: &StreamConsumer<Callbacks>, records: &[OwnedMessage]) {
        for m in records {
            match self.handle(m).await {
                Handled::Done => {
                    if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
                        // The partition went to another node in a rebalance: it redelivers
                        // the record, whose key makes the publish a no-op.
                        tracing::debug!(consumer = %self.config.name(), cause = %e, "kafka: offset not stored");
                    }
                }
                Handled::Stopped => return,
            }
        }
    }

    async fn handle(&self, m: &OwnedMessage) -> Handled {
        let metrics = self.ctx.hub.metrics();
        metrics.kafka_consumed.get_or_create(&self.labels).inc();
        let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
        let consumer = self.config.name();
        let headers: Vec<(&str, &[u8])> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key, h.value.unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let cmd = match parse_message(
            m.payload(),
            &headers,
            &self.config,
            &self.ctx.config.limits,
            &self.ctx.namespaces,
        ) {
            Ok(Record::Publish(cmd)) => cmd,
            Ok(Record::Control(message)) => return self.control(m, &message).await,
            Ok(Record::Batch(batch)) => return self.batch(m, &batch).await,
            Err(e) => {
                let reason = match e.error_code() {
                    ErrorCode::LimitExceeded => "oversized",
                    _ => "malformed",
                };
                tracing::warn!(consumer, topic, partition, offset, reason, code = ?e.error_code(), cause = %e.message(), "kafka: record is not a command it can publish, skipped");
                return self.skip(m, reason, e.message()).await;
            }
        };
        let key = record_key(topic, partition, offset);
        let mut backoff = self.config.backoff();
        loop {
            let retry = match execute(&self.ctx, &cmd, Some(&key)).await {
                Ok(done) if !done.retryable() => {
                    if done.published() > 0 {
                        metrics.kafka_published.get_or_create(&self.labels).inc();
                    }
                    let mut refused = Vec::new();
                    for (channel, e) in done.failed(&cmd) {
                        tracing::warn!(consumer, topic, partition, offset, channel, code = ?e.error_code(), cause = %e.message(), "kafka: channel refused the record's publication, skipped");
                        refused.push(format!("{channel}: {e}"));
                    }
                    if refused.is_empty() {
                        return Handled::Done;
                    }
                    let error = format!(
                        "{} of {} channels refused: {}",
                        refused.len(),
                        cmd.channels().len(),
                        refused.join("; ")
                    );
                    return self.skip(m, "refused", &error).await;
                }
                Ok(done) => done
                    .failed(&cmd)
                    .find(|(_, e)| e.is_retryable())
                    .map(|(_, e)| e.message().to_owned())
                    .unwrap_or_default(),
                Err(e) if e.is_retryable() => e.message().to_owned(),
                Err(e) => {
                    tracing::warn!(consumer, topic, partition, offset, code = ?e.error_code(), cause = %e.message(), "kafka: command refused, skipped");
                    return self.skip(m, "refused", &e.to_string()).await;
                }
            };
            // Same key on every attempt: channels that published already answer their earlier
            // position instead of publishing twice.
            metrics.kafka_retries.get_or_create(&self.labels).inc();
            let delay = backoff.next_delay();
            tracing::warn!(consumer, topic, partition, offset, cause = %retry, retry_in_ms = delay.as_millis() as u64, "kafka: publish failed, retrying");
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => return Handled::Stopped,
            }
        }
    }

    /// Send a control record's message (Centrifugo's `subscribe`, `unsubscribe`, `disconnect`)
    /// to every node, retrying while the broker is unavailable.
    async fn control(&self, m: &OwnedMessage, action: &Action) -> Handled {
        let metrics = self.ctx.hub.metrics();
        let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
        let consumer = self.config.name();
        let mut backoff = self.config.backoff();
        loop {
            let e = match action.run(&self.ctx).await {
                Ok(()) => {
                    metrics.kafka_published.get_or_create(&self.labels).inc();
                    return Handled::Done;
                }
                Err(e) => e,
            };
            if !e.is_retryable() {
                tracing::warn!(consumer, topic, partition, offset, cause = %e, "kafka: control command refused, skipped");
                return self.skip(m, "refused", &e.to_string()).await;
            }
            metrics.kafka_retries.get_or_create(&self.labels).inc();
            let delay = backoff.next_delay();
            tracing::warn!(consumer, topic, partition, offset, cause = %e, retry_in_ms = delay.as_millis() as u64, "kafka: control command failed, retrying");
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => return Handled::Stopped,
            }
        }
    }

    /// Run a batch record's commands (crate::consumers::batch), again with the same keys while
    /// the broker is unavailable; commands refused for good skip the record once the others ran.
    async fn batch(&self, m: &OwnedMessage, batch: &Batch) -> Handled {
        let metrics = self.ctx.hub.metrics();
        let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
        let consumer = self.config.name();
        let key = record_key(topic, partition, offset);
        let mut backoff = self.config.backoff();
        loop {
            let retry = match consumer_batch::run(&self.ctx, batch, &key).await {
                consumer_batch::Outcome::Done => {
                    metrics.kafka_published.get_or_create(&self.labels).inc();
                    return Handled::Done;
                }
                consumer_batch::Outcome::Refused(error) => {
                    tracing::warn!(consumer, topic, partition, offset, cause = %error, "kafka: batch commands refused, skipped");
                    return self.skip(m, "refused", &error).await;
                }
                consumer_batch::Outcome::Retry(error) => error,
            };
            metrics.kafka_retries.get_or_create(&self.labels).inc();
            let delay = backoff.next_delay();
            tracing::warn!(consumer, topic, partition, offset, cause = %retry, retry_in_ms = delay.as_millis() as u64, "kafka: batch failed, retrying");
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => return Handled::Stopped,
            }
        }
    }

    /// Count a record skipped for `reason` and, with a dead-letter topic, produce it there: it
    /// is done only once the topic acknowledged it.
    async fn skip(&self, m: &OwnedMessage, reason: &'static str, error: &str) -> Handled {
        let mut labels = self.labels.clone();
        labels.push(("reason".into(), reason.into()));
        let metrics = self.ctx.hub.metrics();
        metrics.kafka_failed.get_or_create(&labels).inc();
        let Some(dead_letter) = &self.dead_letter else {
            return Handled::Done;
        };
        let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
        let consumer = self.config.name();
        let on_retry = |cause: &str, delay: Duration| {
            metrics.kafka_retries.get_or_create(&self.labels).inc();
            tracing::warn!(consumer, topic, partition, offset, dead_letter_topic = %dead_letter.topic, cause, retry_in_ms = delay.as_millis() as u64, "kafka: producing to the dead-letter topic failed; the record waits, uncommitted");
        };
        let skipped = Skipped { reason, error };
        match dead_letter
            .send(m, &skipped, self.config.backoff(), &self.stop, on_retry)
            .await
        {
            true => Handled::Done,
            false => Handled::Stopped,
        }
    }
}
