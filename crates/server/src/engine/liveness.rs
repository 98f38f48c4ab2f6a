//! A Herald connection's timers and what each means: before `connect`, the handshake deadline;
//! after it, protocol pings and the pong each is owed (the schedule is the engine's, see
//! [`super::policy::Pings`]), and token expiry. Shared by every transport of Herald's
//! protocol: a one-way stream is connected from the start and owes no pongs.

use std::time::Duration;

use bytes::Bytes;
use herald_core::outbound::CloseRequest;
use herald_core::{Outbound, Session};
use herald_protocol::encode::PING;
use herald_protocol::CloseCode;
use tokio::time::Instant;

use super::herald::close_request;
use super::policy::{Every, Tick};

/// The timers of one connection.
pub(crate) struct Liveness {
    handshake_deadline: Instant,
    pings: Every,
}

impl Liveness {
    /// Timers for a two-way connection opened now.
    pub(crate) fn new(config: &herald_core::Config) -> Self {
        Self::with_pongs(config, Some(Duration::from_secs(config.pong_timeout_s)))
    }

    /// Timers for a one-way stream, connected before it opens: its client cannot answer pings.
    pub(crate) fn one_way(config: &herald_core::Config) -> Self {
        Self::with_pongs(config, None)
    }

    fn with_pongs(config: &herald_core::Config, pong_timeout: Option<Duration>) -> Self {
        let now = Instant::now();
        Liveness {
            handshake_deadline: now + Duration::from_millis(config.limits.handshake_timeout_ms),
            pings: Every::every(Duration::from_secs(config.ping_interval_s), pong_timeout),
        }
    }

    /// When the connection's loop must wake next.
    pub(crate) fn deadline(&self, session: &Session) -> Instant {
        if !session.is_connected() {
            return self.handshake_deadline;
        }
        let mut d = self.pings.deadline();
        if let Some(exp) = session.expires_at() {
            d = d.min(Instant::from_std(exp));
        }
        d
    }

    /// The client sent a message: that answers any ping.
    pub(crate) fn heard(&mut self) {
        self.pings.heard();
    }

    /// The deadline passed: the close it calls for (with the frames still queued), or a ping
    /// queued in `out`.
    pub(crate) async fn on_timer(
        &mut self,
        session: &mut Session,
        out: &Outbound,
    ) -> Option<(Vec<Bytes>, CloseRequest)> {
        let now = Instant::now();
        if !session.is_connected() {
            let req = close_request(CloseCode::BAD_REQUEST, "no connect command in time");
            return Some((Vec::new(), req));
        }
        if session
            .expires_at()
            .is_some_and(|exp| Instant::from_std(exp) <= now)
        {
            // An expired connection token closes; expired subscription tokens end their
            // subscriptions only.
            if let Some(req) = Box::pin(session.expire(now.into_std())).await {
                return Some((out.drain().frames, req));
            }
        }
        match self.pings.on_timer(now) {
            Tick::Late => {
                let req = close_request(CloseCode::NO_PONG, "no pong in time");
                Some((Vec::new(), req))
            }
            Tick::Ping => {
                out.push(Bytes::from_static(PING));
                None
            }
            Tick::Quiet => None,
        }
    }
}
