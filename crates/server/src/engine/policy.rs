//! The policies every connection shares, whatever its transport and protocol, each in one place:
//! the write timeout, slow-consumer accounting, the drain's close, and the ping schedule.

use std::future::Future;
use std::time::Duration;

use herald_core::outbound::CloseRequest;
use herald_protocol::CloseCode;
use tokio::time::{timeout, Instant};

use crate::state::App;

/// How long one write (a batch and its flush) may take before the client counts as no longer
/// reading (`limits.write_timeout_ms`).
pub(crate) fn write_timeout(app: &App) -> Duration {
    Duration::from_millis(app.ctx.config.limits.write_timeout_ms)
}

/// Run `write` within `limit`: true when it finished in time without error.
pub(crate) async fn timed<E>(limit: Duration, write: impl Future<Output = Result<(), E>>) -> bool {
    matches!(timeout(limit, write).await, Ok(Ok(())))
}

/// A connection closes as `close` says (or, when `close` is `None`, its write failed): count it
/// as a slow consumer when its queue overflowed (4001). A client that stopped reading blocks
/// the write until it times out, and its queue overflows meanwhile: it counts even though the
/// jammed socket cannot carry the close any more.
pub(crate) fn count_close(app: &App, close: Option<&CloseRequest>) {
    if close.is_some_and(|req| req.code == CloseCode::SLOW_CONSUMER) {
        app.ctx.hub.metrics().slow_consumers.inc();
    }
}

/// The close a draining node queues for each open connection, with `after_ms` as the reconnect
/// hint its protocol gives.
pub(crate) fn drain_request(after_ms: Option<u64>) -> CloseRequest {
    CloseRequest {
        code: CloseCode::SHUTDOWN,
        reason: "server shutdown".into(),
        after_ms,
    }
}

/// A random delay within the drain window (`drain_ms`), so that the reconnects of a draining
/// node's clients spread instead of arriving as one herd.
pub(crate) fn spread(drain_ms: u64) -> u64 {
    rand::random_range(0..drain_ms.max(1))
}

/// When a connection pings its client, and how long a pong may take.
///
/// Two schedules: Herald pings every `every` whatever the traffic ([`Every`]); Pusher
/// pings after `every` of silence from the client ([`AfterSilence`]). Either way a ping
/// owes a pong (any message from the client) within the pong timeout, when the transport can
/// carry one back.
///
/// The schedule is a type parameter (`AFTER_SILENCE`), not a field: this lives in every idle
/// connection's task, and a flag would cost it 8 bytes.
pub(crate) struct Pings<const AFTER_SILENCE: bool> {
    every: Duration,
    pong_timeout: Option<Duration>,
    next: Instant,
    pong_due: Option<Instant>,
}

/// Herald's schedule: a ping every interval, whatever the traffic.
pub(crate) type Every = Pings<false>;
/// Pusher's schedule: a ping after an interval of silence (built with the `pusher` feature).
#[cfg(any(test, feature = "pusher"))]
pub(crate) type AfterSilence = Pings<true>;

/// What a passed deadline means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tick {
    /// A pong is owed and late: close.
    Late,
    /// Ping now.
    Ping,
    /// Nothing is due yet.
    Quiet,
}

impl Every {
    /// Ping every `every` from now; a pong is owed within `pong_timeout` (`None`: a one-way
    /// transport, whose client cannot answer).
    pub(crate) fn every(every: Duration, pong_timeout: Option<Duration>) -> Self {
        Pings::new(every, pong_timeout)
    }
}

#[cfg(any(test, feature = "pusher"))]
impl AfterSilence {
    /// Ping after `silence` without a message from the client; a pong is owed within
    /// `pong_timeout`.
    pub(crate) fn after_silence(silence: Duration, pong_timeout: Duration) -> Self {
        Pings::new(silence, Some(pong_timeout))
    }
}

impl<const AFTER_SILENCE: bool> Pings<AFTER_SILENCE> {
    fn new(every: Duration, pong_timeout: Option<Duration>) -> Self {
        Pings {
            every,
            pong_timeout,
            next: Instant::now() + every,
            pong_due: None,
        }
    }

    /// When the schedule needs the connection next.
    pub(crate) fn deadline(&self) -> Instant {
        match self.pong_due {
            Some(due) if AFTER_SILENCE => due,
            Some(due) => due.min(self.next),
            None => self.next,
        }
    }

    /// The client sent something: that answers any ping (and, after silence, restarts it).
    pub(crate) fn heard(&mut self) {
        self.pong_due = None;
        if AFTER_SILENCE {
            self.next = Instant::now() + self.every;
        }
    }

    /// The deadline passed at `now`: what it means. A ping is counted as sent.
    pub(crate) fn on_timer(&mut self, now: Instant) -> Tick {
        if self.pong_due.is_some_and(|due| due <= now) {
            return Tick::Late;
        }
        if self.next > now {
            return Tick::Quiet;
        }
        self.next = now + self.every;
        self.pong_due = self.pong_timeout.map(|t| now + t);
        Tick::Ping
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn herald_pings_on_a_schedule_and_a_late_pong_closes() {
        let start = Instant::now();
        let mut pings = Every::every(10 * S, Some(3 * S));
        assert_eq!(pings.deadline(), start + 10 * S);
        assert_eq!(pings.on_timer(start + 5 * S), Tick::Quiet);
        assert_eq!(pings.on_timer(start + 10 * S), Tick::Ping);
        assert_eq!(pings.deadline(), start + 13 * S);
        assert_eq!(pings.on_timer(start + 13 * S), Tick::Late);
        // A message answers it; the schedule does not move.
        pings.heard();
        assert_eq!(pings.deadline(), start + 20 * S);
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_way_stream_pings_without_owing_a_pong() {
        let start = Instant::now();
        let mut pings = Every::every(10 * S, None);
        assert_eq!(pings.on_timer(start + 10 * S), Tick::Ping);
        assert_eq!(pings.deadline(), start + 20 * S);
        assert_eq!(pings.on_timer(start + 20 * S), Tick::Ping);
    }

    #[tokio::test(start_paused = true)]
    async fn pusher_pings_after_silence_and_waits_for_the_pong() {
        let start = Instant::now();
        let mut pings = AfterSilence::after_silence(10 * S, 30 * S);
        tokio::time::advance(4 * S).await;
        pings.heard();
        assert_eq!(pings.deadline(), start + 14 * S);
        assert_eq!(pings.on_timer(start + 14 * S), Tick::Ping);
        // Only the pong is awaited, even past the next silence.
        assert_eq!(pings.deadline(), start + 44 * S);
        assert_eq!(pings.on_timer(start + 44 * S), Tick::Late);
    }

    #[test]
    fn spread_stays_in_the_window() {
        assert!((0..100).all(|_| spread(50) < 50));
        assert_eq!(spread(0), 0);
    }
}
