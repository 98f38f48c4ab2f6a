//! Publishing: the next offsets of a channel are taken with an optimistic, per-subject
//! compare-and-set that JetStream checks atomically with storing, and publications that queue
//! up behind each other are stored together (group commit).
//!
//! Every stored message carries its epoch and (first) offset in headers. To append, a node reads
//! the channel's last message (its *tail*: stream sequence, epoch, last offset), then publishes
//! the next offset with `Nats-Expected-Last-Subject-Sequence: <tail sequence>`. JetStream stores
//! the message only if the subject's last message is still that one; otherwise it answers "wrong
//! last sequence" (10071), the node re-reads the tail and tries again. So two nodes never store
//! the same offset, and no offset is skipped. A channel with no message left starts a new epoch
//! at offset 1 with expected sequence 0 ("nothing on this subject").
//!
//! Per channel, a node keeps the tail (one round trip per store once known) and a queue. A store
//! cannot start before the previous one's sequence is known, so stores of one channel are
//! sequential; while one is in flight, newer publications wait in the queue and the next store
//! takes all of them as one message (offsets N+1 … N+k). Throughput of a busy channel then grows
//! with the batch instead of being capped at one publication per round trip; an idle channel
//! still stores each publication alone, at once. A publication with an idempotency key is always
//! stored alone (JetStream deduplicates whole messages).
//!
//! The store runs in its own task, so a caller that gives up (an HTTP client that disconnects)
//! never leaves the channel's queue without a flusher. However that task ends (its queue empty,
//! a panic, the runtime shutting down), a guard clears the channel's "flusher running" flag and
//! fails what still waits, so a later publish always finds a flusher or starts one. Nothing a
//! caller passes can make it panic: an idempotency key that cannot be a header value (CR, LF) is
//! refused before it is queued.
//!
//! # A NATS that comes back behind
//! A NATS server whose file store lost its last writes (an R1 stream after a crash, a store
//! restored from an older copy) still holds a channel's epoch, but an older last message. Numbering
//! on from it would hand out offsets that subscribers already received in that epoch. So each node
//! keeps the newest position it saw per channel ([`herald_broker::Watermarks`]: publish results,
//! received publications, history reads), and whenever it reads a channel's last message afresh
//! (a publish's tail, a history read's position) and finds it *below* that watermark in the same
//! epoch, it treats the channel as empty: it starts a new epoch, storing it with
//! `Nats-Expected-Last-Subject-Sequence` = the sequence of the message it judged behind. If
//! anything was stored on the subject meanwhile (another node, or the read was stale) the store
//! is refused and the node reads again, so nodes that notice at once agree on one new epoch and a
//! stale read never starts one. A publish stores its batch at offset 1 of the new epoch directly;
//! a history read stores an epoch marker.
//!
//! # A NATS that restarted
//! The watermark only catches what a running node saw. A stream restored from an older copy that
//! no running node saw the newer end of would still be continued, so every stored message is also
//! stamped with the boot id of the server's current life (the `boot` module), and a last message
//! stamped with another one starts a new epoch the same way. [`read_last_checked`] is the one
//! place that decides, for publishing and reading alike.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind};
use async_nats::{HeaderMap, HeaderValue};
use bytes::Bytes;
use herald_broker::{new_epoch, BrokerError, PublishOptions};
use herald_protocol::tags::Tags;
use herald_protocol::{ClientInfo, StreamPosition};
use time::OffsetDateTime;
use tokio::sync::oneshot;
use tracing::warn;

use crate::boot::BootId;
use crate::broker::Inner;
use crate::codec::{
    decode_publications, encode_publications, Item, Stored, MSG_ID, TRACED, TRACEPARENT,
};
use crate::metrics::inc;
use crate::names::escape;
use crate::streams::Kind;

/// Channels whose state is kept; beyond this, idle entries are dropped.
const MAX_CHANNELS: usize = 65_536;
/// Attempts before a store that keeps losing the race gives up (error 111, retry later).
pub(crate) const MAX_ATTEMPTS: u32 = 32;
/// Publications stored in one message at most.
const MAX_BATCH: usize = 256;
/// Payload bytes of one batched message at most (NATS' default max_payload is 1 MiB; a single
/// larger publication still goes alone and meets the server's own limit).
const MAX_BATCH_BYTES: usize = 256 * 1024;
/// Publications waiting on one channel of one node at most; beyond, publishing fails (111).
const MAX_QUEUED: usize = 10_000;

/// The last stored message of a channel's subject.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    pub(crate) epoch: String,
    /// Offset of its last publication (0 for an epoch marker).
    pub(crate) offset: u64,
    /// Its stream sequence.
    pub(crate) seq: u64,
    /// The boot id it was stored (or judged) under; a tail from another boot id is read again.
    pub(crate) boot: Arc<str>,
}

/// One publication waiting for its channel's next store.
struct Pending {
    data: Bytes,
    info: Option<ClientInfo>,
    tags: Tags,
    /// `Nats-Msg-Id`: the channel and the idempotency key, checked to be a valid header value.
    msg_id: Option<HeaderValue>,
    /// The W3C `traceparent` of a sampled publication (see [`trace_headers`]).
    traceparent: Option<HeaderValue>,
    done: oneshot::Sender<Result<StreamPosition, BrokerError>>,
}

/// A channel's publishing state on this node.
#[derive(Default)]
struct Channel {
    /// `None`: unknown, read it before storing.
    tail: Option<Tail>,
    waiting: VecDeque<Pending>,
    /// A flusher task is running for this channel.
    flushing: bool,
}

type Slot = Arc<Mutex<Channel>>;

/// Lock a channel's state. A poisoned lock is taken anyway: every update of a [`Channel`] is a
/// single step that leaves it consistent, and one panicking task must not take the channel's
/// publishing down with it.
fn lock(slot: &Slot) -> std::sync::MutexGuard<'_, Channel> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Per-channel publishing state, one slot per subject. std Mutexes: held for queue operations
/// only, never across an `.await`.
#[derive(Default)]
pub(crate) struct Tails {
    map: Mutex<HashMap<String, Slot>>,
}

impl Tails {
    fn slot(&self, subject: &str) -> Slot {
        let mut map = self.map.lock().expect("tails lock");
        if map.len() >= MAX_CHANNELS {
            // Drop the state of channels nobody is publishing to right now.
            map.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        map.entry(subject.to_owned()).or_default().clone()
    }

    /// Forget every tail (after a reconnect: the server may have lost or replaced streams).
    pub(crate) fn clear(&self) {
        let map = self.map.lock().expect("tails lock");
        for slot in map.values() {
            lock(slot).tail = None;
        }
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
            offset: self.stored.last(),
            seq: self.seq,
            boot: Arc::from(self.stored.boot.as_str()),
        }
    }
}

/// A channel's last message, read afresh, and whether nodes may number on from it.
pub(crate) struct Checked {
    /// The boot id it was judged under: what the next message on the channel is stamped with.
    pub(crate) boot: BootId,
    /// `None`: the subject holds nothing.
    pub(crate) last: Option<Found>,
    /// Start a new epoch on top of `last` instead of continuing it: it was stored in another life
    /// of the server(s) (its boot id differs), or it is below what this node saw (a watermark).
    pub(crate) start_over: bool,
}

/// Read the channel's last message and judge it: the one rule for whether a stream may be
/// continued, used by publishing and reading (markers) alike. The watermark floor is taken
/// before the read (see [`rolled_back`]); a read that raced a reconnect is made again, so a
/// stream is never judged with the boot id of the server's previous life.
pub(crate) async fn read_last_checked(
    inner: &Inner,
    kind: Kind,
    channel: &str,
    subject: &str,
) -> Result<Checked, BrokerError> {
    for _ in 0..MAX_ATTEMPTS {
        let boot = inner.boot.current(inner).await?;
        let floor = inner.watermarks.floor(channel);
        let last = read_last(inner, kind, subject).await?;
        if !inner.boot.still_current(inner, &boot) {
            continue;
        }
        let start_over = match &last {
            None => false,
            Some(found) if boot.is_stale(&found.stored.boot) => {
                // Confirm before it costs the channel its epoch: the boot id may have changed
                // while this node stayed connected.
                let confirmed = inner.boot.confirm(inner).await?;
                if confirmed.id != boot.id {
                    continue;
                }
                warn!(
                    %channel, epoch = %found.stored.epoch,
                    "stored before NATS last restarted (another boot id); starting a new epoch"
                );
                true
            }
            Some(found) => rolled_back(channel, &floor, found),
        };
        return Ok(Checked {
            boot,
            last,
            start_over,
        });
    }
    Err(BrokerError::unavailable(format!(
        "{subject}: the connection to NATS keeps changing, retry"
    )))
}

fn found(message: async_nats::jetstream::message::StreamMessage) -> Result<Found, BrokerError> {
    let stored = decode_publications(&message.headers, &message.payload).ok_or_else(|| {
        BrokerError::internal(format!(
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

/// Which message to read.
#[derive(Clone, Copy)]
enum Which<'a> {
    LastOf(&'a str),
    Seq(u64),
}

/// What one read found.
enum Read {
    Found(StreamMessage),
    /// No such message (the subject is empty, or the message was trimmed).
    Nothing,
    /// The stream itself is gone.
    NoStream,
    /// No answer within the request timeout.
    NoAnswer,
}

/// Times a read that got no answer in time is sent again (reads change nothing, so this is
/// safe): a server that stalled for a moment, or a node that was short of CPU when the answer
/// came, costs a subscriber a wait, not error 111.
const READ_RETRIES: u32 = 2;

/// Whether a failed `STREAM.MSG.GET` is the client library's own request timeout (the same
/// length as [`Inner::jetstream`]'s, so either may fire first).
fn raw_get_timed_out(err: &async_nats::jetstream::stream::RawMessageError) -> bool {
    use std::error::Error as _;
    err.source()
        .and_then(|s| s.downcast_ref::<async_nats::jetstream::context::RequestError>())
        .is_some_and(|e| e.kind() == async_nats::jetstream::context::RequestErrorKind::TimedOut)
}

/// One read, from the stream leader (`STREAM.MSG.GET`) unless `direct_reads` is set: on a NATS
/// cluster a direct get may be answered by a replica that lags, and a stale tail or position would
/// cost a publish retry or, worse, make a catch-up look impossible. On one server both are the
/// same.
async fn read_once(inner: &Inner, kind: Kind, which: Which<'_>) -> Result<Read, BrokerError> {
    let stream = inner.streams.of(kind);
    let what = match which {
        Which::LastOf(subject) => format!("last of {subject}"),
        Which::Seq(seq) => format!("message {seq}"),
    };
    let failed = |err: String| BrokerError::unavailable(format!("read {what}: {err}"));
    if inner.config.direct_reads {
        let get = async {
            match which {
                Which::LastOf(subject) => stream.direct_get_last_for_subject(subject).await,
                Which::Seq(seq) => stream.direct_get(seq).await,
            }
        };
        let Some(answer) = inner.jetstream("read", get).await? else {
            return Ok(Read::NoAnswer);
        };
        match answer {
            Ok(message) => Ok(Read::Found(message)),
            Err(err) => match err.kind() {
                DirectGetErrorKind::NotFound => Ok(Read::Nothing),
                DirectGetErrorKind::TimedOut => Ok(Read::NoAnswer),
                DirectGetErrorKind::ErrorResponse(status, _)
                    if status == async_nats::StatusCode::NO_RESPONDERS =>
                {
                    Ok(Read::NoStream)
                }
                _ => Err(failed(err.to_string()).caused_by(err)),
            },
        }
    } else {
        let get = async {
            match which {
                Which::LastOf(subject) => stream.get_last_raw_message_by_subject(subject).await,
                Which::Seq(seq) => stream.get_raw_message(seq).await,
            }
        };
        let Some(answer) = inner.jetstream("read", get).await? else {
            return Ok(Read::NoAnswer);
        };
        match answer {
            Ok(message) => Ok(Read::Found(message)),
            Err(err) if raw_get_timed_out(&err) => Ok(Read::NoAnswer),
            Err(err) => match err.kind() {
                RawMessageErrorKind::NoMessageFound => Ok(Read::Nothing),
                RawMessageErrorKind::JetStream(e)
                    if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    Ok(Read::NoStream)
                }
                _ => Err(failed(err.to_string()).caused_by(err)),
            },
        }
    }
}

/// Read a message; a missing stream is recreated (empty: the read finds nothing). A read that
/// gets no answer in time is sent again, [`READ_RETRIES`] times at most.
async fn read(inner: &Inner, kind: Kind, which: Which<'_>) -> Result<Option<Found>, BrokerError> {
    for _ in 0..READ_RETRIES {
        match read_once(inner, kind, which).await? {
            Read::NoAnswer => inner.ensure_connected()?,
            other => return settle(inner, other).await,
        }
    }
    settle(inner, read_once(inner, kind, which).await?).await
}

async fn settle(inner: &Inner, read: Read) -> Result<Option<Found>, BrokerError> {
    match read {
        Read::Found(message) => found(message).map(Some),
        Read::Nothing => Ok(None),
        Read::NoStream => {
            inner.tails.clear();
            inner.streams.ensure().await?;
            Ok(None)
        }
        Read::NoAnswer => Err(BrokerError::unavailable("NATS read timed out")),
    }
}

/// The last message stored on a subject; `None` when the subject holds nothing.
pub(crate) async fn read_last(
    inner: &Inner,
    kind: Kind,
    subject: &str,
) -> Result<Option<Found>, BrokerError> {
    read(inner, kind, Which::LastOf(subject)).await
}

/// The message at a stream sequence; `None` when it is gone (trimmed, expired).
pub(crate) async fn read_seq(
    inner: &Inner,
    kind: Kind,
    seq: u64,
) -> Result<Option<Found>, BrokerError> {
    read(inner, kind, Which::Seq(seq)).await
}

/// What JetStream did with one store attempt.
pub(crate) enum Outcome {
    Stored(u64),
    /// Same `Nats-Msg-Id` within the duplicate window: the sequence of the original.
    Duplicate(u64),
    /// The subject's last message is not the one we expected.
    Conflict,
    /// No stream captures the subject (the server lost it).
    StreamMissing,
}

/// One store. No answer within the request timeout is an error (111): whether the message was
/// stored is unknown, and a publication is never sent again (it could be stored twice).
pub(crate) async fn try_store(
    inner: &Inner,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<Outcome, BrokerError> {
    store_once(inner, subject, headers, payload)
        .await?
        .map_err(|NoAnswer| BrokerError::unavailable("NATS publish timed out"))
}

/// A store that got no answer in time: whether it was stored is unknown.
pub(crate) struct NoAnswer;

/// [`try_store`], telling a store that got no answer in time apart, for callers whose store
/// is a compare-and-set they can safely make again after reading (epoch markers).
pub(crate) async fn store_once(
    inner: &Inner,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<Result<Outcome, NoAnswer>, BrokerError> {
    let js = &inner.js;
    let store = async move {
        let ack = js
            .publish_with_headers(subject.to_owned(), headers, payload)
            .await?;
        ack.await
    };
    let Some(answer) = inner.jetstream("publish", store).await? else {
        return Ok(Err(NoAnswer));
    };
    match answer {
        Ok(ack) if ack.duplicate => Ok(Ok(Outcome::Duplicate(ack.sequence))),
        Ok(ack) => Ok(Ok(Outcome::Stored(ack.sequence))),
        Err(err) => match err.kind() {
            PublishErrorKind::WrongLastSequence => Ok(Ok(Outcome::Conflict)),
            PublishErrorKind::StreamNotFound => Ok(Ok(Outcome::StreamMissing)),
            PublishErrorKind::TimedOut => Ok(Err(NoAnswer)),
            PublishErrorKind::MaxPayloadExceeded => Err(BrokerError::internal(format!(
                "publication too large for NATS: {err}"
            ))
            .caused_by(err)),
            _ => Err(BrokerError::unavailable(format!("publish: {err}")).caused_by(err)),
        },
    }
}

/// Random pause after repeated conflicts, so that racing publishers spread out.
pub(crate) async fn back_off(attempt: u32) {
    if attempt >= 2 {
        let max_micros = 100u64 << attempt.min(7);
        let pause = rand::random::<u64>() % max_micros;
        tokio::time::sleep(Duration::from_micros(pause)).await;
    }
}

/// `Broker::publish`: queue the publication on its channel, make sure a flusher runs, and wait
/// for its position.
pub(crate) async fn publish(
    inner: &Arc<Inner>,
    channel: &str,
    data: Bytes,
    info: Option<ClientInfo>,
    opts: &PublishOptions,
) -> Result<StreamPosition, BrokerError> {
    let started = Instant::now();
    let result = enqueue(inner, channel, data, info, opts).await;
    let m = &inner.metrics;
    match &result {
        Ok(_) => m.observe_publish(started.elapsed()),
        Err(_) => inc(&m.publish_errors),
    }
    result
}

async fn enqueue(
    inner: &Arc<Inner>,
    channel: &str,
    data: Bytes,
    info: Option<ClientInfo>,
    opts: &PublishOptions,
) -> Result<StreamPosition, BrokerError> {
    inner.ensure_connected()?;
    let kind = inner.kind(&opts.stream);
    inner.streams.fit(kind, &opts.stream).await?;
    let subject = inner.stream_subject(kind, channel);
    let msg_id = match &opts.idempotency_key {
        Some(key) => Some(msg_id(channel, key)?),
        None => None,
    };
    // A value that cannot be a header (CR, LF) is not a traceparent: the publication goes
    // untraced past the broker.
    let traceparent = opts
        .traceparent
        .as_deref()
        .and_then(|tp| tp.parse::<HeaderValue>().ok());
    let (done, position) = oneshot::channel();
    let slot = inner.tails.slot(&subject);
    let start_flusher = {
        let mut ch = lock(&slot);
        if ch.waiting.len() >= MAX_QUEUED {
            return Err(BrokerError::unavailable(format!(
                "channel {channel}: {MAX_QUEUED} publications already waiting, retry"
            )));
        }
        ch.waiting.push_back(Pending {
            data,
            info,
            tags: opts.tags.clone(),
            msg_id,
            traceparent,
            done,
        });
        !std::mem::replace(&mut ch.flushing, true)
    };
    if start_flusher {
        let history_size = opts.stream.history_size;
        tokio::spawn(flush(
            inner.clone(),
            kind,
            channel.to_owned(),
            subject,
            slot,
            history_size,
        ));
    }
    position
        .await
        .unwrap_or_else(|_| Err(BrokerError::internal("publisher task ended")))
}

/// A batch's trace context: one message carries one, that of its first traced publication (the
/// other traced ones in the same message get no spans past the broker).
fn trace_headers(headers: &mut HeaderMap, batch: &[Pending]) {
    let traced = batch
        .iter()
        .enumerate()
        .find_map(|(i, p)| p.traceparent.as_ref().map(|tp| (i, tp)));
    if let Some((index, traceparent)) = traced {
        headers.insert(TRACEPARENT, traceparent.clone());
        if index > 0 {
            headers.insert(TRACED, index.to_string());
        }
    }
}

/// The `Nats-Msg-Id` of a publication with an idempotency key. A key that cannot be a header
/// value (CR or LF in it) is an error for this publication, not a panic in the publisher task.
fn msg_id(channel: &str, key: &str) -> Result<HeaderValue, BrokerError> {
    format!("{}:{key}", escape(channel))
        .parse()
        .map_err(|_| BrokerError::internal("idempotency key holds CR or LF"))
}

/// The next batch: the oldest waiting publication, and while they fit, the ones after it. One
/// with an idempotency key goes alone.
fn take_batch(waiting: &mut VecDeque<Pending>) -> Vec<Pending> {
    let size = |p: &Pending| p.data.len() + if p.info.is_some() { 128 } else { 0 };
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let alone = first.msg_id.is_some();
    let mut bytes = size(&first);
    let mut batch = vec![first];
    while !alone && batch.len() < MAX_BATCH {
        match waiting.front() {
            Some(next) if next.msg_id.is_none() && bytes + size(next) <= MAX_BATCH_BYTES => {
                bytes += size(next);
                batch.extend(waiting.pop_front());
            }
            _ => break,
        }
    }
    batch
}

/// Held by a channel's flusher. Dropped without [`ended`](Self::ended) set, i.e. when the task
/// panicked or was cancelled, it clears the channel's `flushing` flag, forgets its tail (the last
/// store's outcome is unknown) and fails the publications still waiting. Otherwise every later
/// publish of the channel would queue behind a flusher that no longer runs and wait forever.
struct FlushGuard {
    slot: Slot,
    /// Set by the flusher as it clears the flag itself, having seen the queue empty (under the
    /// same lock, so that a publication queued right after starts a new flusher).
    ended: bool,
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let waiting = {
            let mut ch = lock(&self.slot);
            ch.flushing = false;
            ch.tail = None;
            std::mem::take(&mut ch.waiting)
        };
        warn!(
            waiting = waiting.len(),
            panicked = std::thread::panicking(),
            "a channel's publisher task ended early; failing its queued publications"
        );
        for p in waiting {
            let _ = p
                .done
                .send(Err(BrokerError::internal("publisher task ended")));
        }
    }
}

/// A channel's flusher: store batches until the queue is empty.
async fn flush(
    inner: Arc<Inner>,
    kind: Kind,
    channel: String,
    subject: String,
    slot: Slot,
    history_size: usize,
) {
    let mut guard = FlushGuard {
        slot: slot.clone(),
        ended: false,
    };
    loop {
        let (batch, mut tail) = {
            let mut ch = lock(&slot);
            if ch.waiting.is_empty() {
                ch.flushing = false;
                guard.ended = true;
                return;
            }
            (take_batch(&mut ch.waiting), ch.tail.clone())
        };
        let result = store_batch(&inner, kind, &channel, &subject, &mut tail, &batch).await;
        lock(&slot).tail = tail;
        match result {
            Ok(Appended::Stored(position)) => {
                let first = position.offset;
                let last = first + batch.len() as u64 - 1;
                inner.watermarks.observe(&channel, &position.epoch, last);
                if kind == Kind::History {
                    trim_later(&inner, &subject, first, last, history_size);
                }
                for (i, p) in batch.into_iter().enumerate() {
                    let _ = p.done.send(Ok(StreamPosition {
                        epoch: position.epoch.clone(),
                        offset: first + i as u64,
                    }));
                }
            }
            Ok(Appended::Duplicate(position)) => {
                inner
                    .watermarks
                    .observe(&channel, &position.epoch, position.offset);
                for p in batch {
                    let _ = p.done.send(Ok(position.clone()));
                }
            }
            Err(err) => {
                for p in batch {
                    let _ = p.done.send(Err(err.clone()));
                }
            }
        }
    }
}

/// What a batch became.
enum Appended {
    /// Stored; the position of its first publication.
    Stored(StreamPosition),
    /// An idempotency key seen before: the original's position.
    Duplicate(StreamPosition),
}

/// Store one batch as the channel's next message, retrying on conflicts.
async fn store_batch(
    inner: &Inner,
    kind: Kind,
    channel: &str,
    subject: &str,
    tail: &mut Option<Tail>,
    batch: &[Pending],
) -> Result<Appended, BrokerError> {
    let items: Vec<Item> = batch
        .iter()
        .map(|p| (&p.data, p.info.as_ref(), &p.tags))
        .collect();
    let msg_id = match batch {
        [only] => only.msg_id.as_ref(),
        _ => None,
    };
    for attempt in 0..MAX_ATTEMPTS {
        // Queued publications fail fast too once the connection is gone.
        inner.ensure_connected()?;
        let mut boot = inner.boot.current(inner).await?;
        if tail.as_ref().is_some_and(|t| t.boot != boot.id) {
            // Cached in another life of the server: judge the channel afresh.
            *tail = None;
        }
        if tail.is_none() {
            let checked = read_last_checked(inner, kind, channel, subject).await?;
            boot = checked.boot;
            *tail = match checked.last {
                // Start over in a new epoch, stored only if `last` is still the subject's last
                // message (see the module docs).
                Some(last) if checked.start_over => Some(Tail {
                    epoch: new_epoch(),
                    offset: 0,
                    seq: last.seq,
                    boot: boot.id.clone(),
                }),
                found => found.map(|f| Tail {
                    boot: boot.id.clone(),
                    ..f.tail()
                }),
            };
        }
        let (epoch, first, prev) = match &*tail {
            Some(t) => (t.epoch.clone(), t.offset + 1, t.seq),
            None => (new_epoch(), 1, 0),
        };
        let (mut headers, payload) = encode_publications(&epoch, &boot.id, first, prev, &items);
        if let Some(id) = msg_id {
            headers.insert(MSG_ID, id.clone());
        }
        trace_headers(&mut headers, batch);
        match try_store(inner, subject, headers, payload).await {
            Ok(Outcome::Stored(seq)) => {
                inc(&inner.metrics.stored_messages);
                *tail = Some(Tail {
                    epoch: epoch.clone(),
                    offset: first + items.len() as u64 - 1,
                    seq,
                    boot: boot.id.clone(),
                });
                return Ok(Appended::Stored(StreamPosition {
                    epoch,
                    offset: first,
                }));
            }
            Ok(Outcome::Duplicate(seq)) => {
                inc(&inner.metrics.publish_duplicates);
                return original(inner, kind, subject, seq)
                    .await
                    .map(Appended::Duplicate);
            }
            Ok(Outcome::Conflict) => {
                inc(&inner.metrics.publish_conflicts);
                *tail = None;
                back_off(attempt).await;
            }
            Ok(Outcome::StreamMissing) => {
                // Every cached tail pointed into the lost stream.
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
    Err(BrokerError::unavailable(format!(
        "{subject}: too many concurrent publishers, retry"
    )))
}

/// Whenever a store crosses a multiple of `history_size`, purge the channel down to its newest
/// `history_size` messages in the background, so that a namespace with a short history does not
/// keep the stream's full per-channel limit (the largest history of any namespace). One extra
/// request per `history_size` publications; the newest message (the offset counter) stays.
fn trim_later(inner: &Inner, subject: &str, first: u64, last: u64, history_size: usize) {
    let keep = history_size as u64;
    if keep == 0 || inner.streams.per_channel() <= history_size as i64 {
        return;
    }
    if last / keep == (first - 1) / keep {
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
        BrokerError::internal(format!("duplicate of {subject} but nothing stored"))
    })?;
    Ok(StreamPosition {
        offset: found.stored.last(),
        epoch: found.stored.epoch,
    })
}

/// Whether `last`, just read as the channel's last stored message, is below `floor`, the newest
/// position this node saw in the same epoch *before* that read: the server lost writes (see the
/// module docs). Taken before the read, the floor only holds positions that were stored before
/// it, so a publication that arrives meanwhile is no false alarm.
pub(crate) fn rolled_back(channel: &str, floor: &(String, u64), last: &Found) -> bool {
    let (epoch, offset) = floor;
    let behind = is_behind(&last.stored.epoch, last.stored.last(), epoch, *offset);
    if behind {
        warn!(
            %channel, %epoch, seen = offset, stored = last.stored.last(),
            "NATS holds less of this channel than was seen; starting a new epoch"
        );
    }
    behind
}

/// `(epoch, offset)` is below the watermark `(floor_epoch, floor_offset)` (`("", 0)`: none).
fn is_behind(epoch: &str, offset: u64, floor_epoch: &str, floor_offset: u64) -> bool {
    !floor_epoch.is_empty() && epoch == floor_epoch && offset < floor_offset
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(slot: &Slot) -> oneshot::Receiver<Result<StreamPosition, BrokerError>> {
        let (done, position) = oneshot::channel();
        lock(slot).waiting.push_back(Pending {
            data: Bytes::from_static(b"1"),
            info: None,
            tags: Tags::new(),
            msg_id: None,
            traceparent: None,
            done,
        });
        position
    }

    #[test]
    fn an_idempotency_key_that_is_no_header_value_is_an_error() {
        assert!(matches!(
            msg_id("chat", "a\r\nb"),
            Err(BrokerError::Internal { .. })
        ));
        assert!(msg_id("chat", "a\nb").is_err());
        assert_eq!(msg_id("chat", "key-1").unwrap().as_str(), "chat:key-1");
    }

    #[tokio::test]
    async fn a_flusher_that_panics_leaves_the_channel_usable() {
        let slot = Slot::default();
        lock(&slot).flushing = true;
        lock(&slot).tail = Some(Tail {
            epoch: "e".into(),
            offset: 3,
            seq: 9,
            boot: Arc::from("b"),
        });
        let queued = pending(&slot);
        let task = tokio::spawn({
            let slot = slot.clone();
            async move {
                let _guard = FlushGuard {
                    slot: slot.clone(),
                    ended: false,
                };
                let _held = lock(&slot); // poisons the lock too
                panic!("a bug in the publisher task");
            }
        });
        assert!(task.await.unwrap_err().is_panic());
        {
            let ch = lock(&slot);
            assert!(!ch.flushing, "the next publish starts a flusher");
            assert!(ch.tail.is_none(), "the last store's outcome is unknown");
            assert!(ch.waiting.is_empty());
        }
        assert!(matches!(
            queued.await,
            Ok(Err(BrokerError::Internal { .. }))
        ));
    }

    #[tokio::test]
    async fn a_flusher_that_ends_normally_leaves_a_new_queue_alone() {
        let slot = Slot::default();
        let guard = FlushGuard {
            slot: slot.clone(),
            ended: true,
        };
        // A publication queued after the flusher cleared the flag, with a new flusher running.
        lock(&slot).flushing = true;
        let mut queued = pending(&slot);
        drop(guard);
        assert!(lock(&slot).flushing);
        assert_eq!(lock(&slot).waiting.len(), 1);
        assert!(queued.try_recv().is_err(), "still waiting");
    }

    #[test]
    fn behind_means_same_epoch_lower_offset() {
        assert!(is_behind("e", 3, "e", 6));
        assert!(is_behind("e", 0, "e", 1), "a marker below what was seen");
        assert!(!is_behind("e", 6, "e", 6));
        assert!(!is_behind("e", 7, "e", 6), "another node published more");
        assert!(!is_behind("f", 1, "e", 6), "a new epoch already");
        assert!(!is_behind("e", 3, "", 0), "nothing seen");
    }
}
