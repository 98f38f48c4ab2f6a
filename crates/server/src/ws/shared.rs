//! A WebSocket shared by its connection's task and the fan-out, which writes publications to it
//! directly when the socket takes them at once (herald_core::outbound, "Direct writes").
//!
//! Both sides go through the same codec and its write buffer, so bytes leave in the order they
//! were handed to it (a pong the codec queues while reading included). The lock is held for one
//! poll at a time, never across an await, so neither side waits on the other's socket; the
//! fan-out only tries it and never waits.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use herald_core::outbound::{DirectWrite, Flushed};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_websockets::{Error, Message};

use crate::compression;
use crate::handshake::Ws;

/// Largest batch of newline-joined frames in one WebSocket message.
pub(crate) const BATCH_BYTES: usize = 64 * 1024;

/// The WebSocket behind its lock: what the fan-out writes through.
pub(crate) struct Locked(Mutex<Ws>);

/// The connection task's handle on its WebSocket: a stream of messages and a sink for them, as
/// the codec itself is.
pub(crate) struct SharedWs(Arc<Locked>);

impl SharedWs {
    pub(crate) fn new(ws: Ws) -> Self {
        SharedWs(Arc::new(Locked(Mutex::new(ws))))
    }

    fn lock(&self) -> MutexGuard<'_, Ws> {
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer the fan-out uses for this connection.
    pub(crate) fn direct(&self) -> Arc<dyn DirectWrite> {
        self.0.clone()
    }

    /// The locked socket, for a direct writer that speaks another wire (crate::pusher::direct).
    #[cfg(feature = "pusher")]
    pub(crate) fn locked(&self) -> Arc<Locked> {
        self.0.clone()
    }

    /// Whether the client negotiated permessage-deflate.
    pub(crate) fn compression(&self) -> bool {
        self.lock().compression()
    }

    /// Shut down the socket's write side, below the codec.
    pub(crate) fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.lock().get_mut()).poll_shutdown(cx)
    }

    /// Write raw bytes to the socket, below the codec.
    #[cfg(feature = "pusher")]
    pub(crate) fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.lock().get_mut()).poll_write(cx, buf)
    }

    /// Read raw bytes from the socket, below the codec.
    pub(crate) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.lock().get_mut()).poll_read(cx, buf)
    }
}

impl Stream for SharedWs {
    type Item = Result<Message, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.lock().poll_next_unpin(cx)
    }
}

impl Sink<Message> for SharedWs {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.lock().poll_ready_unpin(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), Error> {
        self.lock().start_send_unpin(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.lock().poll_flush_unpin(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.lock().poll_close_unpin(cx)
    }
}

impl Locked {
    /// One poll with a waker that does nothing: if the codec is free and ready, hand it the
    /// messages `to_messages` makes of `frames` (told whether the client negotiated compression)
    /// and try to flush. Whatever the socket does not take stays in the codec's buffer, and the
    /// task (woken by the queue) flushes it with its own waker. `Err(frames)`: not taken at all.
    ///
    /// Callers keep a batch within [`BATCH_BYTES`]: it is handed over after one ready check
    /// (tokio-websockets' `start_send` queues without a limit; `poll_ready` is only its flush
    /// threshold).
    pub(crate) fn try_write_with(
        &self,
        frames: Vec<Bytes>,
        to_messages: impl FnOnce(Vec<Bytes>, bool) -> Vec<Message>,
    ) -> Result<Flushed, Vec<Bytes>> {
        let Ok(mut ws) = self.0.try_lock() else {
            return Err(frames);
        };
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        match ws.poll_ready_unpin(&mut cx) {
            Poll::Ready(Ok(())) => {}
            // A failed codec: the task's own write finds out and ends the connection.
            Poll::Ready(Err(_)) => return Ok(Flushed::Partly),
            Poll::Pending => return Err(frames),
        }
        let compress = ws.compression();
        for message in to_messages(frames, compress) {
            if ws.start_send_unpin(message).is_err() {
                return Ok(Flushed::Partly);
            }
        }
        match ws.poll_flush_unpin(&mut cx) {
            Poll::Ready(Ok(())) => Ok(Flushed::All),
            _ => Ok(Flushed::Partly),
        }
    }
}

impl DirectWrite for Locked {
    /// Herald's frames, as [`messages`] joins them.
    fn try_write(&self, frames: Vec<Bytes>) -> Result<Flushed, Vec<Bytes>> {
        // More than one message would need a ready check before each: leave those to the task.
        if frames.iter().map(|f| f.len() + 1).sum::<usize>() > BATCH_BYTES {
            return Err(frames);
        }
        self.try_write_with(frames, messages)
    }
}

/// Takes the direct writer back from the queue however the task ends (cancelled with the runtime,
/// too): the hub may hold the queue a while longer, and must not keep the socket open through it.
pub(crate) struct DirectGuard(pub(crate) Arc<herald_core::Outbound>);

impl Drop for DirectGuard {
    fn drop(&mut self) {
        self.0.set_direct(None);
    }
}

/// The WebSocket messages for queued frames: one frame as it is (its bytes are shared with other
/// subscribers), several newline-joined into messages of at most [`BATCH_BYTES`].
///
/// With compression, a lone frame is compressed once per fan-out (crate::compression caches it
/// by its shared bytes); a batch is this connection's own, so it is compressed here.
pub(super) fn messages(frames: Vec<Bytes>, compress: bool) -> Vec<Message> {
    if frames.len() == 1 {
        let frame = frames.into_iter().next().expect("one frame");
        return vec![compression::text(frame, compress, true)];
    }
    let mut out = Vec::new();
    let mut batch = BytesMut::new();
    for frame in frames {
        if !batch.is_empty() && batch.len() + 1 + frame.len() > BATCH_BYTES {
            out.push(compression::text(batch.split().freeze(), compress, false));
        }
        if !batch.is_empty() {
            batch.extend_from_slice(b"\n");
        }
        batch.extend_from_slice(&frame);
    }
    if !batch.is_empty() {
        out.push(compression::text(batch.freeze(), compress, false));
    }
    out
}
