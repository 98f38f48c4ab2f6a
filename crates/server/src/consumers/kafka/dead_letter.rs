//! The dead-letter topic: a record the consumer skips for good (malformed, oversized, refused)
//! is produced there, as it was (key, value, headers), with headers saying why and where it
//! came from, before its offset is stored for commit. Until the topic acknowledges it, the
//! record is retried with the consumer's backoff and its partition waits, so a record is never
//! both skipped and lost; one interrupted by shutdown is left uncommitted and comes again.

use std::time::Duration;

use herald_broker::Backoff;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::sync::watch;

use super::client::Callbacks;

/// Headers Herald adds to a dead-lettered record (after the record's own).
pub const REASON: &str = "herald.reason";
/// The error, as the log line gives it.
pub const ERROR: &str = "herald.error";
/// Where the record was read: topic, partition and offset.
pub const TOPIC: &str = "herald.source.topic";
/// See [`TOPIC`].
pub const PARTITION: &str = "herald.source.partition";
/// See [`TOPIC`].
pub const OFFSET: &str = "herald.source.offset";
/// The consumer group that skipped it.
pub const GROUP: &str = "herald.source.group";

/// A consumer's dead-letter producer.
pub(super) struct DeadLetter {
    pub(super) producer: FutureProducer<Callbacks>,
    pub(super) topic: String,
    pub(super) group: String,
}

/// Why a record is skipped: its `reason` (the `reason` label of `herald_kafka_failed_total`
/// too) and the error.
pub(super) struct Skipped<'a> {
    pub(super) reason: &'static str,
    pub(super) error: &'a str,
}

impl DeadLetter {
    /// The headers of `m`'s dead-letter copy: its own, then Herald's.
    fn headers(&self, m: &OwnedMessage, skipped: &Skipped<'_>) -> OwnedHeaders {
        let mut headers = OwnedHeaders::new();
        if let Some(own) = m.headers() {
            for h in own.iter() {
                headers = headers.insert(h);
            }
        }
        let (partition, offset) = (m.partition().to_string(), m.offset().to_string());
        for (key, value) in [
            (REASON, skipped.reason),
            (ERROR, skipped.error),
            (TOPIC, m.topic()),
            (PARTITION, partition.as_str()),
            (OFFSET, offset.as_str()),
            (GROUP, self.group.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        headers
    }

    /// Produce `m`'s copy until the topic acknowledges it (true), or until `stop` turns true
    /// first (false: the record stays uncommitted). Each failed try is logged and counted by
    /// `on_retry`.
    pub(super) async fn send(
        &self,
        m: &OwnedMessage,
        skipped: &Skipped<'_>,
        mut backoff: Backoff,
        stop: &watch::Receiver<bool>,
        mut on_retry: impl FnMut(&str, Duration),
    ) -> bool {
        let headers = self.headers(m, skipped);
        let mut stop = stop.clone();
        loop {
            let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).headers(headers.clone());
            if let Some(key) = m.key() {
                record = record.key(key);
            }
            if let Some(value) = m.payload() {
                record = record.payload(value);
            }
            // Delivery is bounded by the producer's message.timeout.ms.
            let sent = tokio::select! {
                r = self.producer.send(record, Timeout::Never) => r,
                _ = stop.wait_for(|s| *s) => return false,
            };
            let error = match sent {
                Ok(_) => return true,
                Err((e, _)) => e.to_string(),
            };
            let delay = backoff.next_delay();
            on_retry(&error, delay);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }
}
