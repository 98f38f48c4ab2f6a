//! Presence across nodes: one record per (channel, client) in the `<stream>_PRESENCE` stream,
//! which keeps one message per subject and drops it after `presence_ttl_s`. The node that added a
//! record re-stores it every third of the TTL, so a crashed node's clients vanish within one
//! TTL. Removal stores a `Herald-Gone` tombstone that expires the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::future::join_all;
use herald_broker::BrokerError;
use herald_protocol::ClientInfo;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::broker::Inner;
use crate::codec::GONE;
use crate::history::fetch_filtered;
use crate::metrics::inc;

/// Records this node added and must keep alive: (channel, client) → info.
pub(crate) type LocalPresence = HashMap<(String, String), ClientInfo>;

/// Refreshes sent concurrently at most (each waits for its JetStream ack).
const REFRESH_BATCH: usize = 256;

async fn store(
    inner: &Inner,
    subject: String,
    headers: Option<HeaderMap>,
    payload: Bytes,
) -> Result<(), BrokerError> {
    let js = &inner.js;
    let put = async move {
        let ack = match headers {
            Some(h) => js.publish_with_headers(subject, h, payload).await?,
            None => js.publish(subject, payload).await?,
        };
        ack.await
    };
    inner
        .timed("presence", put)
        .await?
        .map(|_| ())
        .map_err(|e| BrokerError::unavailable(format!("presence: {e}")).caused_by(e))
}

/// `Broker::add_presence`.
pub(crate) async fn add(inner: &Inner, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
    inner.ensure_connected()?;
    inner
        .presence
        .lock()
        .expect("presence lock")
        .insert((channel.to_owned(), who.client.clone()), who.clone());
    let payload = Bytes::from(serde_json::to_vec(who).unwrap_or_default());
    store(
        inner,
        inner.subjects.presence(channel, &who.client),
        None,
        payload,
    )
    .await
}

/// `Broker::remove_presence`.
pub(crate) async fn remove(inner: &Inner, channel: &str, client: &str) -> Result<(), BrokerError> {
    inner
        .presence
        .lock()
        .expect("presence lock")
        .remove(&(channel.to_owned(), client.to_owned()));
    inner.ensure_connected()?;
    let mut headers = HeaderMap::new();
    headers.insert(GONE, "1");
    store(
        inner,
        inner.subjects.presence(channel, client),
        Some(headers),
        Bytes::new(),
    )
    .await
}

/// `Broker::presence`: the newest record of every client of the channel, tombstones skipped.
pub(crate) async fn list(inner: &Inner, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
    inner.ensure_connected()?;
    let filter = inner.subjects.presence_of(channel);
    let messages = fetch_filtered(
        inner,
        &inner.streams.presence,
        &filter,
        DeliverPolicy::LastPerSubject,
    )
    .await?;
    let mut clients = Vec::with_capacity(messages.len());
    for (_, _, message) in messages {
        let gone = message
            .headers
            .as_ref()
            .is_some_and(|h| h.get(GONE).is_some());
        if gone {
            continue;
        }
        match serde_json::from_slice::<ClientInfo>(&message.payload) {
            Ok(who) => clients.push(who),
            Err(err) => debug!(subject = %message.subject, cause = %err, "bad presence record"),
        }
    }
    Ok(clients)
}

/// Re-store every record this node owns, a batch at a time.
pub(crate) async fn refresh_all(inner: &Inner) {
    let records: Vec<(String, ClientInfo)> = {
        let local = inner.presence.lock().expect("presence lock");
        local
            .iter()
            .map(|((channel, _), who)| (channel.clone(), who.clone()))
            .collect()
    };
    for batch in records.chunks(REFRESH_BATCH) {
        let puts = batch.iter().map(|(channel, who)| {
            let payload = Bytes::from(serde_json::to_vec(who).unwrap_or_default());
            store(
                inner,
                inner.subjects.presence(channel, &who.client),
                None,
                payload,
            )
        });
        for result in join_all(puts).await {
            if let Err(err) = result {
                inc(&inner.metrics.presence_refresh_errors);
                debug!(cause = %err, "presence refresh failed");
            }
        }
    }
}

/// Background task: refresh this node's records every third of the TTL until shutdown.
pub(crate) async fn run_refresher(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let period = (inner.config.presence_ttl() / 3).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if inner.ensure_connected().is_err() {
            continue;
        }
        let before = inner.metrics.presence_refresh_errors.get();
        refresh_all(&inner).await;
        let after = inner.metrics.presence_refresh_errors.get();
        if after > before {
            warn!(
                failed = after - before,
                "some presence records could not be refreshed"
            );
        }
    }
}
