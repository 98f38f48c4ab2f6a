//! What the admin UI asks of a channel's history beyond reading it: removing it, and listing the
//! channels that hold one.
//!
//! A channel's position is its last message (see `history.rs`), so the publications cannot
//! simply be purged: first a marker that carries the same epoch and top offset is stored on top
//! of the last message (compare-and-set on its sequence, so a concurrent publish makes us read
//! again), then the subject is purged down to its newest message, that marker. The marker's
//! `prev` names the purged message, so a history read stops there, and it is not an empty-name
//! marker (`prev` is not 0), so nothing deletes or refreshes it early; it lives the stream's
//! `max_age` like any message. A publish that lands between the two steps is what the purge keeps.
//!
//! The listing asks the history stream for its subjects (`STREAM.INFO` with a subjects filter,
//! one request a page: the server answers with up to its own page of subjects, 100,000 on
//! nats-server 2.9, with their message counts) and keeps the channels whose *newest message holds
//! publications*: a subject whose last message is a marker (an epoch marker of a channel nobody
//! published to, or the position a removal left, `Herald-Count: 0`) holds no history a reader
//! sees and is not listed. That takes one read per subject looked at, so a page looks at
//! `limit` subjects at most (their reads [`READS_AT_ONCE`] at a time). The page's cursor is
//! `<server page offset>:<last subject token looked at>`: the next page asks the server for the
//! same subject page and goes on after that token in token order (sorted here too), then moves
//! to the server's next page (nats-server sorts the subjects it pages: checked on 2.9.10 with
//! 100,010 subjects, the second page held the 10 greatest). A name may repeat, or one added meanwhile be
//! missed, when the server's pages shift between two calls (subjects added or gone).

use std::collections::HashMap;

use futures_util::{StreamExt, TryStreamExt};
use herald_broker::{BrokerError, HistoryChannels};
use serde::Deserialize;

use crate::broker::Inner;
use crate::codec::encode_publications;
use crate::names::{escape, unescape};
use crate::publish::{back_off, read_last, read_last_checked, try_store, Outcome, MAX_ATTEMPTS};
use crate::streams::Kind;

/// Last-message reads of one listing page in flight at once.
const READS_AT_ONCE: usize = 16;

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

/// The part of a `STREAM.INFO` answer with a subjects filter that the listing reads.
#[derive(Deserialize)]
struct SubjectsPage {
    state: SubjectsState,
    /// Subjects matching the filter in all (absent: this answer holds them all).
    #[serde(default)]
    total: Option<usize>,
}

#[derive(Deserialize)]
struct SubjectsState {
    /// Subject → messages it holds; absent when none matches.
    #[serde(default)]
    subjects: Option<HashMap<String, u64>>,
}

/// `Broker::history_channels`: one page (see the module docs).
pub(crate) async fn history_channels(
    inner: &Inner,
    cursor: Option<&str>,
    limit: usize,
) -> Result<HistoryChannels, BrokerError> {
    inner.ensure_connected()?;
    let (offset, after) = match cursor {
        None => (0, String::new()),
        Some(c) => parse_cursor(c)?,
    };
    let limit = limit.max(1);
    let stream = &inner.streams.history_name;
    let request = serde_json::json!({
        "subjects_filter": inner.subjects.stream_filters().history,
        "offset": offset,
    });
    let answer: async_nats::jetstream::response::Response<SubjectsPage> = inner
        .timed(
            "stream info",
            inner.js.request(format!("STREAM.INFO.{stream}"), &request),
        )
        .await?
        .map_err(|e| BrokerError::unavailable(format!("stream info {stream}: {e}")).caused_by(e))?;
    let page = match answer {
        async_nats::jetstream::response::Response::Ok(page) => page,
        async_nats::jetstream::response::Response::Err { error }
            if error.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
        {
            // No stream (yet): no history anywhere. It is created again by the next publish.
            return Ok(HistoryChannels::default());
        }
        async_nats::jetstream::response::Response::Err { error } => {
            return Err(BrokerError::unavailable(format!(
                "stream info {stream}: {error}"
            )));
        }
    };
    let subjects = page.state.subjects.unwrap_or_default();
    let in_page = subjects.len();
    let total = page.total.unwrap_or(offset + in_page);
    let mut tokens: Vec<&str> = subjects
        .keys()
        .filter_map(|subject| inner.subjects.history_token(subject))
        .filter(|token| after.is_empty() || *token > after.as_str())
        .collect();
    tokens.sort_unstable();
    let rest = tokens.split_off(tokens.len().min(limit));
    let reads: Vec<(String, String)> = tokens
        .iter()
        .map(|token| {
            let subject = format!("{}.h.{token}", inner.subjects.prefix());
            (subject, (*token).to_owned())
        })
        .collect();
    let listed: Vec<Option<String>> = futures_util::stream::iter(reads)
        .map(|(subject, token)| listed_channel(inner, subject, token))
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await?;
    let cursor = match tokens.last() {
        Some(last) if !rest.is_empty() => Some(format!("{offset}:{last}")),
        _ if in_page > 0 && offset + in_page < total => Some(format!("{}:", offset + in_page)),
        _ => None,
    };
    Ok(HistoryChannels {
        channels: listed.into_iter().flatten().collect(),
        cursor,
    })
}

/// The channel of the history subject `subject` (its token `token`) when its newest message
/// holds publications.
async fn listed_channel(
    inner: &Inner,
    subject: String,
    token: String,
) -> Result<Option<String>, BrokerError> {
    let last = read_last(inner, Kind::History, &subject).await?;
    let holds_publications = last.is_some_and(|m| !m.stored.publications.is_empty());
    Ok(unescape(&token).filter(|_| holds_publications))
}

/// `<server page offset>:<subject token>` (the token empty: from the page's start); the token
/// must be one that a channel name escapes to.
fn parse_cursor(c: &str) -> Result<(usize, String), BrokerError> {
    let bad = || BrokerError::internal(format!("nats: not a history listing cursor: {c:?}"));
    let (offset, token) = c.split_once(':').ok_or_else(bad)?;
    let offset: usize = offset.parse().map_err(|_| bad())?;
    if !token.is_empty() && unescape(token).map(|name| escape(&name)).as_deref() != Some(token) {
        return Err(bad());
    }
    Ok((offset, token.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors() {
        assert_eq!(parse_cursor("0:").unwrap(), (0, String::new()));
        assert_eq!(parse_cursor("7:a=3Ab").unwrap(), (7, "a=3Ab".to_owned()));
        for bad in [
            "", "x", "1", "x:a", "-1:a", "0:a.b", "0:a=3ab", "0:a=4", "0:a:b",
        ] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
    }
}
