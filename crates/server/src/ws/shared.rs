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

#[cfg(test)]
mod tests {
    //! The direct write on a real upgraded socket over loopback: what it takes, what it hands
    //! back, and that bytes it leaves in the codec's buffer (`Flushed::Partly`, polled with a
    //! waker that does nothing) reach the client complete and in order once the task flushes
    //! with its own waker.

    use std::convert::Infallible;
    use std::time::Duration;

    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::Request;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::timeout;
    use tokio_websockets::WebSocketStream;

    use super::*;
    use crate::handshake::{accept_value, serve, switching_protocols};

    const LIMIT: Duration = Duration::from_secs(10);

    /// A server-side `SharedWs` and the client at the other end of its socket.
    async fn pair() -> (SharedWs, WebSocketStream<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = Arc::new(Mutex::new(Some(tx)));
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let service = service_fn(move |mut req: Request<Incoming>| {
                let key = req.headers()[hyper::header::SEC_WEBSOCKET_KEY].clone();
                let on_upgrade = hyper::upgrade::on(&mut req);
                let tx = tx.lock().expect("sender").take();
                tokio::spawn(async move {
                    let upgraded = on_upgrade.await.expect("upgrade");
                    let ws = serve(upgraded, 1 << 20, false);
                    let _ = tx.expect("one upgrade").send(ws);
                });
                let answer = switching_protocols(&accept_value(key.as_bytes()), None, None);
                async move { Ok::<_, Infallible>(answer) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (client, _) = timeout(
            LIMIT,
            tokio_websockets::ClientBuilder::new()
                .uri(&format!("ws://{addr}/ws"))
                .expect("uri")
                .connect_on(stream),
        )
        .await
        .expect("the handshake did not finish within 10 s")
        .expect("handshake");
        let ws = timeout(LIMIT, rx)
            .await
            .expect("the upgrade did not finish within 10 s")
            .expect("upgraded");
        (SharedWs::new(ws), client)
    }

    /// Batch `n`: 16 frames of ~3 KB (48 KB, within [`BATCH_BYTES`]), each naming its place.
    fn batch(n: usize) -> Vec<Bytes> {
        (0..16)
            .map(|i| Bytes::from(format!("{n}:{i}:{}", "x".repeat(3000))))
            .collect()
    }

    /// The frames the client receives, split out of its messages, until `want` have come.
    async fn receive(client: &mut WebSocketStream<TcpStream>, want: usize) -> Vec<String> {
        let mut got = Vec::new();
        while got.len() < want {
            let message = timeout(LIMIT, client.next())
                .await
                .unwrap_or_else(|_| panic!("only {} of {want} frames within 10 s", got.len()))
                .expect("the socket ended")
                .expect("a message");
            let text = message.as_text().expect("a text message");
            got.extend(text.split('\n').map(str::to_owned));
        }
        got
    }

    #[tokio::test]
    async fn a_free_socket_takes_the_frames_at_once_as_one_message() {
        let (ws, mut client) = pair().await;
        let frames = vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")];
        assert!(matches!(ws.direct().try_write(frames), Ok(Flushed::All)));
        let message = timeout(LIMIT, client.next())
            .await
            .expect("nothing within 10 s")
            .expect("the socket ended")
            .expect("a message");
        assert_eq!(message.as_text(), Some("a\nb"));
    }

    #[tokio::test]
    async fn a_socket_the_task_holds_or_a_batch_past_the_limit_is_handed_back_whole() {
        let (ws, _client) = pair().await;
        let frames = batch(0);
        {
            let _held = ws.lock();
            let back = ws.direct().try_write(frames.clone());
            assert_eq!(
                back.err(),
                Some(frames.clone()),
                "the locked socket took frames"
            );
        }
        let big: Vec<Bytes> = (0..2).flat_map(|_| batch(1)).collect();
        assert_eq!(ws.direct().try_write(big.clone()).err(), Some(big));
    }

    /// Fill the socket until a direct write leaves bytes behind, then until one is refused; the
    /// task's flush (its own waker) must then deliver every frame taken, once, in order.
    #[tokio::test]
    async fn what_a_full_socket_leaves_behind_reaches_the_client_in_order_after_the_tasks_flush() {
        let (mut ws, mut client) = pair().await;
        let direct = ws.direct();
        let mut taken = Vec::new();
        let mut partly = false;
        let mut refused = None;
        // Loopback buffers hold a few MB: a GB of batches without a refusal is a defect.
        for n in 0..20_000 {
            let frames = batch(n);
            match direct.try_write(frames.clone()) {
                Ok(Flushed::All) => {
                    assert!(!partly, "a write after Flushed::Partly flushed everything");
                    taken.extend(frames);
                }
                Ok(Flushed::Partly) => {
                    partly = true;
                    taken.extend(frames);
                }
                Err(back) => {
                    assert!(partly, "refused before the socket was full");
                    assert_eq!(back, frames, "a refused batch came back changed");
                    refused = Some(n);
                    break;
                }
            }
        }
        let refused = refused.expect("20,000 batches and the socket never filled");
        let expected: Vec<String> = taken
            .iter()
            .map(|f| String::from_utf8(f.to_vec()).expect("text"))
            .collect();
        let flush = tokio::spawn(async move {
            let done = timeout(LIMIT, ws.flush()).await;
            (ws, done)
        });
        let got = receive(&mut client, expected.len()).await;
        let (ws, done) = flush.await.expect("the flush task");
        assert!(
            matches!(done, Ok(Ok(()))),
            "the task's flush did not finish"
        );
        assert_eq!(got.len(), expected.len());
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            panic!(
                "frame {i} of {} out of place (batches up to {refused}): got {:.12}, expected {:.12}",
                got.len(),
                got[i],
                expected[i]
            );
        }
        // The socket is free again: a direct write goes straight through.
        let last = vec![Bytes::from_static(b"last")];
        assert!(matches!(ws.direct().try_write(last), Ok(Flushed::All)));
        assert_eq!(receive(&mut client, 1).await, vec!["last".to_owned()]);
    }
}
