//! The task of one SSE or NDJSON connection: drain the session's queue into the response body,
//! ping, expire tokens, drain on shutdown, and stop when the client goes away.
//!
//! The body is fed through a small bounded channel; a client that stops reading fills it, the
//! send times out after `limits.write_timeout_ms` and the connection ends, and meanwhile the
//! outbound queue's byte limit closes it as a slow consumer (4001) as on WebSocket.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use herald_core::outbound::CloseRequest;
use herald_core::{Outbound, Session};
use herald_protocol::CloseCode;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant};

use super::format::{Encoder, Format};
use crate::guard::IpSlot;
use crate::http::App;

/// Counts the connection while it lives, per transport.
struct Counted(Arc<App>, Format);

impl Counted {
    fn new(app: Arc<App>, format: Format) -> Self {
        app.stream_connections(format)
            .fetch_add(1, Ordering::Relaxed);
        app.ctx.hub.metrics().connections.inc();
        app.ctx.hub.metrics().connections_accepted.inc();
        Counted(app, format)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0
            .stream_connections(self.1)
            .fetch_sub(1, Ordering::Relaxed);
        self.0.ctx.hub.metrics().connections.dec();
    }
}

/// Run the connection until it ends. `end` is a close decided while encoding the first chunk.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    app: Arc<App>,
    mut session: Session,
    out: Arc<Outbound>,
    mut encoder: Encoder,
    tx: mpsc::Sender<Bytes>,
    mut end: Option<CloseRequest>,
    format: Format,
    ip_slot: Option<Arc<IpSlot>>,
) {
    let _ip_slot = ip_slot;
    let _counted = Counted::new(app.clone(), format);
    let config = app.ctx.config.clone();
    let write_limit = Duration::from_millis(config.limits.write_timeout_ms);
    let ping_every = Duration::from_secs(config.ping_interval_s);
    let mut next_ping = Instant::now() + ping_every;
    let mut draining = app.draining.clone();
    let send = |chunk: Bytes| {
        let tx = tx.clone();
        async move { matches!(timeout(write_limit, tx.send(chunk)).await, Ok(Ok(()))) }
    };

    let close = loop {
        if let Some(req) = end.take() {
            break Some(req);
        }
        let mut deadline = next_ping;
        if let Some(exp) = session.expires_at() {
            deadline = deadline.min(Instant::from_std(exp));
        }
        tokio::select! {
            biased;
            _ = out.ready() => {
                let drained = out.drain();
                if !drained.controls.is_empty() {
                    Box::pin(session.handle_controls(drained.controls)).await;
                }
                let mut chunk = BytesMut::new();
                for frame in &drained.frames {
                    if let Some(req) = encoder.push(frame, &mut chunk) {
                        end = end.or(Some(req));
                    }
                }
                if let Some(req) = drained.close {
                    if req.code == CloseCode::SLOW_CONSUMER {
                        app.ctx.hub.metrics().slow_consumers.inc();
                    }
                    encoder.disconnect(&req, &mut chunk);
                    let _ = send(chunk.freeze()).await;
                    break None;
                }
                if !chunk.is_empty() && !send(chunk.freeze()).await {
                    break None; // the client stopped reading or went away
                }
            }
            _ = sleep_until(deadline) => {
                let now = Instant::now();
                if session.expires_at().is_some_and(|exp| Instant::from_std(exp) <= now) {
                    if let Some(req) = Box::pin(session.expire(now.into_std())).await {
                        break Some(req);
                    }
                }
                if next_ping <= now {
                    next_ping = now + ping_every;
                    let mut chunk = BytesMut::new();
                    encoder.ping(&mut chunk);
                    if !send(chunk.freeze()).await {
                        break None;
                    }
                }
            }
            changed = draining.changed() => {
                if changed.is_ok() && *draining.borrow() {
                    // Spread reconnects over the drain window, as on WebSocket.
                    let after_ms = rand::random_range(0..config.drain_ms.max(1));
                    out.close(CloseRequest { code: CloseCode::SHUTDOWN, reason: "server shutdown".into(), after_ms: Some(after_ms) });
                }
            }
            _ = tx.closed() => break None, // the client went away
        }
    };
    if let Some(req) = close {
        let mut chunk = BytesMut::new();
        encoder.disconnect(&req, &mut chunk);
        let _ = send(chunk.freeze()).await;
    }
    Box::pin(session.end()).await;
}
