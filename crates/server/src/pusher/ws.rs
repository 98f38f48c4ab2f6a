//! The Pusher WebSocket endpoint `/app/{key}`: the upgrade, then one task per connection that
//! reads client messages, writes queued events (one Pusher message per WebSocket message, as
//! Pusher clients expect), pings a silent client, and closes with Pusher's codes:
//! 4001 unknown app, 4007/4008 protocol version, 4100 over capacity or too slow a reader,
//! 4200 node draining (reconnect now), 4201 no pong, 4009 failed sign-in or closed by the
//! server API (`terminate_connections`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_core::outbound::CloseRequest;
use herald_core::Outbound;
use herald_protocol::CloseCode;
use hyper::body::Incoming;
use hyper::Request;
use tokio::time::{sleep_until, timeout, Instant};

use super::apps::PusherApp;
use super::codes;
use super::conn::{ConnContext, PusherConn};
use super::wire;
use crate::compression;
use crate::guard::IpSlot;
use crate::http::{App, HttpResponse};

use crate::handshake::{self, Ws};

/// Why a Pusher connection ends: a protocol close code and message.
struct Close {
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
pub fn upgrade(app: Arc<App>, mut req: Request<Incoming>) -> HttpResponse {
    let accept = match handshake::accept_key(&app, req.headers()) {
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
    let pusher_app = app.pusher.by_key(&key).cloned();
    let refusal = match (&pusher_app, protocol.as_deref()) {
        (None, _) => Some(close(
            codes::APP_NOT_FOUND,
            format!("App key {key} does not exist"),
        )),
        (_, None) => Some(close(
            codes::NO_PROTOCOL_VERSION,
            "No protocol version supplied",
        )),
        (_, Some(p)) if !matches!(p.parse::<u32>(), Ok(5..=7)) => Some(close(
            codes::UNSUPPORTED_PROTOCOL,
            format!("Unsupported protocol version {p}"),
        )),
        _ if *app.draining.borrow() => {
            Some(close(codes::RECONNECT_NOW, "Server is draining: reconnect"))
        }
        _ => None,
    };

    let max_frame = app.ctx.config.limits.max_frame_bytes;
    let extensions = handshake::compression(&app, req.headers());
    let compress = extensions.is_some();
    let ip_slot = req.extensions().get::<Arc<IpSlot>>().cloned();
    // Only the upgrade travels into the task, not the request (the task's size is memory every
    // idle connection keeps).
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let _ip_slot = ip_slot;
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = handshake::serve(upgraded, max_frame, compress);
                match (refusal, pusher_app) {
                    (None, Some(pusher_app)) => run(app, pusher_app, ws).await,
                    // Boxed: inline, the refusal's state would be part of every connection's task.
                    (refusal, _) => Box::pin(refuse(app, ws, refusal)).await,
                }
            }
            Err(e) => tracing::debug!(cause = %e, "pusher upgrade failed"),
        }
    });

    handshake::switching_protocols(&accept, None, extensions)
}

/// Close a connection refused at the upgrade (unknown app, protocol version, draining).
async fn refuse(app: Arc<App>, mut ws: Ws, refusal: Option<Close>) {
    let refusal = refusal.unwrap_or_else(|| close(codes::APP_NOT_FOUND, "unknown app"));
    finish(&mut ws, Vec::new(), &refusal, write_timeout(&app)).await;
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

fn write_timeout(app: &App) -> Duration {
    Duration::from_millis(app.ctx.config.limits.write_timeout_ms)
}

/// The connection's task (heavy awaits boxed, as in the Herald WebSocket task, so that an idle
/// connection's future stays small).
///
/// Not an `async fn`: an async fn's future holds its arguments twice (rust-lang/rust#62958), and
/// one of them is the WebSocket stream.
#[allow(clippy::manual_async_fn)]
fn run(
    app: Arc<App>,
    pusher_app: Arc<PusherApp>,
    mut ws: Ws,
) -> impl std::future::Future<Output = ()> {
    async move {
        app.ws_connections.fetch_add(1, Ordering::Relaxed);
        let metrics = app.ctx.hub.metrics().clone();
        metrics.connections.inc();
        metrics.connections_accepted.inc();
        let open = pusher_app.connections.fetch_add(1, Ordering::Relaxed) + 1;
        let _counted = Counted(app.clone(), pusher_app.clone());
        let max = pusher_app.config.max_connections;
        if max > 0 && open > max {
            let refusal = close(
                codes::OVER_CAPACITY,
                "Over capacity: the app's connection limit is reached",
            );
            Box::pin(finish(&mut ws, Vec::new(), &refusal, write_timeout(&app))).await;
            return;
        }
        let config = app.ctx.config.clone();
        let limits = &config.limits;
        let settings = &app.pusher.settings;
        let out = Arc::new(Outbound::new(limits.outbound_queue_bytes));
        let ctx = ConnContext {
            hub: app.ctx.hub.clone(),
            namespace: app.pusher.namespace.clone(),
            max_channels: limits.max_channels_per_connection,
            max_event_bytes: settings.max_event_bytes,
            client_events_per_second: settings.client_events_per_second,
            webhooks: app
                .pusher
                .webhooks
                .clone()
                .filter(|_| !pusher_app.config.webhooks.is_empty()),
            census: app.pusher.census.clone(),
            app: pusher_app,
            max_recovery_bytes: limits.max_recovery_bytes,
            frames: app.pusher.frames.clone(),
        };
        let mut conn = PusherConn::open(ctx, out.clone(), settings.activity_timeout_s);
        // The node-wide limit counts Herald and Pusher connections alike.
        if limits.max_connections > 0 && app.ctx.hub.connection_count() > limits.max_connections {
            out.drain();
            let refusal = close(
                codes::OVER_CAPACITY,
                "Over capacity: the node's connection limit is reached",
            );
            Box::pin(finish(&mut ws, Vec::new(), &refusal, write_timeout(&app))).await;
            Box::pin(conn.end()).await;
            return;
        }
        let mut draining = app.draining.clone();
        let activity = app.pusher.activity_timeout();
        let pong_timeout = Duration::from_secs(config.pong_timeout_s.max(1));
        let mut last_heard = Instant::now();
        let mut pong_due: Option<Instant> = None;

        let ended = loop {
            let deadline = pong_due.unwrap_or(last_heard + activity);
            tokio::select! {
                biased;
                _ = out.ready() => {
                    let drained = out.drain();
                    if !drained.controls.is_empty() {
                        Box::pin(conn.handle_controls(drained.controls)).await;
                    }
                    let frames: Vec<Bytes> = drained.frames.into_iter().filter_map(|f| conn.translate(f)).collect();
                    if let Some(req) = drained.close {
                        if req.code == CloseCode::SLOW_CONSUMER {
                            metrics.slow_consumers.inc();
                        }
                        break Some((frames, from_request(&req)));
                    }
                    if Box::pin(write_frames(&mut ws, frames, write_timeout(&app))).await.is_err() {
                        break None;
                    }
                }
                incoming = ws.next() => {
                    let message = match incoming {
                        Some(Ok(m)) => m,
                        Some(Err(_)) | None => break None,
                    };
                    if message.is_close() {
                        break None;
                    }
                    last_heard = Instant::now();
                    pong_due = None;
                    if message.is_ping() || message.is_pong() {
                        continue;
                    }
                    let Some(text) = message.as_text() else {
                        out.push(wire::error(None, "Binary messages are not part of the protocol"));
                        continue;
                    };
                    if text.len() > limits.max_frame_bytes {
                        out.push(wire::error(None, "Message too large"));
                        continue;
                    }
                    if let Some((code, why)) = Box::pin(conn.handle(text)).await {
                        let frames = out.drain().frames.into_iter().filter_map(|f| conn.translate(f)).collect();
                        break Some((frames, close(code, why)));
                    }
                }
                _ = sleep_until(deadline) => {
                    let now = Instant::now();
                    if pong_due.is_some_and(|due| due <= now) {
                        break Some((Vec::new(), close(codes::PONG_NOT_RECEIVED, "Pong reply not received")));
                    }
                    out.push(wire::ping());
                    pong_due = Some(now + pong_timeout);
                }
                changed = draining.changed() => {
                    if changed.is_ok() && *draining.borrow() {
                        out.close(CloseRequest { code: CloseCode::SHUTDOWN, reason: "server shutdown".into(), after_ms: None });
                    }
                }
            }
        };
        if let Some((frames, why)) = ended {
            Box::pin(finish(&mut ws, frames, &why, write_timeout(&app))).await;
        }
        Box::pin(conn.end()).await;
    }
}

/// Write frames, one WebSocket message each, then one flush. With compression, a frame shared
/// by a fan-out is compressed once per worker thread (crate::compression).
async fn write_frames(ws: &mut Ws, frames: Vec<Bytes>, limit: Duration) -> Result<(), ()> {
    if frames.is_empty() {
        return Ok(());
    }
    let compress = ws.compression();
    let write = async {
        for frame in frames {
            ws.feed(compression::text(frame, compress, true)).await?;
        }
        ws.flush().await
    };
    match timeout(limit, write).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// Send what is queued, `pusher:error` with the code, and the close frame with the same code;
/// wait briefly for the peer's close.
async fn finish(ws: &mut Ws, mut frames: Vec<Bytes>, why: &Close, limit: Duration) {
    frames.push(wire::error(Some(why.code), &why.message));
    if write_frames(ws, frames, limit).await.is_err() {
        return;
    }
    handshake::close_and_wait(ws, why.code, &why.message, limit).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Largest allowed size of an idle Pusher connection's task state (the future `run`
    /// returns). Measured 1,248 bytes with Rust 1.95 (1,712 when `run` was an `async fn` with
    /// the refusals inline).
    const MAX_TASK_BYTES: usize = 1400;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, C, F: std::future::Future>(_: fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every idle connection keeps its task's future: growing it is memory per connection.
    #[test]
    fn task_stays_small() {
        let size = future_size(run);
        println!("pusher connection task: {size} bytes");
        assert!(
            size <= MAX_TASK_BYTES,
            "the Pusher connection task's future is {size} bytes (at most {MAX_TASK_BYTES}): box \
             state that only a rare path needs, or measure idle memory and raise the limit"
        );
    }
}
