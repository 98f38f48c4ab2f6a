//! Delivery: the node that holds the sender lease reads the log after the last acknowledged event
//! and `POST`s it to the endpoint as `{"events": [...]}`, in log order, a batch at a time; a 2xx
//! answer acknowledges the batch, anything else (or no answer in time) retries the same batch
//! with backoff. So every event arrives at least once and in order; the endpoint deduplicates on
//! `id` (a new sender resends what the old one had not seen acknowledged).

use std::sync::Weak;
use std::time::Duration;

use super::log::Log;
use super::LifecycleConfig;

/// How often an idle sender looks for new events (and a follower for the lease).
const POLL: Duration = Duration::from_millis(50);

pub(super) async fn run(log: Weak<Log>, config: LifecycleConfig) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_millis(config.timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(cause = %e, "lifecycle: no HTTP client; events are not delivered");
            return;
        }
    };
    let mut backoff = Duration::from_millis(100);
    let mut idle = POLL;
    loop {
        tokio::time::sleep(idle).await;
        let Some(log) = log.upgrade() else { return };
        match deliver_once(&log, &client, &config).await {
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
async fn deliver_once(
    log: &Log,
    client: &reqwest::Client,
    config: &LifecycleConfig,
) -> anyhow::Result<bool> {
    if !log.lead().await? {
        return Ok(false);
    }
    let batch = log.unacked(config.batch_max).await?;
    let Some((last, _)) = batch.last() else {
        return Ok(false);
    };
    let mut body = String::with_capacity(batch.iter().map(|(_, e)| e.len() + 1).sum::<usize>() + 16);
    body.push_str("{\"events\":[");
    for (i, (_, event)) in batch.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(event);
    }
    body.push_str("]}");
    let answer = client
        .post(&config.http_url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        // The URL may hold credentials: say what failed, not where.
        .map_err(|e| anyhow::anyhow!("the endpoint did not answer ({})", kind(&e)))?;
    let status = answer.status();
    anyhow::ensure!(status.is_success(), "the endpoint answered {status}");
    log.ack(last).await?;
    Ok(true)
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
