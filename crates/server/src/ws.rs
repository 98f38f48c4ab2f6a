//! One WebSocket connection: the upgrade, then a single task per connection that reads commands,
//! hands them to the [`Session`], writes queued frames in batches, pings, and closes with the
//! protocol's close codes.
//!
//! One task (not a reader and a writer) keeps an idle connection small: no second task, no
//! channel, no split lock. The outbound queue is drained whenever it is woken; several queued
//! frames go out newline-joined in one WebSocket message and one flush.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use herald_core::outbound::CloseRequest;
use herald_core::proxy::ClientMeta;
use herald_core::{Outbound, Session};
use herald_protocol::command::parse_frame;
use herald_protocol::encode::push_disconnect;
use herald_protocol::{CloseCode, ErrorCode, SUBPROTOCOL};
use hyper::body::Incoming;
use hyper::header;
use hyper::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep_until, timeout};
use tokio_websockets::Message;

use crate::api;
use crate::compression;
use crate::guard::{IpSlot, PeerAddr};
use crate::http::{App, HttpResponse};
use crate::liveness::Liveness;

/// Largest batch of newline-joined frames in one WebSocket message.
const BATCH_BYTES: usize = 64 * 1024;

use crate::handshake::{self, Ws};

/// Answer the upgrade request and spawn the connection's task.
pub fn upgrade(app: Arc<App>, mut req: Request<Incoming>) -> HttpResponse {
    let accept = match handshake::accept_key(&app, req.headers()) {
        Ok(accept) => accept,
        Err(refused) => return *refused,
    };
    let headers = req.headers();
    let protocols: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    let subprotocol = match protocols.is_empty() {
        true => None,
        false if protocols.iter().any(|p| p == SUBPROTOCOL) => Some(SUBPROTOCOL),
        false => {
            return api::error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "unsupported subprotocol (herald.v1.json only)",
            )
        }
    };
    if *app.draining.borrow() {
        return api::error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TemporarilyUnavailable,
            "node is draining",
        );
    }

    let max_frame = app.ctx.config.limits.max_frame_bytes;
    let extensions = handshake::compression(&app, req.headers());
    let compress = extensions.is_some();
    let meta = app.ctx.config.proxy.enabled().then(|| {
        let ip = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        // Boxed: it travels in the connection's task, which every idle connection keeps.
        Box::new(crate::proxy::client_meta(
            &app.ctx.config.proxy,
            req.headers(),
            ip,
            "websocket",
        ))
    });
    let ip_slot = req.extensions().get::<Arc<IpSlot>>().cloned();
    // Only the upgrade itself travels into the task, not the request: the task's size is
    // memory every idle connection keeps.
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let _ip_slot = ip_slot;
        match on_upgrade.await {
            Ok(upgraded) => run(app, handshake::serve(upgraded, max_frame, compress), meta).await,
            Err(e) => tracing::debug!(cause = %e, "upgrade failed"),
        }
    });

    handshake::switching_protocols(&accept, subprotocol, extensions)
}

/// Counts the connection while it lives.
struct Counted(Arc<App>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.ws_connections.fetch_sub(1, Ordering::Relaxed);
        self.0.ctx.hub.metrics().connections.dec();
    }
}

/// The connection's task.
///
/// Every await on a rarely taken, deep path (commands, controls, close) is boxed: an async fn's
/// state is as large as its largest await point, and this future lives as long as the
/// connection. Measured with massif: the unboxed task held ~10 KB per idle connection.
async fn run(app: Arc<App>, mut ws: Ws, meta: Option<Box<ClientMeta>>) {
    app.ws_connections.fetch_add(1, Ordering::Relaxed);
    let metrics = app.ctx.hub.metrics().clone();
    metrics.connections.inc();
    metrics.connections_accepted.inc();
    let _counted = Counted(app.clone());
    let config = app.ctx.config.clone();
    let limits = &config.limits;
    let out = Arc::new(Outbound::new(limits.outbound_queue_bytes));
    let mut session = Session::new(app.ctx.clone(), out.clone());
    if let Some(meta) = meta {
        session.set_client_meta(*meta);
    }
    let mut draining = app.draining.clone();
    let mut liveness = Liveness::new(&config);

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
                if Box::pin(write_batch(&mut ws, drained.frames, write_timeout(&app))).await.is_err() {
                    // A client that stopped reading blocks the write until it times out; its
                    // queue overflows meanwhile. It is a slow consumer even though the jammed
                    // socket cannot carry the 4001 any more.
                    if out.drain().close.is_some_and(|r| r.code == CloseCode::SLOW_CONSUMER) {
                        metrics.slow_consumers.inc();
                    }
                    break None;
                }
            }
            incoming = ws.next() => {
                let message = match incoming {
                    Some(Ok(m)) => m,
                    // Too large for the codec or a WebSocket protocol error: the codec has queued
                    // its own close frame (1009, 1002); send it.
                    Some(Err(_)) => {
                        Box::pin(linger(&mut ws, write_timeout(&app))).await;
                        break None;
                    }
                    // Reset or EOF.
                    None => break None,
                };
                if message.is_close() {
                    break None;
                }
                // WebSocket pings and pongs do not answer our ping: only a message does, so a
                // client cannot hold a never-finished fragmented message open with pings.
                if message.is_ping() || message.is_pong() {
                    continue;
                }
                liveness.heard();
                let Some(text) = message.as_text() else {
                    break Some((Vec::new(), close_request(CloseCode::BAD_REQUEST, "binary frames are not part of the protocol")));
                };
                if text.len() > limits.max_frame_bytes {
                    break Some((Vec::new(), close_request(CloseCode::MESSAGE_TOO_LARGE, "message too large")));
                }
                let close = if session.is_connected() {
                    let outcome = Box::pin(dispatch_writing(&mut session, &mut ws, &out, text, write_timeout(&app))).await;
                    if outcome.write_failed {
                        if out.drain().close.is_some_and(|r| r.code == CloseCode::SLOW_CONSUMER) {
                            metrics.slow_consumers.inc();
                        }
                        break None;
                    }
                    outcome.close.map(|req| (out.drain().frames, req))
                } else {
                    // `connect` is answered as a whole: the connection limit may still refuse
                    // it, and then none of its frames go out.
                    Box::pin(handle_text(&app, &mut session, &out, text)).await
                };
                if let Some(close) = close {
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
                    // Spread reconnects over the drain window instead of a thundering herd.
                    let after_ms = rand::random_range(0..config.drain_ms.max(1));
                    out.close(CloseRequest { code: CloseCode::SHUTDOWN, reason: "server shutdown".into(), after_ms: Some(after_ms) });
                }
            }
        }
    };
    if let Some((frames, req)) = close {
        Box::pin(finish(&mut ws, frames, &req, write_timeout(&app))).await;
    }
    Box::pin(session.end()).await;
}

fn write_timeout(app: &App) -> Duration {
    Duration::from_millis(app.ctx.config.limits.write_timeout_ms)
}

pub(crate) fn close_request(code: CloseCode, reason: &str) -> CloseRequest {
    CloseRequest {
        code,
        reason: reason.into(),
        after_ms: None,
    }
}

/// Run one text message from the client (a WebSocket frame, or an emulated connection's `POST`):
/// the close it calls for, with the frames still queued. Enforces `limits.max_connections`,
/// which counts connections that completed `connect` (the hub's registry), so sockets that never
/// authenticate cannot lock others out.
pub(crate) async fn handle_text(
    app: &App,
    session: &mut Session,
    out: &Outbound,
    text: &str,
) -> Option<(Vec<Bytes>, CloseRequest)> {
    let was_connected = session.is_connected();
    if let Some(req) = dispatch(session, text).await {
        return Some((out.drain().frames, req));
    }
    let limits = &app.ctx.config.limits;
    if !was_connected
        && session.is_connected()
        && limits.max_connections > 0
        && app.ctx.hub.connection_count() > limits.max_connections
    {
        out.drain();
        let req = close_request(CloseCode::CONNECTION_LIMIT, "connection limit reached");
        return Some((Vec::new(), req));
    }
    None
}

/// Parse a text frame's messages and run them; stop at the first that closes the connection.
async fn dispatch(session: &mut Session, text: &str) -> Option<CloseRequest> {
    for parsed in parse_frame(text) {
        let message = match parsed {
            Ok(m) => m,
            Err(malformed) => return Some(close_request(CloseCode::BAD_REQUEST, &malformed.0)),
        };
        if let Some(req) = session.handle(message).await {
            return Some(req);
        }
    }
    None
}

/// How [`dispatch_writing`] ended.
struct Dispatched {
    /// The connection must close.
    close: Option<CloseRequest>,
    /// A write failed meanwhile (the client stopped reading): drop the connection.
    write_failed: bool,
}

/// [`dispatch`], while writing what is queued for the connection meanwhile: a command waiting for
/// the application's backend (a proxy hook) must not hold back the connection's publications.
/// Controls and a close request wait in the queue until the command is done (they need the
/// session, which the command holds); the main loop is woken for them afterwards.
async fn dispatch_writing(
    session: &mut Session,
    ws: &mut Ws,
    out: &Outbound,
    text: &str,
    limit: Duration,
) -> Dispatched {
    let mut write_failed = false;
    let dispatching = dispatch(session, text);
    tokio::pin!(dispatching);
    let close = loop {
        tokio::select! {
            biased;
            close = &mut dispatching => break close,
            _ = out.ready(), if !write_failed => {
                let frames = out.drain_frames();
                write_failed = write_batch(ws, frames, limit).await.is_err();
            }
        }
    };
    out.wake();
    Dispatched {
        close,
        write_failed,
    }
}

/// Write queued frames: one frame as it is (its bytes are shared with other subscribers),
/// several newline-joined into messages of at most [`BATCH_BYTES`], then one flush.
///
/// With compression, a lone frame is compressed once per fan-out (crate::compression caches it
/// by its shared bytes); a batch is this connection's own, so it is compressed here.
async fn write_batch(ws: &mut Ws, frames: Vec<Bytes>, limit: Duration) -> Result<(), ()> {
    if frames.is_empty() {
        return Ok(());
    }
    let compress = ws.compression();
    let write = async {
        if frames.len() == 1 {
            let frame = frames.into_iter().next().expect("one frame");
            return ws.send(compression::text(frame, compress, true)).await;
        }
        let mut batch = BytesMut::new();
        for frame in frames {
            if !batch.is_empty() && batch.len() + 1 + frame.len() > BATCH_BYTES {
                ws.feed(compression::text(batch.split().freeze(), compress, false))
                    .await?;
            }
            if !batch.is_empty() {
                batch.extend_from_slice(b"\n");
            }
            batch.extend_from_slice(&frame);
        }
        if !batch.is_empty() {
            ws.feed(compression::text(batch.freeze(), compress, false))
                .await?;
        }
        ws.flush().await
    };
    match timeout(limit, write).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// Flush the close frame the codec queued, then read off what the peer still sends (the rest of
/// an oversized frame) for a moment: closing a socket with unread input resets the connection,
/// and the peer would lose the close frame.
async fn linger(ws: &mut Ws, limit: Duration) {
    if !matches!(timeout(limit, ws.flush()).await, Ok(Ok(()))) {
        return;
    }
    let io = ws.get_mut();
    let _ = timeout(Duration::from_secs(1), async {
        let _ = io.shutdown().await;
        // On the heap: an array here would live in every connection's task state.
        let mut buf = vec![0u8; 8192];
        while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Send what is queued, the `disconnect` push and the close frame; wait briefly for the peer's
/// close so that it sees a clean closing handshake.
async fn finish(ws: &mut Ws, mut frames: Vec<Bytes>, req: &CloseRequest, limit: Duration) {
    frames.push(push_disconnect(req.code, &req.reason, req.after_ms));
    if write_batch(ws, frames, limit).await.is_err() {
        return;
    }
    let code = tokio_websockets::CloseCode::try_from(req.code.0)
        .unwrap_or(tokio_websockets::CloseCode::POLICY_VIOLATION);
    let mut reason = req.reason.clone();
    // A close frame's reason must fit in 123 bytes.
    while reason.len() > 123 {
        reason.pop();
    }
    if timeout(limit, ws.send(Message::close(Some(code), &reason)))
        .await
        .is_err()
    {
        return;
    }
    let _ = timeout(Duration::from_secs(1), async {
        while ws.next().await.is_some() {}
    })
    .await;
}
