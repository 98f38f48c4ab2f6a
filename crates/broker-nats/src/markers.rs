//! Epoch markers: how a channel nobody published to gets an epoch that its subscribers and its
//! first publisher agree on, and why that costs the server only `empty_ttl` of state.
//!
//! A read of a subject with no message stores a *marker* (the epoch at offset 0, no
//! publications) with `Nats-Expected-Last-Subject-Sequence: 0`: concurrent readers and the first
//! publisher agree on one epoch (whoever stores first wins; the others re-read). JetStream 2.9
//! has no per-message TTL, and the stream keeps messages for a day (`max_age_s`), so without more
//! a client reading fresh channel names could make NATS hold a marker per name for a day. Hence:
//!
//! - the node that stores a marker on an empty subject deletes it again `empty_ttl` later if it
//!   is still the subject's last message (nothing was published, no read refreshed it);
//! - a read that finds a marker older than half of `empty_ttl` stores a fresh copy (same epoch,
//!   compare-and-set on the old one), which starts a new `empty_ttl`, and deletes the old copy.
//!   A node's tail check reads the channels it hosts about once a minute, which keeps their
//!   markers while anyone is subscribed.
//!
//! A marker that expires this way only makes the next reader or publisher start a new epoch: a
//! client holding the old one at offset 0 is told `recovered: false`. A node that crashes before
//! its deletions leaves those markers to the stream's `max_age`. Markers written because NATS
//! came back behind (see `publish::rolled_back`) sit on older messages and are never deleted.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_broker::{new_epoch, BrokerError};
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::debug;

use crate::broker::Inner;
use crate::codec::{encode_publications, Stored};
use crate::metrics::inc;
use crate::publish::{
    back_off, read_last, read_last_checked, store_once, Found, NoAnswer, Outcome, MAX_ATTEMPTS,
};
use crate::streams::Kind;

/// Times a marker store that got no answer in time is made again (after reading the subject
/// afresh: the store is a compare-and-set, so one that did land is found, never doubled).
const STORE_RETRIES: u32 = 2;

/// Pending deletions kept per node; past this the oldest are dropped (those markers then live
/// the stream's `max_age`), so a flood of fresh names cannot grow the node's memory either.
const MAX_PENDING: usize = 1_000_000;
/// How often due deletions run.
const EXPIRY_EVERY: Duration = Duration::from_secs(1);

/// One marker to delete when due, if it is still its subject's last message.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: Instant,
    seq: u64,
    kind: Kind,
    subject: String,
}

/// The markers this node stored on empty subjects, soonest due first.
#[derive(Default)]
pub(crate) struct Expiries {
    due: Mutex<BinaryHeap<Reverse<Due>>>,
}

impl Expiries {
    fn schedule(&self, at: Instant, kind: Kind, subject: &str, seq: u64) {
        let mut due = self.due.lock().expect("expiries lock");
        if due.len() >= MAX_PENDING {
            // Dropping the soonest would be wrong order but bounded; drop the newest instead
            // (the heap cannot pop its last), i.e. do not schedule this one.
            return;
        }
        due.push(Reverse(Due {
            at,
            seq,
            kind,
            subject: subject.to_owned(),
        }));
    }

    fn take_due(&self, now: Instant) -> Vec<Due> {
        let mut due = self.due.lock().expect("expiries lock");
        let mut out = Vec::new();
        while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
            out.extend(due.pop().map(|Reverse(d)| d));
        }
        out
    }
}

/// A marker: no publications.
fn is_marker(found: &Found) -> bool {
    found.stored.publications.is_empty()
}

/// How long ago the message was stored (the server's clock).
fn age(found: &Found) -> Duration {
    let elapsed = OffsetDateTime::now_utc() - found.time;
    Duration::try_from(elapsed).unwrap_or_default()
}

/// The channel's last message, storing an epoch marker when the subject has none (or refreshing
/// an old one, see the module docs). A last message that may not be continued (stored under
/// another boot id, or below this node's watermark: `publish::read_last_checked`) counts as
/// none: a new epoch replaces it.
pub(crate) async fn last_or_marker(
    inner: &Inner,
    kind: Kind,
    channel: &str,
    subject: &str,
    empty_ttl: Duration,
) -> Result<Found, BrokerError> {
    // A marker (or fresh copy) this node stored without hearing back: (epoch, when, the copy it
    // replaces). Found on the next read, it is deleted in time like any other.
    let mut unanswered: Option<(String, Instant, Option<u64>)> = None;
    let mut timeouts = 0;
    for attempt in 0..MAX_ATTEMPTS {
        let checked = read_last_checked(inner, kind, channel, subject).await?;
        let boot = checked.boot;
        if let (Some((epoch, at, old)), Some(last)) = (unanswered.take(), &checked.last) {
            let ours = is_marker(last)
                && last.stored.prev == 0
                && last.stored.epoch == epoch
                && Some(last.seq) != old;
            if ours {
                inner
                    .markers
                    .schedule(at + empty_ttl, kind, subject, last.seq);
                inc(&inner.metrics.markers_stored);
                if let Some(old) = old {
                    delete(inner, kind, old).await;
                }
            }
        }
        // (epoch to store, the subject's last sequence it must still be, the copy it replaces)
        let (epoch, expected, replaces) = match checked.last {
            Some(last) if checked.start_over => (new_epoch(), last.seq, None),
            Some(last)
                if is_marker(&last) && last.stored.prev == 0 && age(&last) > empty_ttl / 2 =>
            {
                (last.stored.epoch.clone(), last.seq, Some(last.seq))
            }
            Some(last) => return Ok(last),
            None => (new_epoch(), 0, None),
        };
        // A marker on an empty subject (or a fresh copy of one) says `prev` 0: it sits on nothing.
        let prev = if expected == 0 || replaces.is_some() {
            0
        } else {
            expected
        };
        let (mut headers, payload) = encode_publications(&epoch, &boot.id, 0, prev, &[]);
        headers.insert(
            crate::codec::EXPECTED_LAST_SUBJECT_SEQ,
            expected.to_string(),
        );
        match store_once(inner, subject, headers, payload).await? {
            Err(NoAnswer) if timeouts < STORE_RETRIES => {
                inner.ensure_connected()?;
                timeouts += 1;
                if prev == 0 {
                    unanswered = Some((epoch, Instant::now(), replaces));
                }
            }
            Err(NoAnswer) => {
                return Err(BrokerError::unavailable("NATS publish timed out"));
            }
            Ok(Outcome::Stored(seq) | Outcome::Duplicate(seq)) => {
                if prev == 0 {
                    inner
                        .markers
                        .schedule(Instant::now() + empty_ttl, kind, subject, seq);
                    inc(&inner.metrics.markers_stored);
                }
                if let Some(old) = replaces {
                    delete(inner, kind, old).await;
                }
                return Ok(Found {
                    seq,
                    time: OffsetDateTime::now_utc(),
                    stored: Stored::marker(epoch, boot.id.to_string()),
                });
            }
            Ok(Outcome::Conflict) => back_off(attempt).await,
            Ok(Outcome::StreamMissing) => {
                inner.tails.clear();
                inner.streams.ensure().await?;
            }
        }
    }
    Err(BrokerError::unavailable(format!(
        "{subject}: could not create the epoch"
    )))
}

/// Delete a message by sequence, best effort (a failure leaves it to `max_age`).
async fn delete(inner: &Inner, kind: Kind, seq: u64) {
    let stream = inner.streams.of(kind);
    match inner.timed("delete", stream.delete_message(seq)).await {
        Ok(Ok(_)) => inc(&inner.metrics.markers_deleted),
        Ok(Err(e)) => debug!(seq, cause = %e, "deleting a marker failed"),
        Err(e) => debug!(seq, cause = %e, "deleting a marker timed out"),
    }
}

/// Delete this node's markers that came due and are still their subject's last message.
pub(crate) async fn run_expiry(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(EXPIRY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if inner.ensure_connected().is_err() {
            continue;
        }
        for due in inner.markers.take_due(Instant::now()) {
            match read_last(&inner, due.kind, &due.subject).await {
                Ok(Some(last)) if last.seq == due.seq && is_marker(&last) => {
                    delete(&inner, due.kind, due.seq).await;
                }
                Ok(_) => {} // published to, refreshed or gone: nothing to do
                Err(e) => debug!(subject = %due.subject, cause = %e, "marker check failed"),
            }
        }
    }
}
