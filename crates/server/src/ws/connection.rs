//! One WebSocket connection's task, as a [`Connection`] whose [`run`](Connection::run) waits for
//! the next event and hands it to one method: a wakeup of the outbound queue
//! ([`on_outbound`](Connection::on_outbound)), a message from the client
//! ([`on_message`](Connection::on_message)), a timer ([`on_deadline`](Connection::on_deadline):
//! the handshake deadline, pings and pongs, token expiry), the node starting to drain
//! ([`on_drain`](Connection::on_drain)). Each returns a [`Step`]: serve on, or how the
//! connection [`End`]s; [`end`](Connection::end) then closes it and the session leaves.
//!
//! One task (not a reader and a writer) keeps an idle connection small: no second task, no
//! channel. The outbound queue is drained whenever it is woken; several queued frames go out
//! newline-joined in one WebSocket message and one flush. The fan-out writes publications itself
//! where the socket takes them at once, through the same codec (super::shared), and wakes the
//! task only for what it could not finish.
//!
//! Memory: the task's future lives as long as the connection, and an async fn's state is as large
//! as its largest await point. So the deep or rarely taken paths (commands, controls, timers, the
//! close) are boxed, and an idle connection's future holds the connection, the four futures
//! [`next_event`](Connection::next_event) waits on, and little more (`task_stays_small` guards
//! its size).
//!
//! The timer is kept from one wait to the next, not made anew per event: a wait that ends for a
//! queued frame would otherwise take its timer out of the runtime's timer wheel and put a new one
//! in (under the wheel's lock), once per delivery. (Keeping the drain signal's wait the same way
//! measured no gain: its boxed future cost as much to poll as rejoining its waiters.)

use std::future::Future;
use std::ops::ControlFlow::{self, Break, Continue};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_core::outbound::CloseRequest;
use herald_core::proxy::ClientMeta;
use herald_core::{Outbound, Session};
use herald_protocol::encode::push_disconnect;
use herald_protocol::CloseCode;
use tokio::io::ReadBuf;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Sleep};
use tokio_websockets::Message;

use super::shared::{messages, SharedWs};
use super::{close_request, dispatch, handle_text};
use crate::guard::IpSlot;
use crate::handshake::{close_and_wait, Ws};
use crate::liveness::Liveness;
use crate::state::App;

/// What the connection does after an event: serve on, or end.
type Step = ControlFlow<End>;

/// What woke the connection's task.
enum Event {
    /// Something was queued for the client (frames, controls, a close request).
    Outbound,
    /// A message from the client, a codec error, or the end of its input.
    Message(Option<Result<Message, tokio_websockets::Error>>),
    /// A timer's deadline passed.
    Deadline,
    /// The drain flag changed (`changed`: false when its sender is gone).
    Drain { changed: bool },
}

/// How a connection ends.
enum End {
    /// Write these queued frames, the `disconnect` push and the close frame.
    Close(Vec<Bytes>, CloseRequest),
    /// The codec queued a close frame: its answer to the client's close, or its own after
    /// refusing the input (1009 too large, 1002 a WebSocket protocol error): send it.
    Linger,
    /// Nothing more can be said: the client closed or left, or stopped reading.
    Gone,
}

/// End with `code`, without the frames still queued.
fn close(code: CloseCode, reason: &str) -> Step {
    Break(End::Close(Vec::new(), close_request(code, reason)))
}

/// One WebSocket connection's state. See the module docs.
pub(super) struct Connection {
    app: Arc<App>,
    ws: SharedWs,
    session: Session,
    /// The session's outbound queue: what the hub and the session queue for the client.
    out: Arc<Outbound>,
    liveness: Liveness,
    /// Fires at `liveness`'s deadline; reset only when that deadline moves.
    timer: Pin<Box<Sleep>>,
    draining: watch::Receiver<bool>,
    _counted: Counted,
    _direct: DirectGuard,
    /// The connection's place in `limits.max_connections_per_ip`, while it lives.
    _ip_slot: Option<Arc<IpSlot>>,
}

impl Connection {
    /// A connection just upgraded, counted from now on.
    pub(super) fn new(
        app: Arc<App>,
        ws: Ws,
        meta: Option<Box<ClientMeta>>,
        ip_slot: Option<Arc<IpSlot>>,
    ) -> Self {
        let config = &app.ctx.config;
        let out = Arc::new(Outbound::new(config.limits.outbound_queue_bytes));
        let ws = SharedWs::new(ws);
        out.set_direct(Some(ws.direct()));
        let mut session = Session::new(app.ctx.clone(), out.clone());
        if let Some(meta) = meta {
            session.set_client_meta(*meta);
        }
        Connection {
            _counted: Counted::new(app.clone()),
            _direct: DirectGuard(out.clone()),
            _ip_slot: ip_slot,
            liveness: Liveness::new(config),
            timer: Box::pin(sleep_until(tokio::time::Instant::now())),
            draining: app.draining.clone(),
            app,
            ws,
            session,
            out,
        }
    }

    /// Serve the connection until it ends.
    ///
    /// Not an `async fn`: an async fn's future holds its arguments twice (rust-lang/rust#62958),
    /// and this argument is the whole connection.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn run(mut self) -> impl Future<Output = ()> {
        async move {
            let end = loop {
                let step = match self.next_event().await {
                    Event::Outbound => Box::pin(self.on_outbound()).await,
                    Event::Message(incoming) => self.on_message(incoming).await,
                    Event::Deadline => Box::pin(self.on_deadline()).await,
                    Event::Drain { changed } => self.on_drain(changed),
                };
                if let Break(end) = step {
                    break end;
                }
            };
            // Boxed: it is needed once, and inline it would add its state to every connection's.
            Box::pin(self.end(end)).await;
        }
    }

    /// Wait for the next event. The outbound queue goes first: what is queued goes out before
    /// the next command is read.
    async fn next_event(&mut self) -> Event {
        let deadline = self.liveness.deadline(&self.session);
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        tokio::select! {
            biased;
            _ = self.out.ready() => Event::Outbound,
            incoming = self.ws.next() => Event::Message(incoming),
            _ = self.timer.as_mut() => Event::Deadline,
            changed = self.draining.changed() => Event::Drain { changed: changed.is_ok() },
        }
    }

    /// Something was queued: act on the controls, then close if asked to, or write the frames.
    async fn on_outbound(&mut self) -> Step {
        let drained = self.out.drain();
        if drained.busy {
            // The fan-out is writing; it wakes the task again when it is done.
            return Continue(());
        }
        if !drained.controls.is_empty() {
            Box::pin(self.session.handle_controls(drained.controls)).await;
        }
        if let Some(req) = drained.close {
            self.count_slow_consumer(Some(&req));
            return Break(End::Close(drained.frames, req));
        }
        let limit = self.write_timeout();
        let written = if drained.frames.is_empty() && drained.needs_flush {
            flush(&mut self.ws, limit).await
        } else {
            write_batch(&mut self.ws, drained.frames, limit).await
        };
        self.out.written();
        match written {
            Ok(()) => Continue(()),
            Err(()) => Break(self.write_failed()),
        }
    }

    /// A message from the client, a codec error, or the end of its input.
    async fn on_message(
        &mut self,
        incoming: Option<Result<Message, tokio_websockets::Error>>,
    ) -> Step {
        let message = match incoming {
            Some(Ok(m)) => m,
            Some(Err(_)) => return Break(End::Linger),
            // Reset or EOF.
            None => return Break(End::Gone),
        };
        if message.is_close() {
            // The codec queued the close frame that answers the client's (RFC 6455 5.5.1).
            return Break(End::Linger);
        }
        // WebSocket pings and pongs do not answer our ping: only a message does, so a client
        // cannot hold a never-finished fragmented message open with pings.
        if message.is_ping() || message.is_pong() {
            return Continue(());
        }
        self.liveness.heard();
        let Some(text) = message.as_text() else {
            return close(
                CloseCode::BAD_REQUEST,
                "binary frames are not part of the protocol",
            );
        };
        if text.len() > self.app.ctx.config.limits.max_frame_bytes {
            return close(CloseCode::MESSAGE_TOO_LARGE, "message too large");
        }
        if self.session.is_connected() {
            return Box::pin(self.dispatch_writing(text)).await;
        }
        // `connect` is answered as a whole: the connection limit may still refuse it, and then
        // none of its frames go out.
        match Box::pin(handle_text(&self.app, &mut self.session, &self.out, text)).await {
            Some((frames, req)) => Break(End::Close(frames, req)),
            None => Continue(()),
        }
    }

    /// Run a connected client's message while writing what is queued for the connection
    /// meanwhile: a command waiting for the application's backend (a proxy hook) must not hold
    /// back the connection's publications. Controls and a close request wait in the queue until
    /// the command is done (they need the session, which the command holds); the task is woken
    /// for them afterwards.
    async fn dispatch_writing(&mut self, text: &str) -> Step {
        let limit = self.write_timeout();
        let mut write_failed = false;
        let close = {
            let dispatching = dispatch(&mut self.session, text);
            tokio::pin!(dispatching);
            loop {
                tokio::select! {
                    biased;
                    close = &mut dispatching => break close,
                    _ = self.out.ready(), if !write_failed => {
                        if let Some(frames) = self.out.drain_frames() {
                            write_failed = write_batch(&mut self.ws, frames, limit).await.is_err();
                            self.out.written();
                        }
                    }
                }
            }
        };
        self.out.wake();
        if write_failed {
            return Break(self.write_failed());
        }
        match close {
            Some(req) => Break(End::Close(self.out.drain().frames, req)),
            None => Continue(()),
        }
    }

    /// The timers' deadline passed: close (handshake, pong or token too late), or ping.
    async fn on_deadline(&mut self) -> Step {
        match self.liveness.on_timer(&mut self.session, &self.out).await {
            Some((frames, req)) => Break(End::Close(frames, req)),
            None => Continue(()),
        }
    }

    /// The node started draining: ask the client to reconnect elsewhere, each after a random
    /// delay within the drain window, so that reconnects spread instead of arriving as one herd.
    /// The close request goes through the queue, after what is queued before it.
    fn on_drain(&mut self, changed: bool) -> Step {
        if changed && *self.draining.borrow() {
            let after_ms = rand::random_range(0..self.app.ctx.config.drain_ms.max(1));
            self.out.close(CloseRequest {
                code: CloseCode::SHUTDOWN,
                reason: "server shutdown".into(),
                after_ms: Some(after_ms),
            });
        }
        Continue(())
    }

    /// Close the connection as `end` says, then end the session (it leaves its channels).
    /// Not an `async fn` for the reason [`run`](Self::run) is not.
    #[allow(clippy::manual_async_fn)]
    fn end(mut self, end: End) -> impl Future<Output = ()> {
        async move {
            // The fan-out writes nothing more, and the queue no longer holds the socket.
            self.out.set_direct(None);
            let limit = self.write_timeout();
            match end {
                End::Close(frames, req) => finish(&mut self.ws, frames, &req, limit).await,
                End::Linger => linger(&mut self.ws, limit).await,
                End::Gone => {}
            }
            self.session.end().await;
        }
    }

    /// A write timed out or failed. A client that stopped reading blocks the write until it
    /// times out, and its queue overflows meanwhile: it is a slow consumer even though the jammed
    /// socket cannot carry the 4001 any more.
    fn write_failed(&self) -> End {
        self.count_slow_consumer(self.out.drain().close.as_ref());
        End::Gone
    }

    fn count_slow_consumer(&self, close: Option<&CloseRequest>) {
        if close.is_some_and(|req| req.code == CloseCode::SLOW_CONSUMER) {
            self.app.ctx.hub.metrics().slow_consumers.inc();
        }
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.app.ctx.config.limits.write_timeout_ms)
    }
}

/// Takes the direct writer back from the queue however the task ends (cancelled with the runtime,
/// too): the hub may hold the queue a while longer, and must not keep the socket open through it.
struct DirectGuard(Arc<Outbound>);

impl Drop for DirectGuard {
    fn drop(&mut self) {
        self.0.set_direct(None);
    }
}

/// Counts the connection while it lives.
struct Counted(Arc<App>);

impl Counted {
    fn new(app: Arc<App>) -> Self {
        app.ws_connections.fetch_add(1, Ordering::Relaxed);
        let metrics = app.ctx.hub.metrics();
        metrics.connections.inc();
        metrics.connections_accepted.inc();
        Counted(app)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.ws_connections.fetch_sub(1, Ordering::Relaxed);
        self.0.ctx.hub.metrics().connections.dec();
    }
}

/// Write queued frames as [`messages`] makes them, then one flush.
async fn write_batch(ws: &mut SharedWs, frames: Vec<Bytes>, limit: Duration) -> Result<(), ()> {
    if frames.is_empty() {
        return Ok(());
    }
    let compress = ws.compression();
    let write = async {
        for message in messages(frames, compress) {
            ws.feed(message).await?;
        }
        ws.flush().await
    };
    match timeout(limit, write).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// Flush what a direct write left in the codec's buffer.
async fn flush(ws: &mut SharedWs, limit: Duration) -> Result<(), ()> {
    match timeout(limit, ws.flush()).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// Flush the close frame the codec queued, then read off what the peer still sends (the rest of
/// an oversized frame) for a moment: closing a socket with unread input resets the connection,
/// and the peer would lose the close frame.
async fn linger(ws: &mut SharedWs, limit: Duration) {
    if flush(ws, limit).await.is_err() {
        return;
    }
    let _ = timeout(Duration::from_secs(1), async {
        let _ = std::future::poll_fn(|cx| ws.poll_shutdown(cx)).await;
        // On the heap: an array here would live in every connection's task state.
        let mut buf = vec![0u8; 8192];
        loop {
            let mut read = ReadBuf::new(&mut buf);
            match std::future::poll_fn(|cx| ws.poll_read(cx, &mut read)).await {
                Ok(()) if !read.filled().is_empty() => {}
                _ => break,
            }
        }
    })
    .await;
}

/// Send what is queued, the `disconnect` push and the close frame; wait briefly for the peer's
/// close so that it sees a clean closing handshake.
async fn finish(ws: &mut SharedWs, mut frames: Vec<Bytes>, req: &CloseRequest, limit: Duration) {
    frames.push(push_disconnect(req.code, &req.reason, req.after_ms));
    if write_batch(ws, frames, limit).await.is_err() {
        return;
    }
    close_and_wait(ws, req.code.0, &req.reason, limit).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Largest allowed size of the idle connection's task state. Measured 808 bytes with Rust
    /// 1.95 (1,136 while the WebSocket stream lived in it and the timer was made anew in each
    /// wait, 1,704 before the task became a `Connection`).
    const MAX_TASK_BYTES: usize = 832;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, F: Future>(_: fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every idle connection keeps its task's future: growing it is memory per connection.
    #[test]
    fn task_stays_small() {
        let size = future_size(Connection::run);
        assert!(
            size <= MAX_TASK_BYTES,
            "the connection task's future is {size} bytes (at most {MAX_TASK_BYTES}): box state \
             that only a rare path needs, or measure idle memory and raise the limit"
        );
    }
}
