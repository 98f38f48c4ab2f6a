//! Herald's protocol as the driver runs it: the connection's [`Session`] and its timers
//! ([`Liveness`]). Two-way transports (WebSocket, emulation) feed it the client's text messages
//! through [`Herald::on_text`], which parses and runs them (and enforces
//! `limits.max_connections` at `connect`); each implements [`Serve`](super::Serve) for its own
//! input.

use std::ops::ControlFlow::{Break, Continue};

use bytes::Bytes;
use herald_core::outbound::{CloseRequest, Control};
use herald_core::{Outbound, Session};
use herald_protocol::command::parse_frame;
use herald_protocol::encode::push_disconnect;
use herald_protocol::CloseCode;
use tokio::time::Instant;

use super::driver::write_failed;
use super::liveness::Liveness;
use super::policy;
use super::{Closing, End, Parts, Protocol, Step, Transport, Written};
use crate::state::App;

/// A Herald connection's session and timers.
pub(crate) struct Herald {
    pub(crate) session: Session,
    pub(crate) liveness: Liveness,
}

/// End with `code`, without the frames still queued.
pub(crate) fn close(code: CloseCode, reason: &str) -> Step<CloseRequest> {
    Break(End::Close(Vec::new(), close_request(code, reason)))
}

impl Herald {
    /// Run one text message from the client: a connected client's command runs while what is
    /// queued for it is written meanwhile; `connect` is answered as a whole.
    pub(crate) async fn on_text<T: Transport>(
        &mut self,
        parts: Parts<'_, T>,
        text: &str,
    ) -> Step<CloseRequest> {
        self.liveness.heard();
        if text.len() > parts.app.ctx.config.limits.max_frame_bytes {
            return close(CloseCode::MESSAGE_TOO_LARGE, "message too large");
        }
        if self.session.is_connected() {
            return Box::pin(self.dispatch_writing(parts, text)).await;
        }
        // `connect` is answered as a whole: the connection limit may still refuse it, and then
        // none of its frames go out.
        match Box::pin(handle_text(parts.app, &mut self.session, parts.out, text)).await {
            Some((frames, req)) => Break(End::Close(frames, req)),
            None => Continue(()),
        }
    }

    /// Run a connected client's message while writing what is queued for the connection
    /// meanwhile: a command waiting for the application's backend (a proxy hook) must not hold
    /// back the connection's publications. Controls and a close request wait in the queue until
    /// the command is done (they need the session, which the command holds); the task is woken
    /// for them afterwards.
    async fn dispatch_writing<T: Transport>(
        &mut self,
        parts: Parts<'_, T>,
        text: &str,
    ) -> Step<CloseRequest> {
        let Parts {
            app,
            transport,
            out,
        } = parts;
        let limit = policy::write_timeout(app);
        let mut write_failed_ = false;
        let mut closes = None;
        let close = {
            let dispatching = dispatch(&mut self.session, text);
            tokio::pin!(dispatching);
            loop {
                tokio::select! {
                    biased;
                    close = &mut dispatching => break close,
                    _ = out.ready(), if !write_failed_ && closes.is_none() => {
                        if let Some(frames) = out.drain_frames() {
                            match transport.write(frames, limit).await {
                                Written::Done => {}
                                Written::Close(req) => closes = Some(req),
                                Written::Failed => write_failed_ = true,
                            }
                            out.written();
                        }
                    }
                }
            }
        };
        out.wake();
        if write_failed_ {
            return Break(write_failed(app, out));
        }
        match close.or(closes) {
            Some(req) => Break(End::Close(out.drain().frames, req)),
            None => Continue(()),
        }
    }
}

/// A close request with no reconnect hint.
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
async fn handle_text(
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

impl Protocol for Herald {
    type Close = CloseRequest;

    fn close_request(req: CloseRequest) -> CloseRequest {
        req
    }

    fn closing(req: &CloseRequest) -> Closing<'_> {
        Closing {
            code: req.code.0,
            reason: &req.reason,
            after_ms: req.after_ms,
            words: push_disconnect(req.code, &req.reason, req.after_ms),
        }
    }

    fn deadline(&self) -> Instant {
        self.liveness.deadline(&self.session)
    }

    async fn on_timer(&mut self, out: &Outbound) -> Option<(Vec<Bytes>, CloseRequest)> {
        self.liveness.on_timer(&mut self.session, out).await
    }

    async fn handle_controls(&mut self, controls: Vec<Control>) {
        self.session.handle_controls(controls).await
    }

    fn client_id(&self) -> Option<&str> {
        self.session.client_id()
    }

    async fn end(self) {
        self.session.end().await
    }
}
