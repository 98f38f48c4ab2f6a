//! The boot id: what binds a channel's epoch to the life of the NATS server(s) that keep it, so
//! that a stream that went backwards is never continued in its old epoch, by any node, including
//! one that never saw it (issue 29 item 5).
//!
//! Anything kept in a file stream is rewound with it when NATS comes back from an older copy of
//! its store (a restored backup or disk snapshot, an R1 server whose last writes never reached the
//! disk), so the binding must be to something such a restart changes. The boot id is a random
//! value kept as the only message of `<stream>_BOOT`, a **memory** stream: every restart of the
//! server(s) holding it empties it, whatever their disks hold, and the first node to look after
//! that stores a fresh id (`Nats-Expected-Last-Subject-Sequence: 0`, so racing nodes agree on
//! one). Every stored publication and epoch marker carries the boot id it was stored under
//! (`Herald-Boot`); a node that reads a channel's last message stamped with another id starts a
//! new epoch on it instead of numbering on (`publish::read_last_checked`).
//!
//! Simpler candidates, and why not:
//! - `server_info().server_id`, which nats-server regenerates at each start: it names the server
//!   the *client* is connected to, but on a cluster the stream may live on other servers, and a
//!   client that merely reconnects to another server of the cluster would change every epoch
//!   for nothing.
//! - The stream's creation time (`StreamInfo.created`): restored with the store, so a rollback
//!   keeps it.
//!
//! The memory stream has the same replicas as the history stream: with R3 on a cluster, one
//! server restarting keeps it (and its file replica catches up from the others), so epochs
//! survive; all servers restarting empties it. With R1 on a cluster, the boot stream and a
//! channel's stream may sit on different servers, so the binding holds only when they restart
//! together (documented in `docs/multi-node-nats.md`).
//!
//! A node caches the boot id together with its client's connection count (`Statistics::
//! connects`, raised before a new connection is usable), and reads it again whenever that count
//! moved: a restarted server always means a new connection. A read that raced a reconnect is
//! re-done (`BootId::still_current`), so a node never judges a restored stream with the boot id of
//! the server's previous life. A stamp that differs from the cached id is confirmed against the
//! server before it costs an epoch (the id may have changed while this node stayed connected,
//! e.g. the boot stream's server restarted on a cluster), and every few seconds the node re-reads
//! it anyway (`receive::watch_streams`).
//!
//! With `synchronous_persistence` none of this runs: the boot id is empty, nothing is stamped and
//! nothing is compared, and no boot stream is created.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::stream::RawMessageErrorKind;
use async_nats::HeaderMap;
use bytes::Bytes;
use herald_broker::{new_epoch, BrokerError};
use tracing::{info, warn};

use crate::broker::Inner;
use crate::codec::EXPECTED_LAST_SUBJECT_SEQ;
use crate::publish::{back_off, try_store, Outcome, MAX_ATTEMPTS};

/// A boot id read at least this recently counts as confirmed: a flood of stale stamps after a
/// restart (one per channel) costs one read, not one per channel.
const CONFIRMED_FOR: Duration = Duration::from_secs(1);

/// The boot id as a node knows it, with the connection it was read on.
#[derive(Debug, Clone)]
pub(crate) struct BootId {
    /// Empty: nothing is bound (`synchronous_persistence`).
    pub(crate) id: Arc<str>,
    /// The client's connection count when it was read.
    connects: u64,
}

impl BootId {
    /// Whether a message stamped `stamp` was stored in another life of the server(s) than this
    /// boot id's: the one rule every reader applies. An unstamped message (stored with
    /// `synchronous_persistence`, or by an older Herald) counts as another life.
    pub(crate) fn is_stale(&self, stamp: &str) -> bool {
        !self.id.is_empty() && stamp != &*self.id
    }
}

struct Known {
    boot: BootId,
    read_at: Instant,
}

/// A node's view of the boot id.
pub(crate) struct Boot {
    enabled: bool,
    known: Mutex<Option<Known>>,
    /// One read from the server at a time; the others then find it cached.
    reading: tokio::sync::Mutex<()>,
}

impl Boot {
    pub(crate) fn new(synchronous_persistence: bool) -> Self {
        Boot {
            enabled: !synchronous_persistence,
            known: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    fn connects(inner: &Inner) -> u64 {
        inner.client.statistics().connects.load(Ordering::SeqCst)
    }

    fn cached(&self) -> Option<(BootId, Instant)> {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.as_ref().map(|k| (k.boot.clone(), k.read_at))
    }

    /// The boot id for the current connection: cached, or read (and created if absent) when the
    /// client connected since it was read.
    pub(crate) async fn current(&self, inner: &Inner) -> Result<BootId, BrokerError> {
        if !self.enabled {
            return Ok(BootId {
                id: Arc::from(""),
                connects: 0,
            });
        }
        match self.cached() {
            Some((boot, _)) if boot.connects == Self::connects(inner) => Ok(boot),
            _ => self.read(inner, None).await,
        }
    }

    /// Whether `boot` was read on the connection the client still has: a read made since under
    /// it went to the same server life.
    pub(crate) fn still_current(&self, inner: &Inner, boot: &BootId) -> bool {
        !self.enabled || boot.connects == Self::connects(inner)
    }

    /// The boot id read afresh from the server (unless read within [`CONFIRMED_FOR`]): called
    /// before a stale stamp costs a channel its epoch, and periodically.
    pub(crate) async fn confirm(&self, inner: &Inner) -> Result<BootId, BrokerError> {
        if !self.enabled {
            return self.current(inner).await;
        }
        self.read(inner, Some(Instant::now())).await
    }

    /// Read the boot id from the server and cache it. With `asked_at`, a value read within
    /// [`CONFIRMED_FOR`] before it (by a concurrent caller) is taken instead; without, one read on
    /// the current connection is.
    async fn read(&self, inner: &Inner, asked_at: Option<Instant>) -> Result<BootId, BrokerError> {
        let _one = self.reading.lock().await;
        let connects = Self::connects(inner);
        if let Some((boot, read_at)) = self.cached() {
            let fresh = match asked_at {
                Some(at) => read_at + CONFIRMED_FOR > at && boot.connects == connects,
                None => boot.connects == connects,
            };
            if fresh {
                return Ok(boot);
            }
        }
        let id = read_or_create(inner).await?;
        let boot = BootId { id, connects };
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let changed = known.as_ref().is_some_and(|k| k.boot.id != boot.id);
        if changed {
            // Cached tails were stored under the old id; they say nothing about the new life.
            warn!(boot = %boot.id, "NATS was restarted (new boot id): channels start new epochs");
            inner.tails.clear();
        }
        *known = Some(Known {
            boot: boot.clone(),
            read_at: Instant::now(),
        });
        Ok(boot)
    }
}

/// The boot stream's message, or a fresh one stored if it has none.
async fn read_or_create(inner: &Inner) -> Result<Arc<str>, BrokerError> {
    let subject = inner.subjects.boot();
    let stream = &inner.streams.boot;
    for attempt in 0..MAX_ATTEMPTS {
        // From the stream leader, never a replica's direct get: a lagging replica's answer
        // could be an older id.
        let got = inner
            .timed("read", stream.get_last_raw_message_by_subject(&subject))
            .await?;
        match got {
            Ok(message) => {
                let id = std::str::from_utf8(&message.payload)
                    .ok()
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| BrokerError::internal("the boot id is not text"))?;
                return Ok(Arc::from(id));
            }
            Err(err) => match err.kind() {
                RawMessageErrorKind::NoMessageFound => {}
                RawMessageErrorKind::JetStream(e)
                    if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    inner.streams.ensure().await?;
                    continue;
                }
                _ => {
                    return Err(
                        BrokerError::unavailable(format!("read the boot id: {err}")).caused_by(err)
                    )
                }
            },
        }
        let id = new_epoch();
        let mut headers = HeaderMap::new();
        headers.insert(EXPECTED_LAST_SUBJECT_SEQ, "0");
        match try_store(inner, &subject, headers, Bytes::from(id.clone())).await? {
            Outcome::Stored(_) => {
                info!(boot = %id, "stored a new NATS boot id");
                return Ok(Arc::from(id));
            }
            // Another node stored one first: read it.
            Outcome::Conflict | Outcome::Duplicate(_) => back_off(attempt).await,
            Outcome::StreamMissing => inner.streams.ensure().await?,
        }
    }
    Err(BrokerError::unavailable(
        "could not agree on a NATS boot id",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_from_another_life_is_stale() {
        let boot = BootId {
            id: Arc::from("b2"),
            connects: 1,
        };
        assert!(!boot.is_stale("b2"));
        assert!(boot.is_stale("b1"), "stored before a restart");
        assert!(
            boot.is_stale(""),
            "unstamped: stored by an older Herald or without the binding"
        );
        let unbound = BootId {
            id: Arc::from(""),
            connects: 0,
        };
        assert!(
            !unbound.is_stale("b1") && !unbound.is_stale(""),
            "synchronous_persistence"
        );
    }
}
