//! The Pusher WebSocket endpoint `/app/{key}`: the upgrade, then one task per connection, the
//! engine's driver (crate::engine) over a WebSocket transport that writes one Pusher message per
//! WebSocket message, as Pusher clients expect ([`PusherWs`]), and Pusher's protocol
//! ([`PusherProtocol`]): it reads client messages, writes queued events, pings a silent client,
//! and closes with Pusher's codes:
//! 4001 unknown app, 4007/4008 protocol version, 4100 over capacity, too slow a reader or a new
//! connection to a draining node (reconnect later), 4200 node draining (the open connections:
//! reconnect now, elsewhere), 4201 no pong, 4009 failed sign-in or closed by the server API
//! (`terminate_connections`), 1009 a message over the codec's limit.

use std::future::Future;
use std::ops::ControlFlow::{Break, Continue};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::{FutureExt, SinkExt, StreamExt};
use herald_core::outbound::{CloseRequest, Control, DirectWrite};
use herald_core::Outbound;
use herald_protocol::CloseCode;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper::Request;
use tokio::io::ReadBuf;
use tokio::time::{timeout, Instant};
use tokio_websockets::Message;

use super::apps::PusherApp;
use super::codes;
use super::conn::{ConnContext, PusherConn};
use super::direct::PusherDirect;
use super::wire;
use super::Node;
use crate::compression;
use crate::engine::driver::Driver;
use crate::engine::policy::{self, timed, AfterSilence, Tick};
use crate::engine::{Closing, End, Parts, Protocol, Serve, Step, Transport, Written};
use crate::guard::IpSlot;
use crate::response::HttpResponse;
use crate::state::App;
use crate::ws::shared::{DirectGuard, SharedWs};

use crate::handshake::{self, Ws};

/// Why a Pusher connection ends: a protocol close code and message.
pub(crate) struct Close {
    code: u16,
    message: String,
}

fn close(code: u16, message: impl Into<String>) -> Close {
    Close {
        code,
        message: message.into(),
    }
}

/// A close the hub or the Herald API asked for, in Pusher's codes.
fn from_request(req: &CloseRequest) -> Close {
    match req.code {
        CloseCode::SLOW_CONSUMER => close(
            codes::OVER_CAPACITY,
            "Over capacity: the connection fell behind",
        ),
        CloseCode::SHUTDOWN => close(codes::RECONNECT_NOW, "Server is draining: reconnect"),
        _ => close(codes::UNAUTHORIZED, req.reason.clone()),
    }
}

/// Answer the upgrade of `/app/{key}` and spawn the connection's task. Refusals that Pusher
/// clients must see (unknown app, protocol version) complete the upgrade and close with the
/// code; malformed upgrades get an HTTP error.
pub fn upgrade(node: Arc<Node>, mut req: Request<Incoming>) -> HttpResponse {
    let app = &node.state;
    let accept = match handshake::accept_key(app, req.headers(), crate::guard::Door::Pusher) {
        Ok(accept) => accept,
        Err(refused) => return *refused,
    };
    let key = req
        .uri()
        .path()
        .strip_prefix("/app/")
        .unwrap_or("")
        .to_owned();
    let protocol = req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "protocol")
            .map(|(_, v)| v.into_owned())
    });
    let pusher_app = node.apps.by_key(&key);
    let refusal = match (&pusher_app, protocol.as_deref()) {
        (None, _) => Some(close(
            codes::APP_NOT_FOUND,
            format!("App key {key} does not exist"),
        )),
        (Some(a), _) if !a.enabled => Some(close(
            codes::APP_DISABLED,
            format!("App key {key} is disabled"),
        )),
        (_, None) => Some(close(
            codes::NO_PROTOCOL_VERSION,
            "No protocol version supplied",
        )),
        (_, Some(p)) if !matches!(p.parse::<u32>(), Ok(5..=7)) => Some(close(
            codes::UNSUPPORTED_PROTOCOL,
            format!("Unsupported protocol version {p}"),
        )),
        _ if *app.draining.borrow() => Some(close(
            codes::DRAINING_TRY_LATER,
            "Server is draining: reconnect later",
        )),
        _ => None,
    };

    let max_frame = app.ctx.config.limits.max_frame_bytes;
    let extensions = handshake::compression(app, req.headers());
    let compress = extensions.is_some();
    let ip_slot = req.extensions().get::<Arc<IpSlot>>().cloned();
    // Only the upgrade travels into the task, not the request (the task's size is memory every
    // idle connection keeps).
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(connection_task(Upgrade {
        node,
        pusher_app,
        refusal: refusal.map(Box::new),
        on_upgrade,
        ip_slot,
        max_frame,
        compress,
    }));

    handshake::switching_protocols(&accept, None, extensions)
}

/// What a connection's task starts from: the pending upgrade, the app (or why it is refused),
/// and what the connection needs.
struct Upgrade {
    node: Arc<Node>,
    pusher_app: Option<Arc<PusherApp>>,
    /// Boxed: only refused connections have one, and every task would carry it inline.
    refusal: Option<Box<Close>>,
    on_upgrade: OnUpgrade,
    ip_slot: Option<Arc<IpSlot>>,
    max_frame: usize,
    compress: bool,
}

/// A connection's task: wait for the upgrade, then serve the connection or close it with the
/// refusal.
///
/// A combinator, not an `async` block, as for Herald's WebSocket (`crate::ws`): the upgrade's
/// state and the connection's take turns in one place instead of sitting side by side for the
/// connection's whole life (`tests::task_fits_its_size_class`).
fn connection_task(u: Upgrade) -> impl Future<Output = ()> + Send {
    // The closure takes the other fields of `u` one by one (disjoint captures).
    u.on_upgrade.then(move |upgraded| {
        let upgraded = match upgraded {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(cause = %e, "pusher upgrade failed");
                return Either::Right(Either::Right(std::future::ready(())));
            }
        };
        let ws = handshake::serve(upgraded, u.max_frame, u.compress);
        match (u.refusal, u.pusher_app) {
            (None, Some(pusher_app)) => Either::Left(run(u.node, pusher_app, ws, u.ip_slot)),
            // Boxed: inline, the refusal's state would be part of every connection's task.
            (refusal, _) => Either::Right(Either::Left(Box::pin(refuse(u.node, ws, refusal)))),
        }
    })
}

/// Close a connection refused at the upgrade (unknown app, protocol version, draining).
async fn refuse(node: Arc<Node>, mut ws: Ws, refusal: Option<Box<Close>>) {
    let refusal = refusal.map_or_else(|| close(codes::APP_NOT_FOUND, "unknown app"), |r| *r);
    finish(
        &mut ws,
        Vec::new(),
        &refusal,
        policy::write_timeout(&node.state),
    )
    .await;
}

/// Counts the connection (node-wide and per app) while it lives.
struct Counted(Arc<App>, Arc<PusherApp>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.ws_connections.fetch_sub(1, Ordering::Relaxed);
        self.0.ctx.hub.metrics().connections.dec();
        self.1.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection's task: count it, refuse it over the app's or the node's connection limit,
/// else drive it.
///
/// Not an `async fn`: the refusals are boxed, so that the task of a connection that is served
/// holds only the driver's future (every idle connection keeps it).
fn run(
    node: Arc<Node>,
    pusher_app: Arc<PusherApp>,
    mut ws: Ws,
    ip_slot: Option<Arc<IpSlot>>,
) -> impl Future<Output = ()> + Send {
    let app = node.state.clone();
    app.ws_connections.fetch_add(1, Ordering::Relaxed);
    let metrics = app.ctx.hub.metrics();
    metrics.connections.inc();
    metrics.connections_accepted.inc();
    let open = pusher_app.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let counted = Counted(app.clone(), pusher_app.clone());
    let limit = policy::write_timeout(&app);
    let max = pusher_app.config.max_connections;
    if max > 0 && open > max {
        let refusal = close(
            codes::OVER_CAPACITY,
            "Over capacity: the app's connection limit is reached",
        );
        return Either::Left(Box::pin(async move {
            finish(&mut ws, Vec::new(), &refusal, limit).await;
            drop((counted, ip_slot));
        })
            as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>);
    }
    let out = Arc::new(Outbound::new(app.ctx.config.limits.outbound_queue_bytes));
    let activity_timeout_s = node.apps.settings.activity_timeout_s;
    let activity_timeout = node.apps.activity_timeout();
    let ctx = ConnContext {
        node,
        app: pusher_app,
    };
    let mut conn = PusherConn::open(ctx, out.clone(), activity_timeout_s);
    // The node-wide limit counts Herald and Pusher connections alike.
    let max_connections = app.ctx.config.limits.max_connections;
    if max_connections > 0 && app.ctx.hub.connection_count() > max_connections {
        out.drain();
        let refusal = close(
            codes::OVER_CAPACITY,
            "Over capacity: the node's connection limit is reached",
        );
        return Either::Left(Box::pin(async move {
            finish(&mut ws, Vec::new(), &refusal, limit).await;
            conn.end().await;
            drop((counted, ip_slot));
        }));
    }
    let ws = SharedWs::new(ws);
    let direct = conn.direct_writer(ws.locked());
    let pong_timeout = Duration::from_secs(app.ctx.config.pong_timeout_s.max(1));
    let protocol = PusherProtocol {
        conn,
        pings: AfterSilence::after_silence(activity_timeout, pong_timeout),
    };
    let transport = PusherWs {
        direct,
        ws,
        _counted: counted,
        _direct: DirectGuard(out.clone()),
        _ip_slot: ip_slot,
    };
    Either::Right(Driver::new(app, transport, protocol, out).run())
}

/// Pusher's WebSocket: one message per frame, Pusher's close, and the fan-out's direct writes of
/// publications as Pusher events (super::direct), through the same codec (crate::ws::shared).
pub(crate) struct PusherWs {
    ws: SharedWs,
    /// The fan-out's writer (the driver registers it with the queue).
    direct: Arc<PusherDirect>,
    _counted: Counted,
    _direct: DirectGuard,
    /// The connection's place in `limits.max_connections_per_ip`, while it lives.
    _ip_slot: Option<Arc<IpSlot>>,
}

impl Transport for PusherWs {
    /// A message from the client, a codec error, or the end of its input.
    type Input = Option<Result<Message, tokio_websockets::Error>>;

    fn next_input(&mut self) -> impl Future<Output = Self::Input> + Send {
        self.ws.next()
    }

    async fn write(&mut self, frames: Vec<Bytes>, limit: Duration) -> Written {
        // Not boxed: the driver boxes the whole outbound step.
        let compress = self.ws.compression();
        match write_frames(&mut self.ws, compress, frames, limit).await {
            Ok(()) => Written::Done,
            Err(()) => Written::Failed,
        }
    }

    async fn flush(&mut self, limit: Duration) -> bool {
        timed(limit, self.ws.flush()).await
    }

    fn direct(&self) -> Option<Arc<dyn DirectWrite>> {
        Some(self.direct.clone())
    }

    /// Pusher's drain close (4200) carries no reconnect delay.
    fn drain_after_ms(_: &App) -> Option<u64> {
        None
    }

    /// Send what is queued, `pusher:error` with the code, and the close frame with the same
    /// code; wait briefly for the peer's close.
    async fn close(&mut self, mut frames: Vec<Bytes>, closing: Closing<'_>, limit: Duration) {
        frames.push(closing.words);
        let compress = self.ws.compression();
        if write_frames(&mut self.ws, compress, frames, limit)
            .await
            .is_ok()
        {
            handshake::close_and_wait(&mut self.ws, closing.code, closing.reason, limit).await;
        }
    }

    /// The codec refused a message over its limit, read only the frame's header, and queued its
    /// close frame (1009); it sends nothing else any more. `first` (a `pusher:error` as a raw text
    /// frame) goes straight to the socket ahead of the close frame; then what the client still
    /// uploads is read off for up to a second, so that it reads the close instead of a reset.
    async fn linger(&mut self, first: Option<Bytes>, limit: Duration) {
        use std::future::poll_fn;
        let ws = &mut self.ws;
        let sent = timeout(limit, async {
            // Below the codec. The fan-out's writer was taken back from the queue before
            // (`Driver::end`), as for Herald's WebSocket.
            let mut rest = first.unwrap_or_default();
            while !rest.is_empty() {
                match poll_fn(|cx| ws.poll_write(cx, &rest)).await? {
                    0 => return Err(std::io::ErrorKind::WriteZero.into()),
                    n => rest = rest.slice(n..),
                }
            }
            ws.flush().await.map_err(std::io::Error::other)
        })
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            return;
        }
        let _ = timeout(Duration::from_secs(1), async {
            let _ = poll_fn(|cx| ws.poll_shutdown(cx)).await;
            // On the heap: an array here would live in every connection's task state.
            let mut buf = vec![0u8; 8192];
            loop {
                let mut read = ReadBuf::new(&mut buf);
                match poll_fn(|cx| ws.poll_read(cx, &mut read)).await {
                    Ok(()) if !read.filled().is_empty() => {}
                    _ => break,
                }
            }
        })
        .await;
    }
}

/// A Pusher connection's protocol state and its ping schedule (a ping after
/// `activity_timeout` of silence, a pong owed within `pong_timeout_s`).
pub(crate) struct PusherProtocol {
    conn: PusherConn,
    pings: AfterSilence,
}

impl Protocol for PusherProtocol {
    type Close = Close;

    fn close_request(req: CloseRequest) -> Close {
        from_request(&req)
    }

    fn closing(close: &Close) -> Closing<'_> {
        Closing {
            code: close.code,
            reason: &close.message,
            after_ms: None,
            words: wire::error(Some(close.code), &close.message),
        }
    }

    fn deadline(&self) -> Instant {
        self.pings.deadline()
    }

    fn client_id(&self) -> Option<&str> {
        Some(self.conn.socket_id())
    }

    async fn on_timer(&mut self, out: &Outbound) -> Option<(Vec<Bytes>, Close)> {
        match self.pings.on_timer(Instant::now()) {
            Tick::Late => Some((
                Vec::new(),
                close(codes::PONG_NOT_RECEIVED, "Pong reply not received"),
            )),
            Tick::Ping => {
                out.push(wire::ping());
                None
            }
            Tick::Quiet => None,
        }
    }

    async fn handle_controls(&mut self, controls: Vec<Control>) {
        self.conn.handle_controls(controls).await
    }

    fn translate(&mut self, frames: Vec<Bytes>) -> Vec<Bytes> {
        frames
            .into_iter()
            .filter_map(|f| self.conn.translate(f))
            .collect()
    }

    async fn end(self) {
        self.conn.end().await
    }
}

impl Serve<PusherWs> for PusherProtocol {
    async fn on_input(
        &mut self,
        parts: Parts<'_, PusherWs>,
        incoming: Option<Result<Message, tokio_websockets::Error>>,
    ) -> Step<Close> {
        let message = match incoming {
            Some(Ok(m)) => m,
            Some(Err(tokio_websockets::Error::PayloadTooLong { max_len, .. })) => {
                let error = wire::error(
                    Some(codes::MESSAGE_TOO_BIG),
                    &format!("Message too large: the limit is {max_len} bytes"),
                );
                return Break(End::Linger(Some(Bytes::from(text_frame(&error)))));
            }
            Some(Err(_)) | None => return Break(End::Gone),
        };
        if message.is_close() {
            return Break(End::Gone);
        }
        self.pings.heard();
        if message.is_ping() || message.is_pong() {
            return Continue(());
        }
        let out = parts.out;
        let Some(text) = message.as_text() else {
            out.push(wire::error(
                None,
                "Binary messages are not part of the protocol",
            ));
            return Continue(());
        };
        if text.len() > parts.app.ctx.config.limits.max_frame_bytes {
            out.push(wire::error(None, "Message too large"));
            return Continue(());
        }
        if let Some((code, why)) = Box::pin(self.conn.handle(text)).await {
            let frames = self.translate(out.drain().frames);
            return Break(End::Close(frames, close(code, why)));
        }
        Continue(())
    }
}

/// Write frames, one WebSocket message each, then one flush. With compression, a frame shared
/// by a fan-out is compressed once per worker thread (crate::compression).
async fn write_frames<S>(
    ws: &mut S,
    compress: bool,
    frames: Vec<Bytes>,
    limit: Duration,
) -> Result<(), ()>
where
    S: futures_util::Sink<Message, Error = tokio_websockets::Error> + Unpin,
{
    if frames.is_empty() {
        return Ok(());
    }
    let write = async {
        for frame in frames {
            ws.feed(compression::text(frame, compress, true)).await?;
        }
        ws.flush().await
    };
    match timed(limit, write).await {
        true => Ok(()),
        false => Err(()),
    }
}

/// Send what is queued, `pusher:error` with the code, and the close frame with the same code;
/// wait briefly for the peer's close.
async fn finish(ws: &mut Ws, mut frames: Vec<Bytes>, why: &Close, limit: Duration) {
    frames.push(wire::error(Some(why.code), &why.message));
    let compress = ws.compression();
    if write_frames(ws, compress, frames, limit).await.is_err() {
        return;
    }
    handshake::close_and_wait(ws, why.code, &why.message, limit).await;
}

/// A server's text frame: final, unmasked, uncompressed (RFC 6455 5.2; uncompressed frames stay
/// valid with permessage-deflate).
fn text_frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + 10);
    frame.push(0x81);
    match payload.len() {
        n @ 0..=125 => frame.push(n as u8),
        n @ 126..=0xFFFF => {
            frame.push(126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(payload);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::task_size::{future_size, task_cell_size};

    /// Every idle Pusher connection keeps its task: it must stay in jemalloc's 1,280-byte size
    /// class, as a Herald WebSocket connection's does (the class above costs 256 bytes more per
    /// connection, which put Pusher idle memory 16-25% over Herald's in round 9).
    #[test]
    fn text_frames_have_the_three_length_forms() {
        assert_eq!(text_frame(b"hi"), b"\x81\x02hi");
        let medium = text_frame(&[b'a'; 300]);
        assert_eq!(&medium[..4], &[0x81, 126, 1, 44]);
        assert_eq!(medium.len(), 304);
        let large = text_frame(&vec![b'a'; 70_000]);
        assert_eq!(&large[..2], &[0x81, 127]);
        assert_eq!(u64::from_be_bytes(large[2..10].try_into().unwrap()), 70_000);
    }

    #[test]
    fn task_fits_its_size_class() {
        let size = future_size(connection_task);
        let cell = task_cell_size(size);
        println!("pusher connection task: {size} bytes, cell {cell}");
        assert!(
            cell <= 1280,
            "the Pusher connection task's future is {size} bytes, its task cell about {cell} (at \
             most 1,280): box state that only a rare path needs, or measure idle memory"
        );
    }
}
