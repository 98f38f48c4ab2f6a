//! WebSocket emulation over HTTP, for clients whose network will not carry a WebSocket (some
//! corporate proxies, some mobile carriers): the server's frames stream down as Server-Sent
//! Events (`GET /connection/emulation`), the client's messages go up as plain `POST`s
//! (`POST /connection/emulation?session=…`). The connection runs the same [`Session`] as a
//! WebSocket one (connect, subscribe, publish, presence, history, recovery, pings, limits,
//! drain), so the SDK can switch to it without the application noticing. See docs/transports.md.
//!
//! - this file: the two endpoints and the registry of open sessions;
//! - [`run`]: the connection's task.
//!
//! [`Session`]: herald_core::Session

pub mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use herald_protocol::ErrorCode;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::mpsc;

use crate::guard::PeerAddr;
use crate::state::App;
use crate::uni::{admit, allow_origin, error, stream_response, StreamResponse};

/// The path of both endpoints.
pub const PATH: &str = "/connection/emulation";

/// Messages a session holds from `POST`s before it handles them; a client that posts faster
/// than its session works gets 429.
const INBOX: usize = 32;
/// Chunks buffered between the connection's task and the response body.
const CHUNKS: usize = 16;

/// What a `POST` hands to a session's task.
pub enum Inbound {
    /// The body: what a WebSocket client would send as one text message.
    Text(String),
    /// A body over `limits.max_frame_bytes`: the connection ends with 4503, as on WebSocket.
    TooLarge,
}

/// Open emulated connections: session id → the inbox of its task.
#[derive(Default)]
pub struct Sessions {
    inboxes: Mutex<HashMap<String, mpsc::Sender<Inbound>>>,
}

impl Sessions {
    fn insert(&self, id: String, inbox: mpsc::Sender<Inbound>) {
        self.inboxes.lock().expect("sessions").insert(id, inbox);
    }

    fn get(&self, id: &str) -> Option<mpsc::Sender<Inbound>> {
        self.inboxes.lock().expect("sessions").get(id).cloned()
    }

    fn remove(&self, id: &str) {
        self.inboxes.lock().expect("sessions").remove(id);
    }
}

/// Removes a session from the registry when its task ends, however it ends.
pub(crate) struct Registered {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.sessions.remove(&self.id);
    }
}

/// Serve `GET` (open a session's downstream) or `POST` (a message to a session); `sessions` is
/// the node's registry of open emulated connections.
pub async fn serve(
    app: Arc<App>,
    sessions: &Arc<Sessions>,
    req: Request<Incoming>,
) -> StreamResponse {
    match *req.method() {
        Method::GET => open(app, sessions, req),
        Method::POST => post(app, sessions, req).await,
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BadRequest.as_u16(),
            "use GET /connection/emulation to open, POST /connection/emulation?session=… to send",
        ),
    }
}

fn open(app: Arc<App>, sessions: &Arc<Sessions>, req: Request<Incoming>) -> StreamResponse {
    let origin = match admit(&app, &req, true) {
        Ok(origin) => origin,
        Err(refused) => return *refused,
    };
    if req.uri().query().is_some_and(|q| !q.is_empty()) {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest.as_u16(),
            "GET /connection/emulation takes no parameters: send connect in the first POST",
        );
    }
    let ip_slot = req.extensions().get::<Arc<crate::guard::IpSlot>>().cloned();
    // What the connect proxy forwards: the `GET`'s allow-listed headers and cookies, and the IP.
    let meta = app.ctx.config.proxy.enabled().then(|| {
        let ip = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        crate::proxy::client_meta(&app.ctx.config.proxy, req.headers(), ip, "emulation")
    });
    let id = format!("{:032x}", rand::random::<u128>());
    let (inbox_tx, inbox) = mpsc::channel::<Inbound>(INBOX);
    let (tx, rx) = mpsc::channel::<Bytes>(CHUNKS);
    sessions.insert(id.clone(), inbox_tx);
    let registered = Registered {
        sessions: sessions.clone(),
        id: id.clone(),
    };
    let first = format!("event: session\ndata: {{\"session\":\"{id}\"}}\n\n");
    let _ = tx.try_send(Bytes::from(first));
    tokio::spawn(run::run(app, registered, inbox, tx, ip_slot, meta));
    stream_response(rx, "text/event-stream", origin)
}

async fn post(app: Arc<App>, sessions: &Sessions, req: Request<Incoming>) -> StreamResponse {
    let origin = match admit(&app, &req, false) {
        Ok(origin) => origin,
        Err(refused) => return *refused,
    };
    let session = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "session")
        .map(|(_, v)| v.into_owned());
    let Some(inbox) = session.as_deref().and_then(|id| sessions.get(id)) else {
        let mut r = error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotAvailable.as_u16(),
            "no such session: open a new one with GET /connection/emulation",
        );
        allow_origin(&mut r, origin);
        return r;
    };
    let limits = &app.ctx.config.limits;
    let body = http_body_util::Limited::new(req.into_body(), limits.max_frame_bytes);
    let wait = Duration::from_millis(limits.handshake_timeout_ms);
    let refused = |status, code: ErrorCode, message: &str| {
        let mut r = error(status, code.as_u16(), message);
        allow_origin(&mut r, origin.clone());
        r
    };
    let bytes = match tokio::time::timeout(wait, body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            // As on WebSocket, a message over the frame limit ends the connection.
            let _ = inbox.try_send(Inbound::TooLarge);
            return refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::LimitExceeded,
                "message too large",
            );
        }
        Err(_) => {
            return refused(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::BadRequest,
                "body did not arrive in time",
            )
        }
    };
    let Ok(text) = String::from_utf8(bytes.to_vec()) else {
        return refused(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "the body must be UTF-8 text",
        );
    };
    if text.is_empty() {
        return refused(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, "empty body");
    }
    match inbox.try_send(Inbound::Text(text)) {
        Ok(()) => {
            let mut r = Response::new(Empty::<Bytes>::new().map_err(|e| match e {}).boxed());
            *r.status_mut() = StatusCode::NO_CONTENT;
            allow_origin(&mut r, origin);
            r
        }
        Err(mpsc::error::TrySendError::Full(_)) => refused(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyRequests,
            "too many messages in flight: wait for replies",
        ),
        Err(mpsc::error::TrySendError::Closed(_)) => refused(
            StatusCode::NOT_FOUND,
            ErrorCode::NotAvailable,
            "no such session: open a new one with GET /connection/emulation",
        ),
    }
}
