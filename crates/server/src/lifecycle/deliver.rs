//! Delivery: the node that holds the sender lease reads the log after the last acknowledged event
//! and `POST`s it to the endpoint as `{"events": [...]}` (or produces one Kafka record per event),
//! in log order, a batch at a time; a 2xx answer (every record acknowledged) acknowledges the
//! batch, anything else (or no answer in time) retries the same batch with backoff. So every event arrives at least once and in order; the endpoint deduplicates on
//! `id` (a new sender resends what the old one had not seen acknowledged).

use std::sync::Weak;
use std::time::Duration;

use super::log::Log;
use super::LifecycleConfig;

/// How often an idle sender looks for new events (and a follower for the lease).
const POLL: Duration = Duration::from_millis(50);

/// Where batches go.
enum Sink {
    Http(reqwest::Client, String),
    #[cfg(feature = "kafka")]
    Kafka(rdkafka::producer::FutureProducer, String),
}

fn sink(config: &LifecycleConfig) -> anyhow::Result<Sink> {
    let timeout = Duration::from_millis(config.timeout_ms);
    if let Some(url) = &config.http_url {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        return Ok(Sink::Http(client, url.clone()));
    }
    #[cfg(feature = "kafka")]
    if let (Some(brokers), Some(topic)) = (&config.kafka_brokers, &config.kafka_topic) {
        // Idempotent: a retried record is written once and in order within its partition.
        let producer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", config.timeout_ms.to_string())
            .set_log_level(rdkafka::config::RDKafkaLogLevel::Warning)
            .create()?;
        return Ok(Sink::Kafka(producer, topic.clone()));
    }
    anyhow::bail!("no sink configured")
}

pub(super) async fn run(log: Weak<Log>, config: LifecycleConfig) {
    let sink = match sink(&config) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(cause = %e, "lifecycle: no sink; events are not delivered");
            return;
        }
    };
    let mut backoff = Duration::from_millis(100);
    let mut idle = POLL;
    loop {
        tokio::time::sleep(idle).await;
        let Some(log) = log.upgrade() else { return };
        match deliver_once(&log, &sink, &config).await {
            Ok(true) => {
                idle = Duration::ZERO;
                backoff = Duration::from_millis(100);
            }
            Ok(false) => idle = POLL,
            Err(e) => {
                tracing::warn!(cause = %e, "lifecycle: events not delivered yet, retrying");
                idle = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// One batch: `Ok(true)` if one was delivered, `Ok(false)` if there was nothing to deliver or
/// another node delivers.
async fn deliver_once(log: &Log, sink: &Sink, config: &LifecycleConfig) -> anyhow::Result<bool> {
    if !log.lead().await? {
        return Ok(false);
    }
    let batch = log.unacked(config.batch_max).await?;
    let Some((last, _)) = batch.last() else {
        return Ok(false);
    };
    match sink {
        Sink::Http(client, url) => post(client, url, &batch).await?,
        #[cfg(feature = "kafka")]
        Sink::Kafka(producer, topic) => produce(producer, topic, &batch).await?,
    }
    log.ack(last).await?;
    Ok(true)
}

/// The batch as one `POST`.
async fn post(
    client: &reqwest::Client,
    url: &str,
    batch: &[(String, String)],
) -> anyhow::Result<()> {
    let mut body =
        String::with_capacity(batch.iter().map(|(_, e)| e.len() + 1).sum::<usize>() + 16);
    body.push_str("{\"events\":[");
    for (i, (_, event)) in batch.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(event);
    }
    body.push_str("]}");
    let answer = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        // The URL may hold credentials: say what failed, not where.
        .map_err(|e| anyhow::anyhow!("the endpoint did not answer ({})", kind(&e)))?;
    let status = answer.status();
    anyhow::ensure!(status.is_success(), "the endpoint answered {status}");
    Ok(())
}

/// The batch as one record per event, keyed by user (by client when anonymous) so that one
/// user's events stay in one partition, in order; done when Kafka acknowledged every record.
#[cfg(feature = "kafka")]
async fn produce(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    batch: &[(String, String)],
) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct Key {
        user: String,
        client: String,
    }
    let mut sends = Vec::with_capacity(batch.len());
    for (_, event) in batch {
        let k: Key = serde_json::from_str(event)?;
        let key = if k.user.is_empty() { k.client } else { k.user };
        sends.push(async move {
            let record = rdkafka::producer::FutureRecord::to(topic)
                .key(&key)
                .payload(event.as_str());
            producer.send(record, rdkafka::util::Timeout::Never).await
        });
    }
    for sent in futures_util::future::join_all(sends).await {
        sent.map_err(|(e, _)| anyhow::anyhow!("Kafka did not take an event: {e}"))?;
    }
    Ok(())
}

fn kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection refused or failed"
    } else {
        "request failed"
    }
}
