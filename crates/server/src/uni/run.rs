//! The task of one SSE or NDJSON connection: drain the session's queue into the response body,
//! ping, expire tokens, drain on shutdown, and stop when the client goes away.
//!
//! The body goes to a [`Sink`]: hyper's response body through a small bounded channel
//! ([`Channel`]), or the raw socket as HTTP/1.1 chunks ([`Socket`], for the streams
//! [`super::direct`] took over from hyper). A client that stops reading blocks the write until
//! `limits.write_timeout_ms` passes and the connection ends; meanwhile the outbound queue's byte
//! limit closes it as a slow consumer (4001) as on WebSocket.
//!
//! The task lives as long as the connection, and an async fn's state is as large as its largest
//! await point: rarely taken, deep awaits are boxed (as in the WebSocket task).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use herald_core::outbound::CloseRequest;
use herald_core::{Outbound, Session};
use herald_protocol::CloseCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant};

use super::format::{Encoder, Format};
use crate::guard::IpSlot;
use crate::state::App;

/// What a stream's task runs: an accepted stream whose first chunk is already on its way.
pub(crate) struct Stream {
    pub session: Session,
    pub out: Arc<Outbound>,
    pub encoder: Encoder,
    /// A close decided while encoding the first chunk.
    pub end: Option<CloseRequest>,
    pub format: Format,
    pub ip_slot: Option<Arc<IpSlot>>,
}

/// Where a stream's body goes.
pub(crate) trait Sink {
    /// Write one chunk; false once the client stopped reading (the write timed out) or left.
    async fn send(&mut self, chunk: Bytes) -> bool;
    /// Resolves when the client went away.
    async fn gone(&mut self);
    /// The body ends.
    async fn finish(self);
}

/// Hyper's response body, fed through a channel.
pub(crate) struct Channel {
    tx: mpsc::Sender<Bytes>,
    write_limit: Duration,
}

impl Channel {
    pub(crate) fn new(tx: mpsc::Sender<Bytes>, write_limit: Duration) -> Self {
        Channel { tx, write_limit }
    }
}

impl Sink for Channel {
    async fn send(&mut self, chunk: Bytes) -> bool {
        matches!(
            timeout(self.write_limit, self.tx.send(chunk)).await,
            Ok(Ok(()))
        )
    }

    async fn gone(&mut self) {
        self.tx.closed().await
    }

    /// Dropping the sender ends hyper's body.
    async fn finish(self) {}
}

/// The raw connection, after the response head: the body as HTTP/1.1 chunks.
pub(crate) struct Socket<S> {
    io: S,
    write_limit: Duration,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Socket<S> {
    pub(crate) fn new(io: S, write_limit: Duration) -> Self {
        Socket { io, write_limit }
    }

    async fn write(&mut self, bytes: &[u8]) -> bool {
        let write = async {
            self.io.write_all(bytes).await?;
            self.io.flush().await // TLS: the record may still sit in rustls's buffer
        };
        matches!(timeout(self.write_limit, write).await, Ok(Ok(())))
    }
}

/// `chunk` framed as one HTTP/1.1 chunk.
pub(crate) fn chunked(chunk: &[u8]) -> BytesMut {
    use std::fmt::Write;
    let mut framed = BytesMut::with_capacity(chunk.len() + 20);
    let _ = write!(framed, "{:x}\r\n", chunk.len());
    framed.put_slice(chunk);
    framed.put_slice(b"\r\n");
    framed
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Sink for Socket<S> {
    async fn send(&mut self, chunk: Bytes) -> bool {
        if chunk.is_empty() {
            return true; // an empty chunk would end the body
        }
        self.write(&chunked(&chunk)).await
    }

    /// A one-way stream's client sends nothing after its request: whatever it sends is read
    /// and dropped, and EOF or an error means it left.
    async fn gone(&mut self) {
        let mut scrap = [0u8; 64];
        while let Ok(1..) = self.io.read(&mut scrap).await {}
    }

    /// The last chunk, then close: this connection serves no further request.
    async fn finish(mut self) {
        if self.write(b"0\r\n\r\n").await {
            let _ = timeout(self.write_limit, self.io.shutdown()).await;
        }
    }
}

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

/// Run the connection until it ends.
pub(crate) async fn run(app: Arc<App>, stream: Stream, mut sink: impl Sink) {
    let Stream {
        mut session,
        out,
        mut encoder,
        mut end,
        format,
        ip_slot,
    } = stream;
    let _ip_slot = ip_slot;
    let _counted = Counted::new(app.clone(), format);
    let config = app.ctx.config.clone();
    let ping_every = Duration::from_secs(config.ping_interval_s);
    let mut next_ping = Instant::now() + ping_every;
    let mut draining = app.draining.clone();

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
                    let _ = Box::pin(sink.send(chunk.freeze())).await;
                    break None;
                }
                if !chunk.is_empty() && !Box::pin(sink.send(chunk.freeze())).await {
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
                    if !Box::pin(sink.send(chunk.freeze())).await {
                        break None;
                    }
                }
            }
            changed = draining.changed() => {
                if changed.is_ok() && *draining.borrow() {
                    // Spread reconnects over the drain window, as on WebSocket, past a floor:
                    // SSE's `retry:` outlives this stream (see `format::drain_after_ms`).
                    let after_ms = super::format::drain_after_ms(config.drain_ms);
                    out.close(CloseRequest { code: CloseCode::SHUTDOWN, reason: "server shutdown".into(), after_ms: Some(after_ms) });
                }
            }
            _ = sink.gone() => break None, // the client went away
        }
    };
    if let Some(req) = close {
        let mut chunk = BytesMut::new();
        encoder.disconnect(&req, &mut chunk);
        let _ = Box::pin(sink.send(chunk.freeze())).await;
    }
    Box::pin(sink.finish()).await;
    Box::pin(session.end()).await;
}
