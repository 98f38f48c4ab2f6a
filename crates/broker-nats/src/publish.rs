//! Publishing: the next offset of a channel is taken with an optimistic, per-subject
//! compare-and-set that JetStream checks atomically with storing.
//!
//! Every stored publication carries its epoch and offset in headers. To append, a node reads the
//! channel's last message (its *tail*: stream sequence, epoch, offset), then publishes offset + 1
//! with `Nats-Expected-Last-Subject-Sequence: <tail sequence>`. JetStream stores the message only
//! if the subject's last message is still that one; otherwise it answers "wrong last sequence"
//! (10071), the node re-reads the tail and tries again. So two nodes never store the same offset,
//! and no offset is skipped. A channel with no message left starts a new epoch at offset 1 with
//! expected sequence 0 ("nothing on this subject").
//!
//! The tail is cached per channel, so a node that publishes to a channel again needs one round
//! trip. Publishes of one channel from one node are serialized on that cache entry (an async
//! mutex): they cannot be pipelined, because each needs the sequence JetStream gave the previous
//! one. Per channel and node that bounds throughput at one publish per JetStream round trip
//! (measured in docs/benchmarks.md); different channels proceed in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use herald_broker::{new_epoch, BrokerError, PublishOptions};
use herald_protocol::{ClientInfo, StreamPosition};
use time::OffsetDateTime;
use tokio::sync::Mutex as AsyncMutex;

use crate::broker::Inner;
use crate::codec::{decode_publication, encode_publication, Stored, MSG_ID};
use crate::metrics::inc;
use crate::streams::Kind;
use crate::subject::escape;

/// Channels whose tail is cached; beyond this, idle entries are dropped.
const MAX_TAILS: usize = 65_536;
/// Attempts before a publish that keeps losing the race gives up (error 111, retry later).
const MAX_ATTEMPTS: u32 = 32;

/// The last stored message of a channel's subject.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    pub(crate) epoch: String,
    pub(crate) offset: u64,
    /// Its stream sequence.
    pub(crate) seq: u64,
}

type Slot = Arc<AsyncMutex<Option<Tail>>>;

/// Cached tails, one slot per subject. `None` in a slot: unknown, read it first.
#[derive(Default)]
pub(crate) struct Tails {
    map: Mutex<HashMap<String, Slot>>,
}

impl Tails {
    /// The slot of a subject. Lock rule: the map lock is held only to find the slot.
    pub(crate) fn slot(&self, subject: &str) -> Slot {
        let mut map = self.map.lock().expect("tails lock");
        if map.len() >= MAX_TAILS {
            // Drop slots nobody is publishing through right now.
            map.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        map.entry(subject.to_owned()).or_default().clone()
    }

    /// Forget every tail (after a reconnect: the server may have lost or replaced streams).
    pub(crate) fn clear(&self) {
        self.map.lock().expect("tails lock").clear();
    }
}

/// A message read back from a stream.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub(crate) seq: u64,
    pub(crate) time: OffsetDateTime,
    pub(crate) stored: Stored,
}

impl Found {
    pub(crate) fn tail(&self) -> Tail {
        Tail {
            epoch: self.stored.epoch.clone(),
            offset: self.stored.offset,
            seq: self.seq,
        }
    }
}

fn found(message: async_nats::jetstream::message::StreamMessage) -> Result<Found, BrokerError> {
    let stored = decode_publication(&message.headers, &message.payload).ok_or_else(|| {
        BrokerError::Internal(format!(
            "message {} on {} is not a Herald publication",
            message.sequence, message.subject
        ))
    })?;
    Ok(Found {
        seq: message.sequence,
        time: message.time,
        stored,
    })
}

/// The last message stored on a subject; `None` when the subject holds nothing.
///
/// From the stream leader (`STREAM.MSG.GET`) unless `direct_reads` is set: on a NATS cluster a
/// direct get may be answered by a replica that lags, and a stale tail or position would cost a
/// publish retry or, worse, make a catch-up look impossible. On one server both are the same.
pub(crate) async fn read_last(
    inner: &Inner,
    kind: Kind,
    subject: &str,
) -> Result<Option<Found>, BrokerError> {
    let stream = inner.streams.of(kind);
    let result = if inner.config.direct_reads {
        let get = stream.direct_get_last_for_subject(subject);
        match inner.timed("read last", get).await? {
            Ok(message) => Ok(Some(message)),
            Err(err) if matches!(err.kind(), DirectGetErrorKind::NotFound) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    } else {
        let get = stream.get_last_raw_message_by_subject(subject);
        match inner.timed("read last", get).await? {
            Ok(message) => Ok(Some(message)),
            Err(err) if matches!(err.kind(), RawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    };
    match result {
        Ok(message) => message.map(found).transpose(),
        Err(err) => Err(BrokerError::Unavailable(format!(
            "read last of {subject}: {err}"
        ))),
    }
}

/// The message at a stream sequence; `None` when it is gone (trimmed, expired). Leader or
/// replica as for [`read_last`].
pub(crate) async fn read_seq(
    inner: &Inner,
    kind: Kind,
    seq: u64,
) -> Result<Option<Found>, BrokerError> {
    let stream = inner.streams.of(kind);
    let result = if inner.config.direct_reads {
        match inner.timed("read message", stream.direct_get(seq)).await? {
            Ok(message) => Ok(Some(message)),
            Err(err) if matches!(err.kind(), DirectGetErrorKind::NotFound) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    } else {
        match inner
            .timed("read message", stream.get_raw_message(seq))
            .await?
        {
            Ok(message) => Ok(Some(message)),
            Err(err) if matches!(err.kind(), RawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    };
    match result {
        Ok(message) => message.map(found).transpose(),
        Err(err) => Err(BrokerError::Unavailable(format!(
            "read message {seq}: {err}"
        ))),
    }
}

/// What JetStream did with one store attempt.
enum Outcome {
    Stored(u64),
    /// Same `Nats-Msg-Id` within the duplicate window: the sequence of the original.
    Duplicate(u64),
    /// The subject's last message is not the one we expected.
    Conflict,
    /// No stream captures the subject (the server lost it).
    StreamMissing,
}

async fn try_store(
    inner: &Inner,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<Outcome, BrokerError> {
    let js = &inner.js;
    let store = async move {
        let ack = js
            .publish_with_headers(subject.to_owned(), headers, payload)
            .await?;
        ack.await
    };
    match inner.timed("publish", store).await? {
        Ok(ack) if ack.duplicate => Ok(Outcome::Duplicate(ack.sequence)),
        Ok(ack) => Ok(Outcome::Stored(ack.sequence)),
        Err(err) => match err.kind() {
            PublishErrorKind::WrongLastSequence => Ok(Outcome::Conflict),
            PublishErrorKind::StreamNotFound => Ok(Outcome::StreamMissing),
            PublishErrorKind::MaxPayloadExceeded => Err(BrokerError::Internal(format!(
                "publication too large for NATS: {err}"
            ))),
            _ => Err(BrokerError::Unavailable(format!("publish: {err}"))),
        },
    }
}

/// Random pause after repeated conflicts, so that racing publishers spread out.
async fn back_off(attempt: u32) {
    if attempt >= 2 {
        let max_micros = 100u64 << attempt.min(7);
        let pause = rand::random::<u64>() % max_micros;
        tokio::time::sleep(Duration::from_micros(pause)).await;
    }
}

/// `Broker::publish`: store the next publication of a channel and return its position.
pub(crate) async fn publish(
    inner: &Inner,
    channel: &str,
    data: Bytes,
    info: Option<ClientInfo>,
    opts: &PublishOptions,
) -> Result<StreamPosition, BrokerError> {
    let started = Instant::now();
    let result = append(inner, channel, &data, info.as_ref(), opts).await;
    let m = &inner.metrics;
    match &result {
        Ok(_) => m.observe_publish(started.elapsed()),
        Err(_) => inc(&m.publish_errors),
    }
    result
}

async fn append(
    inner: &Inner,
    channel: &str,
    data: &Bytes,
    info: Option<&ClientInfo>,
    opts: &PublishOptions,
) -> Result<StreamPosition, BrokerError> {
    inner.ensure_connected()?;
    let kind = inner.kind(&opts.stream);
    inner.streams.fit(kind, &opts.stream).await?;
    let subject = inner.stream_subject(kind, channel);
    let msg_id = opts
        .idempotency_key
        .as_ref()
        .map(|key| format!("{}:{key}", escape(channel)));

    let slot = inner.tails.slot(&subject);
    let mut tail = slot.lock().await;
    for attempt in 0..MAX_ATTEMPTS {
        if tail.is_none() {
            *tail = read_last(inner, kind, &subject).await?.map(|f| f.tail());
        }
        let (epoch, offset, prev) = match &*tail {
            Some(t) => (t.epoch.clone(), t.offset + 1, t.seq),
            None => (new_epoch(), 1, 0),
        };
        let (mut headers, payload) = encode_publication(&epoch, offset, prev, data, info);
        if let Some(id) = &msg_id {
            headers.insert(MSG_ID, id.as_str());
        }
        match try_store(inner, &subject, headers, payload).await {
            Ok(Outcome::Stored(seq)) => {
                *tail = Some(Tail {
                    epoch: epoch.clone(),
                    offset,
                    seq,
                });
                if kind == Kind::History {
                    trim_later(inner, &subject, offset, opts.stream.history_size);
                }
                return Ok(StreamPosition { epoch, offset });
            }
            Ok(Outcome::Duplicate(seq)) => {
                inc(&inner.metrics.publish_duplicates);
                return original(inner, kind, &subject, seq).await;
            }
            Ok(Outcome::Conflict) => {
                inc(&inner.metrics.publish_conflicts);
                *tail = None;
                back_off(attempt).await;
            }
            Ok(Outcome::StreamMissing) => {
                *tail = None;
                inner.tails.clear();
                inner.streams.ensure().await?;
            }
            Err(err) => {
                // The outcome is unknown (e.g. timed out): re-read the tail next time.
                *tail = None;
                return Err(err);
            }
        }
    }
    Err(BrokerError::Unavailable(format!(
        "channel {channel}: too many concurrent publishers, retry"
    )))
}

/// Every `history_size` publications, purge the channel down to its newest `history_size` in
/// the background, so that a namespace with a short history does not keep the stream's full
/// per-channel limit (which is the largest history of any namespace). One extra request per
/// `history_size` publications; the newest message (the offset counter) is always kept.
fn trim_later(inner: &Inner, subject: &str, offset: u64, history_size: usize) {
    let keep = history_size as u64;
    if offset.checked_rem(keep) != Some(0) || inner.streams.per_channel() <= history_size as i64 {
        return;
    }
    let stream = inner.streams.history.clone();
    let subject = subject.to_owned();
    tokio::spawn(async move {
        if let Err(err) = stream.purge().filter(subject.as_str()).keep(keep).await {
            tracing::debug!(%subject, cause = %err, "trimming a channel failed");
        }
    });
}

/// The position of the publication an idempotency key first stored; the channel's current
/// position when that publication is gone already.
async fn original(
    inner: &Inner,
    kind: Kind,
    subject: &str,
    seq: u64,
) -> Result<StreamPosition, BrokerError> {
    let found = match read_seq(inner, kind, seq).await? {
        Some(f) => Some(f),
        None => read_last(inner, kind, subject).await?,
    };
    let found = found.ok_or_else(|| {
        BrokerError::Internal(format!("duplicate of {subject} but nothing stored"))
    })?;
    Ok(StreamPosition {
        epoch: found.stored.epoch,
        offset: found.stored.offset,
    })
}

/// The channel's last message, creating the channel's epoch with a marker (offset 0) when it has
/// none, so that a subscriber to an empty channel and the first publisher agree on the epoch.
pub(crate) async fn last_or_marker(
    inner: &Inner,
    kind: Kind,
    subject: &str,
) -> Result<Found, BrokerError> {
    if let Some(last) = read_last(inner, kind, subject).await? {
        return Ok(last);
    }
    let slot = inner.tails.slot(subject);
    let mut tail = slot.lock().await;
    for attempt in 0..MAX_ATTEMPTS {
        if let Some(last) = read_last(inner, kind, subject).await? {
            *tail = Some(last.tail());
            return Ok(last);
        }
        let epoch = new_epoch();
        let (headers, payload) = encode_publication(&epoch, 0, 0, &Bytes::new(), None);
        match try_store(inner, subject, headers, payload).await? {
            Outcome::Stored(seq) | Outcome::Duplicate(seq) => {
                let marker = Found {
                    seq,
                    time: OffsetDateTime::now_utc(),
                    stored: Stored {
                        epoch,
                        offset: 0,
                        prev: 0,
                        data: Bytes::new(),
                        info: None,
                    },
                };
                *tail = Some(marker.tail());
                return Ok(marker);
            }
            Outcome::Conflict => back_off(attempt).await,
            Outcome::StreamMissing => {
                inner.tails.clear();
                inner.streams.ensure().await?;
            }
        }
    }
    Err(BrokerError::Unavailable(format!(
        "{subject}: could not create the epoch"
    )))
}
