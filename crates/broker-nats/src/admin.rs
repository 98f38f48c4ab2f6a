//! Removing a channel's history (the admin UI's action).
//!
//! A channel's position is its last message (see `history.rs`), so the publications cannot
//! simply be purged: first a marker that carries the same epoch and top offset is stored on top
//! of the last message (compare-and-set on its sequence, so a concurrent publish makes us read
//! again), then the subject is purged down to its newest message, that marker. The marker's
//! `prev` names the purged message, so a history read stops there, and it is not an empty-name
//! marker (`prev` is not 0), so nothing deletes or refreshes it early; it lives the stream's
//! `max_age` like any message. A publish that lands between the two steps is what the purge keeps.

use herald_broker::BrokerError;

use crate::broker::Inner;
use crate::codec::encode_publications;
use crate::publish::{back_off, read_last_checked, try_store, Outcome, MAX_ATTEMPTS};
use crate::streams::Kind;

/// `Broker::remove_history`: only the history stream holds publications a reader sees (the live
/// stream keeps just the newest, for its offset).
pub(crate) async fn remove_history(inner: &Inner, channel: &str) -> Result<(), BrokerError> {
    inner.ensure_connected()?;
    let kind = Kind::History;
    let subject = inner.stream_subject(kind, channel);
    for attempt in 0..MAX_ATTEMPTS {
        let checked = read_last_checked(inner, kind, channel, &subject).await?;
        let last = match checked.last {
            // Nothing stored, or a stream that starts over at its next read: nothing to keep.
            None => return Ok(()),
            Some(_) if checked.start_over => return Ok(()),
            Some(last) if last.stored.publications.is_empty() && last.stored.prev == 0 => {
                return Ok(()); // an epoch marker on an otherwise empty subject
            }
            Some(last) => last,
        };
        let top = last.stored.last();
        let (headers, payload) =
            encode_publications(&last.stored.epoch, &checked.boot.id, top + 1, last.seq, &[]);
        match try_store(inner, &subject, headers, payload).await? {
            Outcome::Stored(_) | Outcome::Duplicate(_) => {
                let stream = inner.streams.of(kind);
                let purge = stream.purge().filter(subject.clone()).keep(1);
                inner
                    .timed("purge", async { purge.await })
                    .await?
                    .map_err(|e| {
                        BrokerError::unavailable(format!("purge {subject}: {e}")).caused_by(e)
                    })?;
                return Ok(());
            }
            Outcome::Conflict => back_off(attempt).await,
            Outcome::StreamMissing => return Ok(()),
        }
    }
    Err(BrokerError::unavailable(format!(
        "{subject}: publications kept arriving; the history was not removed"
    )))
}
