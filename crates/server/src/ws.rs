//! Herald's WebSocket endpoint (`/ws`): the upgrade and the connection's task. Each upgraded
//! socket is served by one task, the engine's driver (crate::engine) over the WebSocket
//! transport of [`connection`] and Herald's protocol (`crate::engine::herald`, which runs the
//! client's text messages, as for emulated connections): it reads commands, hands them to the
//! [`Session`](herald_core::Session), writes queued frames in batches, pings, and closes with
//! the protocol's close codes.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::Either;
use futures_util::FutureExt;
use herald_core::proxy::ClientMeta;
use herald_protocol::{ErrorCode, SUBPROTOCOL};
use hyper::body::Incoming;
use hyper::header;
use hyper::upgrade::OnUpgrade;
use hyper::{Request, StatusCode};

use crate::guard::{IpSlot, PeerAddr};
use crate::handshake;
use crate::response::{error, HttpResponse};
use crate::state::App;

mod connection;
pub(crate) mod shared;

/// Answer the upgrade request and spawn the connection's task.
pub fn upgrade(app: Arc<App>, mut req: Request<Incoming>) -> HttpResponse {
    let accept = match handshake::accept_key(&app, req.headers(), crate::guard::Door::Herald) {
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
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "unsupported subprotocol (herald.v1.json only)",
            )
        }
    };
    if *app.draining.borrow() {
        return error(
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
    tokio::spawn(connection_task(Upgrade {
        app,
        on_upgrade,
        meta,
        ip_slot,
        max_frame,
        compress,
    }));

    handshake::switching_protocols(&accept, subprotocol, extensions)
}

/// What a connection's task starts from: the pending upgrade, and what the connection needs.
struct Upgrade {
    app: Arc<App>,
    on_upgrade: OnUpgrade,
    meta: Option<Box<ClientMeta>>,
    ip_slot: Option<Arc<IpSlot>>,
    max_frame: usize,
    compress: bool,
}

/// A connection's task: wait for the upgrade, then serve the connection.
///
/// A combinator, not an `async` block: an async block keeps what it captured for its whole life,
/// beside the state of the connection it awaits, while here the upgrade's state and the
/// connection's take turns in one place. The task lives as long as the connection
/// (`tests::task_fits_its_size_class`).
fn connection_task(u: Upgrade) -> impl Future<Output = ()> + Send {
    let Upgrade {
        app,
        on_upgrade,
        meta,
        ip_slot,
        max_frame,
        compress,
    } = u;
    on_upgrade.then(move |upgraded| match upgraded {
        Ok(upgraded) => {
            let ws = handshake::serve(upgraded, max_frame, compress);
            Either::Left(connection::connection(app, ws, meta, ip_slot).run())
        }
        Err(e) => {
            tracing::debug!(cause = %e, "upgrade failed");
            Either::Right(std::future::ready(()))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::task_size::{future_size, task_cell_size};

    /// Every idle WebSocket connection keeps its task: it must stay in jemalloc's 1,280-byte
    /// size class (docs/bench/idle13: the class above costs 256 bytes more per connection).
    #[test]
    fn task_fits_its_size_class() {
        let size = future_size(connection_task);
        let cell = task_cell_size(size);
        assert!(
            cell <= 1280,
            "the connection task's future is {size} bytes, its task cell about {cell} (at most \
             1,280): box state that only a rare path needs, or measure idle memory"
        );
    }
}
