//! The task of one emulated connection: the WebSocket connection loop (see `crate::ws`) with
//! messages read from the session's inbox instead of a socket, and frames written as SSE events.
//!
//! Down the stream: `event: session` first (the id to post to), then each server frame as an
//! unnamed event whose data is the frame, exactly as WebSocket would carry it, and at the end
//! `event: close` with `{"code", "reason"}`, the WebSocket close frame's equivalent.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use herald_core::outbound::CloseRequest;
use herald_core::proxy::ClientMeta;
use herald_core::{Outbound, Session};
use herald_protocol::encode::push_disconnect;
use herald_protocol::CloseCode;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout};

use super::{Inbound, Registered};
use crate::guard::IpSlot;
use crate::liveness::Liveness;
use crate::state::App;
use crate::ws::{close_request, handle_text};

/// Counts the connection while it lives.
struct Counted(Arc<App>);

impl Counted {
    fn new(app: Arc<App>) -> Self {
        app.emulated_connections.fetch_add(1, Ordering::Relaxed);
        app.ctx.hub.metrics().connections.inc();
        app.ctx.hub.metrics().connections_accepted.inc();
        Counted(app)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.emulated_connections.fetch_sub(1, Ordering::Relaxed);
        self.0.ctx.hub.metrics().connections.dec();
    }
}

/// Append `frame` as one SSE event. Frames are single-line JSON, so one `data:` line holds one.
fn event(out: &mut BytesMut, frame: &[u8]) {
    out.put_slice(b"data: ");
    out.put_slice(frame);
    out.put_slice(b"\n\n");
}

fn close_event(out: &mut BytesMut, req: &CloseRequest) {
    let close = serde_json::json!({"code": req.code.0, "reason": req.reason});
    out.put_slice(format!("event: close\ndata: {close}\n\n").as_bytes());
}

/// Run the connection until it ends.
pub(crate) async fn run(
    app: Arc<App>,
    _registered: Registered,
    mut inbox: mpsc::Receiver<Inbound>,
    tx: mpsc::Sender<Bytes>,
    ip_slot: Option<Arc<IpSlot>>,
    meta: Option<ClientMeta>,
) {
    let _ip_slot = ip_slot;
    let _counted = Counted::new(app.clone());
    let metrics = app.ctx.hub.metrics().clone();
    let config = app.ctx.config.clone();
    let limits = &config.limits;
    let write_limit = Duration::from_millis(limits.write_timeout_ms);
    let out = Arc::new(Outbound::new(limits.outbound_queue_bytes));
    let mut session = Session::new(app.ctx.clone(), out.clone());
    if let Some(meta) = meta {
        session.set_client_meta(meta);
    }
    let mut draining = app.draining.clone();
    let mut liveness = Liveness::new(&config);
    let send = |chunk: Bytes| {
        let tx = tx.clone();
        async move { matches!(timeout(write_limit, tx.send(chunk)).await, Ok(Ok(()))) }
    };

    let close = loop {
        let deadline = liveness.deadline(&session);
        tokio::select! {
            biased;
            _ = out.ready() => {
                let drained = out.drain();
                if !drained.controls.is_empty() {
                    Box::pin(session.handle_controls(drained.controls)).await;
                }
                if let Some(req) = drained.close {
                    if req.code == CloseCode::SLOW_CONSUMER {
                        metrics.slow_consumers.inc();
                    }
                    break Some((drained.frames, req));
                }
                let mut chunk = BytesMut::new();
                for frame in &drained.frames {
                    event(&mut chunk, frame);
                }
                if !chunk.is_empty() && !send(chunk.freeze()).await {
                    break None; // the client stopped reading or went away
                }
            }
            inbound = inbox.recv() => {
                let text = match inbound {
                    Some(Inbound::Text(text)) => text,
                    Some(Inbound::TooLarge) => {
                        break Some((Vec::new(), close_request(CloseCode::MESSAGE_TOO_LARGE, "message too large")));
                    }
                    None => break None,
                };
                liveness.heard();
                if let Some(close) = Box::pin(handle_text(&app, &mut session, &out, &text)).await {
                    break Some(close);
                }
            }
            _ = sleep_until(deadline) => {
                if let Some(close) = Box::pin(liveness.on_timer(&mut session, &out)).await {
                    break Some(close);
                }
            }
            changed = draining.changed() => {
                if changed.is_ok() && *draining.borrow() {
                    let after_ms = rand::random_range(0..config.drain_ms.max(1));
                    out.close(CloseRequest { code: CloseCode::SHUTDOWN, reason: "server shutdown".into(), after_ms: Some(after_ms) });
                }
            }
            _ = tx.closed() => break None, // the client went away
        }
    };
    if let Some((frames, req)) = close {
        let mut chunk = BytesMut::new();
        for frame in &frames {
            event(&mut chunk, frame);
        }
        event(
            &mut chunk,
            &push_disconnect(req.code, &req.reason, req.after_ms),
        );
        close_event(&mut chunk, &req);
        let _ = send(chunk.freeze()).await;
    }
    Box::pin(session.end()).await;
}
