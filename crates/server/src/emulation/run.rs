//! An emulated connection as the engine drives it (crate::engine): Herald's protocol, as on
//! WebSocket, over a transport whose messages come from the session's inbox (the `POST`s) and
//! whose frames go down as SSE events.
//!
//! Down the stream: `event: session` first (the id to post to), then each server frame as an
//! unnamed event whose data is the frame, exactly as WebSocket would carry it, and at the end
//! `event: close` with `{"code", "reason"}`, the WebSocket close frame's equivalent.

use std::future::Future;
use std::ops::ControlFlow::Break;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use herald_core::outbound::CloseRequest;
use herald_core::proxy::ClientMeta;
use herald_core::{Outbound, Session};
use herald_protocol::CloseCode;
use tokio::sync::mpsc;

use super::{Inbound, Registered};
use crate::engine::driver::Driver;
use crate::engine::herald::{close, Herald};
use crate::engine::liveness::Liveness;
use crate::engine::policy::timed;
use crate::engine::{Closing, End, Parts, Serve, Step, Transport, Written};
use crate::guard::IpSlot;
use crate::state::App;

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

fn close_event(out: &mut BytesMut, code: u16, reason: &str) {
    let close = serde_json::json!({"code": code, "reason": reason});
    out.put_slice(format!("event: close\ndata: {close}\n\n").as_bytes());
}

/// The emulated connection's transport: the inbox up, the response body down.
pub(crate) struct Emulated {
    inbox: mpsc::Receiver<Inbound>,
    tx: mpsc::Sender<Bytes>,
    _registered: Registered,
    _counted: Counted,
    _ip_slot: Option<Arc<IpSlot>>,
}

impl Emulated {
    async fn send(&self, chunk: Bytes, limit: Duration) -> bool {
        timed(limit, self.tx.send(chunk)).await
    }
}

impl Transport for Emulated {
    /// A `POST`'s message; `None` once the client went away.
    type Input = Option<Inbound>;

    fn next_input(&mut self) -> impl Future<Output = Option<Inbound>> + Send {
        let (inbox, tx) = (&mut self.inbox, &self.tx);
        async move {
            tokio::select! {
                biased;
                inbound = inbox.recv() => inbound,
                _ = tx.closed() => None,
            }
        }
    }

    async fn write(&mut self, frames: Vec<Bytes>, limit: Duration) -> Written {
        let mut chunk = BytesMut::new();
        for frame in &frames {
            event(&mut chunk, frame);
        }
        match self.send(chunk.freeze(), limit).await {
            true => Written::Done,
            false => Written::Failed,
        }
    }

    async fn close(&mut self, frames: Vec<Bytes>, closing: Closing<'_>, limit: Duration) {
        let mut chunk = BytesMut::new();
        for frame in &frames {
            event(&mut chunk, frame);
        }
        event(&mut chunk, &closing.words);
        close_event(&mut chunk, closing.code, closing.reason);
        let _ = self.send(chunk.freeze(), limit).await;
    }
}

impl Serve<Emulated> for Herald {
    async fn on_input(
        &mut self,
        parts: Parts<'_, Emulated>,
        inbound: Option<Inbound>,
    ) -> Step<CloseRequest> {
        match inbound {
            Some(Inbound::Text(text)) => self.on_text(parts, &text).await,
            Some(Inbound::TooLarge) => close(CloseCode::MESSAGE_TOO_LARGE, "message too large"),
            None => Break(End::Gone),
        }
    }
}

/// The connection's task: it runs until the connection ends.
///
/// Not an `async fn`: an async fn's future holds its arguments beside what it awaits
/// (rust-lang/rust#62958), and this task lives as long as the connection.
pub(crate) fn run(
    app: Arc<App>,
    registered: Registered,
    inbox: mpsc::Receiver<Inbound>,
    tx: mpsc::Sender<Bytes>,
    ip_slot: Option<Arc<IpSlot>>,
    meta: Option<ClientMeta>,
) -> impl Future<Output = ()> + Send {
    let config = &app.ctx.config;
    let out = Arc::new(Outbound::new(config.limits.outbound_queue_bytes));
    let mut session = Session::new(app.ctx.clone(), out.clone());
    if let Some(meta) = meta {
        session.set_client_meta(meta);
    }
    let herald = Herald {
        session,
        liveness: Liveness::new(config),
    };
    let transport = Emulated {
        inbox,
        tx,
        _registered: registered,
        _counted: Counted::new(app.clone()),
        _ip_slot: ip_slot,
    };
    Driver::new(app, transport, herald, out).run()
}
