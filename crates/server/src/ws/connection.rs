//! A Herald WebSocket connection as the engine drives it (crate::engine): the WebSocket as a
//! [`Transport`] ([`WsTransport`]: batches of newline-joined frames, the fan-out's direct writes,
//! the close frame, the linger after the codec's own close) and Herald's protocol reading its
//! messages ([`Serve`] for [`Herald`]).
//!
//! Several queued frames go out newline-joined in one WebSocket message and one flush. The
//! fan-out writes publications itself where the socket takes them at once, through the same
//! codec (super::shared), and wakes the task only for what it could not finish.
//!
//! Memory: the task's future lives as long as the connection (`task_stays_small` guards its
//! size); this transport adds one pointer to the socket and the guards that count it.

use std::future::Future;
use std::ops::ControlFlow::{Break, Continue};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_core::outbound::{CloseRequest, DirectWrite};
use herald_core::proxy::ClientMeta;
use herald_core::{Outbound, Session};
use herald_protocol::CloseCode;
use tokio::io::ReadBuf;
use tokio::time::timeout;
use tokio_websockets::Message;

use super::shared::{messages, DirectGuard, SharedWs};
use crate::engine::driver::Driver;
use crate::engine::herald::{close, Herald};
use crate::engine::liveness::Liveness;
use crate::engine::policy::timed;
use crate::engine::{Closing, End, Parts, Serve, Step, Transport, Written};
use crate::guard::IpSlot;
use crate::handshake::{close_and_wait, Ws};
use crate::state::App;

/// A WebSocket connection's driver.
pub(super) type Connection = Driver<WsTransport, Herald>;

/// A connection just upgraded, counted from now on.
pub(super) fn connection(
    app: Arc<App>,
    ws: Ws,
    meta: Option<Box<ClientMeta>>,
    ip_slot: Option<Arc<IpSlot>>,
) -> Connection {
    let config = &app.ctx.config;
    let out = Arc::new(Outbound::new(config.limits.outbound_queue_bytes));
    let mut session = Session::new(app.ctx.clone(), out.clone());
    if let Some(meta) = meta {
        session.set_client_meta(*meta);
    }
    let herald = Herald {
        session,
        liveness: Liveness::new(config),
    };
    let transport = WsTransport {
        ws: SharedWs::new(ws),
        _counted: Counted::new(app.clone()),
        _direct: DirectGuard(out.clone()),
        _ip_slot: ip_slot,
    };
    Driver::new(app, transport, herald, out)
}

/// Herald's WebSocket. See the module docs.
pub(super) struct WsTransport {
    ws: SharedWs,
    _counted: Counted,
    _direct: DirectGuard,
    /// The connection's place in `limits.max_connections_per_ip`, while it lives.
    _ip_slot: Option<Arc<IpSlot>>,
}

impl Transport for WsTransport {
    /// A message from the client, a codec error, or the end of its input.
    type Input = Option<Result<Message, tokio_websockets::Error>>;

    fn next_input(&mut self) -> impl Future<Output = Self::Input> + Send {
        self.ws.next()
    }

    async fn write(&mut self, frames: Vec<Bytes>, limit: Duration) -> Written {
        match write_batch(&mut self.ws, frames, limit).await {
            true => Written::Done,
            false => Written::Failed,
        }
    }

    async fn flush(&mut self, limit: Duration) -> bool {
        timed(limit, self.ws.flush()).await
    }

    fn direct(&self) -> Option<Arc<dyn DirectWrite>> {
        Some(self.ws.direct())
    }

    /// Send what is queued, the `disconnect` push and the close frame; wait briefly for the
    /// peer's close so that it sees a clean closing handshake.
    async fn close(&mut self, mut frames: Vec<Bytes>, closing: Closing<'_>, limit: Duration) {
        frames.push(closing.words);
        if write_batch(&mut self.ws, frames, limit).await {
            close_and_wait(&mut self.ws, closing.code, closing.reason, limit).await;
        }
    }

    async fn linger(&mut self, first: Option<Bytes>, limit: Duration) {
        debug_assert!(first.is_none(), "Herald's WebSocket lingers without words");
        linger(&mut self.ws, limit).await
    }
}

impl Serve<WsTransport> for Herald {
    async fn on_input(
        &mut self,
        parts: Parts<'_, WsTransport>,
        incoming: Option<Result<Message, tokio_websockets::Error>>,
    ) -> Step<CloseRequest> {
        let message = match incoming {
            Some(Ok(m)) => m,
            Some(Err(_)) => return Break(End::Linger(None)),
            // Reset or EOF.
            None => return Break(End::Gone),
        };
        if message.is_close() {
            // The codec queued the close frame that answers the client's (RFC 6455 5.5.1).
            return Break(End::Linger(None));
        }
        // WebSocket pings and pongs do not answer our ping: only a message does, so a client
        // cannot hold a never-finished fragmented message open with pings.
        if message.is_ping() || message.is_pong() {
            return Continue(());
        }
        let Some(text) = message.as_text() else {
            return close(
                CloseCode::BAD_REQUEST,
                "binary frames are not part of the protocol",
            );
        };
        self.on_text(parts, text).await
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

/// Write queued frames as [`messages`] makes them, then one flush; false if it failed or timed
/// out.
async fn write_batch(ws: &mut SharedWs, frames: Vec<Bytes>, limit: Duration) -> bool {
    if frames.is_empty() {
        return true;
    }
    let compress = ws.compression();
    let write = async {
        for message in messages(frames, compress) {
            ws.feed(message).await?;
        }
        ws.flush().await
    };
    timed(limit, write).await
}

/// Flush the close frame the codec queued, then read off what the peer still sends (the rest of
/// an oversized frame) for a moment: closing a socket with unread input resets the connection,
/// and the peer would lose the close frame.
async fn linger(ws: &mut SharedWs, limit: Duration) {
    if !timed(limit, ws.flush()).await {
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
        println!("herald connection task: {size} bytes");
        assert!(
            size <= MAX_TASK_BYTES,
            "the connection task's future is {size} bytes (at most {MAX_TASK_BYTES}): box state \
             that only a rare path needs, or measure idle memory and raise the limit"
        );
    }
}
