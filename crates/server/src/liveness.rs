//! A two-way connection's timers and what each means: before `connect`, the handshake deadline;
//! after it, protocol pings and the pong each is owed, and token expiry. Shared by WebSocket and
//! emulated connections, whose loops differ only in how they read and write.

use std::time::Duration;

use bytes::Bytes;
use herald_core::outbound::CloseRequest;
use herald_core::{Outbound, Session};
use herald_protocol::encode::PING;
use herald_protocol::CloseCode;
use tokio::time::Instant;

use crate::ws::close_request;

/// The timers of one connection.
pub(crate) struct Liveness {
    handshake_deadline: Instant,
    ping_every: Duration,
    pong_timeout: Duration,
    next_ping: Instant,
    pong_due: Option<Instant>,
}

impl Liveness {
    /// Timers for a connection opened now.
    pub(crate) fn new(config: &herald_core::Config) -> Self {
        let now = Instant::now();
        let ping_every = Duration::from_secs(config.ping_interval_s);
        Liveness {
            handshake_deadline: now + Duration::from_millis(config.limits.handshake_timeout_ms),
            ping_every,
            pong_timeout: Duration::from_secs(config.pong_timeout_s),
            next_ping: now + ping_every,
            pong_due: None,
        }
    }

    /// When the connection's loop must wake next.
    pub(crate) fn deadline(&self, session: &Session) -> Instant {
        if !session.is_connected() {
            return self.handshake_deadline;
        }
        let mut d = self
            .pong_due
            .map_or(self.next_ping, |p| p.min(self.next_ping));
        if let Some(exp) = session.expires_at() {
            d = d.min(Instant::from_std(exp));
        }
        d
    }

    /// The client sent a message: that answers any ping.
    pub(crate) fn heard(&mut self) {
        self.pong_due = None;
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
        if self.pong_due.is_some_and(|due| due <= now) {
            let req = close_request(CloseCode::NO_PONG, "no pong in time");
            return Some((Vec::new(), req));
        }
        if self.next_ping <= now {
            out.push(Bytes::from_static(PING));
            self.pong_due = Some(now + self.pong_timeout);
            self.next_ping = now + self.ping_every;
        }
        None
    }
}
