//! Reading a channel's position and publications back from JetStream.
//!
//! The channel's last message gives the position (epoch, top offset). A last message below the
//! newest position this node saw in the same epoch means NATS lost writes: the channel starts
//! over with a new epoch (see `publish.rs`). Every position read counts as seen. Publications
//! are then read newest first: a few by following each message's `Herald-Prev` link (one direct
//! get each, no server state), more through a short-lived filtered consumer (three round trips in
//! all, however many messages). nats-server 2.9 has no batched direct get, so this is the
//! cheapest pair. A namespace's `history_size` and `history_ttl` are applied here, on read: the
//! stream may keep more than a namespace shows.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::stream;
use futures_util::StreamExt;
use herald_broker::{BrokerError, HistoryQuery, HistoryResult, StreamOptions};
use herald_protocol::{Publication, StreamPosition};
use time::OffsetDateTime;

use crate::broker::Inner;
use crate::codec::decode_publications;
use crate::markers::last_or_marker;
use crate::metrics::inc;
use crate::publish::{read_seq, Found};
use crate::streams::Kind;

/// Up to this many publications are read by following links (at most one request per message,
/// fewer when messages hold several); more through a consumer.
const WALK_LIMIT: usize = 8;

/// `Broker::history`.
pub(crate) async fn history(
    inner: &Inner,
    channel: &str,
    query: &HistoryQuery,
    opts: &StreamOptions,
) -> Result<HistoryResult, BrokerError> {
    inc(&inner.metrics.history_reads);
    let result = read(inner, channel, query, opts).await;
    if result.is_err() {
        inc(&inner.metrics.history_errors);
    }
    result
}

/// How many of the tail check's position reads are under way at once. One at a time (the
/// trait's default) pays a round trip each; a whole tick's reads at once (32 tried) reached
/// nats-server as one burst that held back publications' acknowledgements (the fan-in's p99 at
/// 1,000/s went from 21-32 ms to 105-128 ms: docs/benchmarks.md).
const POSITION_READS_AT_ONCE: usize = 4;

/// `Broker::positions`: each channel's newest position as `history` with `limit: Some(0)` reads
/// it, a few reads at a time, in `channels`' order.
pub(crate) async fn positions(
    inner: &Inner,
    channels: &[(Arc<str>, StreamOptions)],
) -> Vec<Result<StreamPosition, BrokerError>> {
    // The futures built in a loop, not by a closure over the slice: a closure here is not
    // general enough for `async_trait`'s `Send` bound.
    let mut reads = Vec::with_capacity(channels.len());
    for (channel, opts) in channels {
        reads.push(history(inner, channel, &HistoryQuery::POSITION, opts));
    }
    futures_util::stream::iter(reads)
        .buffered(POSITION_READS_AT_ONCE)
        .map(|read| read.map(|h| h.position))
        .collect()
        .await
}

async fn read(
    inner: &Inner,
    channel: &str,
    query: &HistoryQuery,
    opts: &StreamOptions,
) -> Result<HistoryResult, BrokerError> {
    inner.ensure_connected()?;
    let kind = inner.kind(opts);
    let subject = inner.stream_subject(kind, channel);
    let last = last_or_marker(inner, kind, channel, &subject, opts.empty_ttl).await?;
    let position = StreamPosition {
        epoch: last.stored.epoch.clone(),
        offset: last.stored.last(),
    };
    inner
        .watermarks
        .observe(channel, &position.epoch, position.offset);
    let kept = if kind == Kind::History {
        opts.history_size
    } else {
        0
    };
    let limit = query.limit.unwrap_or(usize::MAX);
    let answer = |stored: Vec<(Publication, u64)>, continuous| {
        let (publications, stored_at_ms) = stored.into_iter().unzip();
        HistoryResult {
            position: position.clone(),
            publications,
            continuous,
            stored_at_ms,
        }
    };

    let Some(since) = &query.since else {
        // The newest `limit`, oldest first.
        let want = limit.min(kept);
        let publications = newest(inner, kind, &subject, &last, want, opts.history_ttl).await?;
        return Ok(answer(publications, true));
    };
    if since.epoch != position.epoch || since.offset > position.offset {
        return Ok(answer(Vec::new(), false));
    }
    let missed = position.offset - since.offset;
    if missed == 0 {
        return Ok(answer(Vec::new(), true));
    }
    if missed > kept as u64 {
        // Trimmed by size already: no read needed to know recovery is impossible.
        return Ok(answer(Vec::new(), false));
    }
    let want = usize::try_from(missed).unwrap_or(usize::MAX);
    let publications = newest(inner, kind, &subject, &last, want, opts.history_ttl).await?;
    let continuous = publications.len() == want
        && publications.first().map(|(p, _)| p.offset) == Some(since.offset + 1);
    if !continuous {
        return Ok(answer(Vec::new(), false));
    }
    Ok(answer(publications.into_iter().take(limit).collect(), true))
}

/// The newest `want` publications of the subject that are younger than `ttl`, oldest first,
/// consecutive and ending at `last`, each with when its message was stored (ms since the Unix
/// epoch, the server's clock). Fewer when older ones are gone.
async fn newest(
    inner: &Inner,
    kind: Kind,
    subject: &str,
    last: &Found,
    want: usize,
    ttl: Duration,
) -> Result<Vec<(Publication, u64)>, BrokerError> {
    let top = last.stored.last();
    if want == 0 || top == 0 {
        return Ok(Vec::new());
    }
    let cutoff = cutoff(ttl);
    let mut chain: Vec<Found> = if want <= WALK_LIMIT {
        walk_back(inner, kind, last, want).await?
    } else {
        scan(inner, kind, subject, last, cutoff).await?
    };
    // Oldest message first; keep the unbroken run of publications that ends at the top and is
    // young enough, newest `want` of it.
    chain.retain(|f| f.time >= cutoff);
    let mut run: Vec<(Publication, u64)> = Vec::with_capacity(want.min(4096));
    let mut expect = top;
    'messages: for f in chain.into_iter().rev() {
        if f.stored.epoch != last.stored.epoch {
            break;
        }
        let at_ms = u64::try_from(f.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
        for p in f.stored.publications.into_iter().rev() {
            if p.offset != expect || expect == 0 || run.len() == want {
                break 'messages;
            }
            expect -= 1;
            run.push((p, at_ms));
        }
    }
    run.reverse();
    Ok(run)
}

/// `now - ttl`, clamped.
fn cutoff(ttl: Duration) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    time::Duration::try_from(ttl)
        .ok()
        .and_then(|ttl| now.checked_sub(ttl))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Follow `Herald-Prev` links from `last` until the messages hold `want` publications (or the
/// chain breaks), oldest first.
async fn walk_back(
    inner: &Inner,
    kind: Kind,
    last: &Found,
    want: usize,
) -> Result<Vec<Found>, BrokerError> {
    let mut held = last.stored.publications.len();
    let mut chain = vec![last.clone()];
    while held < want {
        let prev = chain.last().map_or(0, |f| f.stored.prev);
        if prev == 0 {
            break;
        }
        match read_seq(inner, kind, prev).await? {
            Some(f) if !f.stored.publications.is_empty() => {
                held += f.stored.publications.len();
                chain.push(f);
            }
            _ => break,
        }
    }
    chain.reverse();
    Ok(chain)
}

/// Read every message of the subject newer than `cutoff` with an ephemeral consumer; oldest
/// first. Bounded by what the stream keeps per channel: `max_msgs_per_channel`, and, since
/// publishing trims a channel to its own `history_size` every `history_size` publications (see
/// `publish.rs`), at most twice the namespace's history.
async fn scan(
    inner: &Inner,
    kind: Kind,
    subject: &str,
    last: &Found,
    cutoff: OffsetDateTime,
) -> Result<Vec<Found>, BrokerError> {
    // A second of slack for clock skew between this node and the server; filtered exactly later.
    let start_time = cutoff.checked_sub(time::Duration::SECOND).unwrap_or(cutoff);
    let deliver_policy = if start_time <= OffsetDateTime::UNIX_EPOCH {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartTime { start_time }
    };
    let messages = fetch_filtered(inner, inner.streams.of(kind), subject, deliver_policy).await?;
    let mut chain = Vec::with_capacity(messages.len());
    for (seq, time, message) in messages {
        if seq > last.seq {
            break;
        }
        let headers = message.headers.unwrap_or_default();
        if let Some(stored) = decode_publications(&headers, &message.payload) {
            if !stored.publications.is_empty() {
                chain.push(Found { seq, time, stored });
            }
        }
    }
    Ok(chain)
}

/// Every message matching `filter` from `deliver_policy` on, with its stream sequence and time,
/// through an ephemeral pull consumer that is deleted afterwards.
pub(crate) async fn fetch_filtered(
    inner: &Inner,
    stream: &stream::Stream<()>,
    filter: &str,
    deliver_policy: DeliverPolicy,
) -> Result<Vec<(u64, OffsetDateTime, async_nats::Message)>, BrokerError> {
    let config = pull::Config {
        deliver_policy,
        filter_subject: filter.to_owned(),
        ack_policy: AckPolicy::None,
        // The server removes it by itself should the delete below not arrive.
        inactive_threshold: Duration::from_secs(30),
        memory_storage: true,
        ..pull::Config::default()
    };
    let consumer = inner
        .timed("create consumer", stream.create_consumer(config))
        .await?
        .map_err(|e| {
            BrokerError::unavailable(format!("create consumer on {filter}: {e}")).caused_by(e)
        })?;
    let pending = usize::try_from(consumer.cached_info().num_pending).unwrap_or(usize::MAX);
    let name = consumer.cached_info().name.clone();
    let mut out = Vec::with_capacity(pending.min(4096));
    if pending > 0 {
        let read = async {
            let mut batch = consumer
                .fetch()
                .max_messages(pending)
                .messages()
                .await
                .map_err(|e| {
                    BrokerError::unavailable(format!("fetch {filter}: {e}")).caused_by(e)
                })?;
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| {
                    BrokerError::unavailable(format!("fetch {filter}: {e}")).caused_by(e)
                })?;
                let info = message.info().map_err(|e| {
                    BrokerError::internal(format!("message info: {e}")).caused_by(e)
                })?;
                let (seq, time) = (info.stream_sequence, info.published);
                out.push((seq, time, message.message));
            }
            Ok::<_, BrokerError>(())
        };
        inner.timed("fetch", read).await??;
    }
    // Not on the caller's path; an ephemeral consumer also expires by itself.
    let stream = stream.clone();
    tokio::spawn(async move {
        let _ = stream.delete_consumer(&name).await;
    });
    Ok(out)
}
