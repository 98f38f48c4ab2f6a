//! One SSE or NDJSON connection as the engine drives it (crate::engine): Herald's protocol, with
//! one-way timers (pings, token expiry; no pongs), over a transport that encodes the session's
//! frames as SSE events or NDJSON lines ([`super::format`]) and whose only input is the client
//! going away.
//!
//! The body goes to a [`Sink`]: hyper's response body through a small bounded channel
//! ([`Channel`]), or the raw socket as HTTP/1.1 chunks ([`Socket`], for the streams
//! [`super::direct`] took over from hyper). A client that stops reading blocks the write until
//! `limits.write_timeout_ms` passes and the connection ends; meanwhile the outbound queue's byte
//! limit closes it as a slow consumer (4001) as on WebSocket.

use std::future::Future;
use std::ops::ControlFlow::Break;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use herald_core::outbound::CloseRequest;
use herald_core::{Outbound, Session};
use herald_protocol::encode::PING;
use herald_protocol::CloseCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::format::{Encoder, Format};
use crate::engine::driver::Driver;
use crate::engine::herald::Herald;
use crate::engine::liveness::Liveness;
use crate::engine::policy::timed;
use crate::engine::{Closing, End, Parts, Serve, Step, Transport, Written};
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
pub(crate) trait Sink: Send {
    /// Write one chunk; false once the client stopped reading (the write timed out) or left.
    fn send(&mut self, chunk: Bytes) -> impl Future<Output = bool> + Send;
    /// Resolves when the client went away.
    fn gone(&mut self) -> impl Future<Output = ()> + Send;
    /// The body ends.
    fn finish(&mut self) -> impl Future<Output = ()> + Send;
}

/// Hyper's response body, fed through a channel.
pub(crate) struct Channel {
    /// `None` once the body ended.
    tx: Option<mpsc::Sender<Bytes>>,
    write_limit: Duration,
}

impl Channel {
    pub(crate) fn new(tx: mpsc::Sender<Bytes>, write_limit: Duration) -> Self {
        Channel {
            tx: Some(tx),
            write_limit,
        }
    }
}

impl Sink for Channel {
    async fn send(&mut self, chunk: Bytes) -> bool {
        match &self.tx {
            Some(tx) => timed(self.write_limit, tx.send(chunk)).await,
            None => false,
        }
    }

    async fn gone(&mut self) {
        match &self.tx {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }

    /// Dropping the sender ends hyper's body.
    async fn finish(&mut self) {
        self.tx = None;
    }
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
        timed(self.write_limit, write).await
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
    async fn finish(&mut self) {
        if self.write(b"0\r\n\r\n").await {
            let _ = timeout(self.write_limit, self.io.shutdown()).await;
        }
    }
}

/// Counts the connection while it lives, per transport.
struct Counted(Arc<App>, Format);

/// The open-connection counter of `format`'s transport.
fn open_count(app: &App, format: Format) -> &AtomicUsize {
    match format {
        Format::Sse => &app.sse_connections,
        Format::Ndjson => &app.ndjson_connections,
    }
}

impl Counted {
    fn new(app: Arc<App>, format: Format) -> Self {
        open_count(&app, format).fetch_add(1, Ordering::Relaxed);
        app.ctx.hub.metrics().connections.inc();
        app.ctx.hub.metrics().connections_accepted.inc();
        Counted(app, format)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        open_count(&self.0, self.1).fetch_sub(1, Ordering::Relaxed);
        self.0.ctx.hub.metrics().connections.dec();
    }
}

/// A one-way stream's transport: the encoder and where its bytes go.
pub(crate) struct OneWay<S> {
    sink: S,
    encoder: Encoder,
    _counted: Counted,
    _ip_slot: Option<Arc<IpSlot>>,
}

impl<S: Sink> OneWay<S> {
    /// Encode `frames` into `chunk`: the close the first of them calls for, if any.
    fn encode(&mut self, frames: &[Bytes], chunk: &mut BytesMut) -> Option<CloseRequest> {
        let mut end = None;
        for frame in frames {
            if &frame[..] == PING {
                self.encoder.ping(chunk);
            } else if let Some(req) = self.encoder.push(frame, chunk) {
                end = end.or(Some(req));
            }
        }
        end
    }
}

impl<S: Sink> Transport for OneWay<S> {
    /// The client went away: a one-way stream's client sends nothing else.
    type Input = ();

    fn next_input(&mut self) -> impl Future<Output = ()> + Send {
        self.sink.gone()
    }

    async fn write(&mut self, frames: Vec<Bytes>, _limit: Duration) -> Written {
        let mut chunk = BytesMut::new();
        let end = self.encode(&frames, &mut chunk);
        // Not boxed: the driver boxes the whole outbound step.
        if !chunk.is_empty() && !self.sink.send(chunk.freeze()).await {
            return Written::Failed; // the client stopped reading or went away
        }
        match end {
            Some(req) => Written::Close(req),
            None => Written::Done,
        }
    }

    /// Spread reconnects over the drain window, as on WebSocket, past a floor: SSE's `retry:`
    /// outlives this stream (see `format::drain_after_ms`).
    fn drain_after_ms(app: &App) -> Option<u64> {
        Some(super::format::drain_after_ms(app.ctx.config.drain_ms))
    }

    /// The frames, then the stream's own `disconnect` (an SSE event with `retry:`, or the
    /// NDJSON line), in one chunk.
    async fn close(&mut self, frames: Vec<Bytes>, closing: Closing<'_>, _limit: Duration) {
        let mut chunk = BytesMut::new();
        self.encode(&frames, &mut chunk);
        let req = CloseRequest {
            code: CloseCode(closing.code),
            reason: closing.reason.to_owned(),
            after_ms: closing.after_ms,
        };
        self.encoder.disconnect(&req, &mut chunk);
        let _ = self.sink.send(chunk.freeze()).await;
    }

    async fn finish(&mut self, _limit: Duration) {
        self.sink.finish().await
    }
}

impl<S: Sink> Serve<OneWay<S>> for Herald {
    async fn on_input(&mut self, _: Parts<'_, OneWay<S>>, _gone: ()) -> Step<CloseRequest> {
        Break(End::Gone)
    }
}

/// The connection's task: it runs until the connection ends.
///
/// Not an `async fn`: an async fn's future holds its arguments beside what it awaits
/// (rust-lang/rust#62958), and this task lives as long as the stream.
pub(crate) fn run(
    app: Arc<App>,
    stream: Stream,
    sink: impl Sink,
) -> impl Future<Output = ()> + Send {
    let Stream {
        session,
        out,
        encoder,
        end,
        format,
        ip_slot,
    } = stream;
    if let Some(req) = end {
        out.close(req);
    }
    let herald = Herald {
        session,
        liveness: Liveness::one_way(&app.ctx.config),
    };
    let transport = OneWay {
        sink,
        encoder,
        _counted: Counted::new(app.clone(), format),
        _ip_slot: ip_slot,
    };
    Driver::new(app, transport, herald, out).run()
}
