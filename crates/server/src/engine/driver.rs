//! The one connection loop. A [`Driver`]'s [`run`](Driver::run) waits for the next event and
//! hands it to one method: a wakeup of the outbound queue ([`on_outbound`](Driver::on_outbound)),
//! the client's input (the protocol's [`Serve::on_input`]), the timer (the protocol's
//! [`Protocol::on_timer`]), the node starting to drain ([`on_drain`](Driver::on_drain)). Each
//! returns a [`Step`]: serve on, or how the connection [`End`]s; [`end`](Driver::end) then
//! closes it and the protocol's session ends.
//!
//! One task per connection (not a reader and a writer): no second task, no channel. The queue is
//! drained whenever it is woken, and what it holds goes to the transport as one batch. Where the
//! transport allows it the fan-out writes publications itself and wakes the task only for what
//! it could not finish.
//!
//! Memory: the task's future lives as long as the connection, and an async fn's state is as
//! large as its largest await point. So the deep or rarely taken paths (controls, timers, the
//! close) are boxed, and an idle connection's future holds the driver, the four futures
//! [`next_event`](Driver::next_event) waits on, and little more (`crate::ws`'s `task_stays_small`
//! and the Pusher endpoint's `task_fits_its_size_class` guard it).
//!
//! The timer is kept from one wait to the next, not made anew per event: a wait that ends for a
//! queued frame would otherwise take its timer out of the runtime's timer wheel and put a new one
//! in (under the wheel's lock), once per delivery.

use std::future::Future;
use std::ops::ControlFlow::{Break, Continue};
use std::pin::Pin;
use std::sync::Arc;

use herald_core::Outbound;
use tokio::sync::watch;
use tokio::time::{sleep_until, Sleep};

use super::policy::{self, count_close};
use super::{End, Parts, Serve, Step, Transport, Written};
use crate::state::App;

/// What woke the connection's task.
enum Event<I> {
    /// Something was queued for the client (frames, controls, a close request).
    Outbound,
    /// The client's input.
    Input(I),
    /// The timer's deadline passed.
    Deadline,
    /// The drain flag changed (`changed`: false when its sender is gone).
    Drain { changed: bool },
}

/// One connection: its transport, its protocol and its outbound queue. See the module docs.
pub(crate) struct Driver<T, P> {
    app: Arc<App>,
    transport: T,
    protocol: P,
    /// What the hub and the protocol queue for the client.
    out: Arc<Outbound>,
    /// Fires at the protocol's deadline; reset only when that deadline moves.
    timer: Pin<Box<Sleep>>,
    draining: watch::Receiver<bool>,
}

impl<T: Transport, P: Serve<T>> Driver<T, P> {
    /// A connection whose session queues into `out`. Registers the transport's direct writer.
    pub(crate) fn new(app: Arc<App>, transport: T, protocol: P, out: Arc<Outbound>) -> Self {
        if let Some(direct) = transport.direct() {
            out.set_direct(Some(direct));
        }
        Driver {
            timer: Box::pin(sleep_until(protocol.deadline())),
            draining: app.draining.clone(),
            app,
            transport,
            protocol,
            out,
        }
    }

    /// Serve the connection until it ends.
    ///
    /// Not an `async fn`: an async fn's future holds its arguments twice (rust-lang/rust#62958),
    /// and this argument is the whole connection.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run(mut self) -> impl Future<Output = ()> + Send {
        async move {
            let end = loop {
                let step = match self.next_event().await {
                    Event::Outbound => Box::pin(self.on_outbound()).await,
                    Event::Input(input) => {
                        let parts = Parts {
                            app: &self.app,
                            transport: &mut self.transport,
                            out: &self.out,
                        };
                        self.protocol.on_input(parts, input).await
                    }
                    Event::Deadline => Box::pin(self.on_deadline()).await,
                    Event::Drain { changed } => self.on_drain(changed),
                };
                if let Break(end) = step {
                    break end;
                }
            };
            // Boxed: it is needed once, and inline it would add its state to every connection's.
            Box::pin(self.end(end)).await;
        }
    }

    /// Wait for the next event. The outbound queue goes first: what is queued goes out before
    /// the next input is read.
    async fn next_event(&mut self) -> Event<T::Input> {
        let deadline = self.protocol.deadline();
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        tokio::select! {
            biased;
            _ = self.out.ready() => Event::Outbound,
            input = self.transport.next_input() => Event::Input(input),
            _ = self.timer.as_mut() => Event::Deadline,
            changed = self.draining.changed() => Event::Drain { changed: changed.is_ok() },
        }
    }

    /// Something was queued: act on the controls, then close if asked to, or write the frames.
    async fn on_outbound(&mut self) -> Step<P::Close> {
        let drained = self.out.drain();
        if drained.busy {
            // The fan-out is writing; it wakes the task again when it is done.
            return Continue(());
        }
        if !drained.controls.is_empty() {
            Box::pin(self.protocol.handle_controls(drained.controls)).await;
        }
        let frames = self.protocol.translate(drained.frames);
        if let Some(req) = drained.close {
            count_close(&self.app, Some(&req));
            return Break(End::Close(frames, P::close_request(req)));
        }
        let limit = policy::write_timeout(&self.app);
        let written = if frames.is_empty() && drained.needs_flush {
            match self.transport.flush(limit).await {
                true => Written::Done,
                false => Written::Failed,
            }
        } else if frames.is_empty() {
            Written::Done
        } else {
            self.transport.write(frames, limit).await
        };
        self.out.written();
        match written {
            Written::Done => Continue(()),
            Written::Close(req) => Break(End::Close(Vec::new(), P::close_request(req))),
            Written::Failed => Break(write_failed(&self.app, &self.out)),
        }
    }

    /// The timers' deadline passed: close, or serve on (a ping may be queued).
    async fn on_deadline(&mut self) -> Step<P::Close> {
        match self.protocol.on_timer(&self.out).await {
            Some((frames, close)) => Break(End::Close(frames, close)),
            None => Continue(()),
        }
    }

    /// The node started draining: ask the client to reconnect, after the hint its transport
    /// gives. The close request goes through the queue, after what is queued before it.
    fn on_drain(&mut self, changed: bool) -> Step<P::Close> {
        if changed && *self.draining.borrow() {
            self.out
                .close(policy::drain_request(T::drain_after_ms(&self.app)));
        }
        Continue(())
    }

    /// Close the connection as `end` says, then end the session (it leaves its channels).
    /// Not an `async fn` for the reason [`run`](Self::run) is not.
    #[allow(clippy::manual_async_fn)]
    fn end(mut self, end: End<P::Close>) -> impl Future<Output = ()> + Send {
        async move {
            // The fan-out writes nothing more, and the queue no longer holds the socket.
            self.out.set_direct(None);
            let limit = policy::write_timeout(&self.app);
            let lifecycle = self.app.ctx.hub.lifecycle().cloned();
            let client = self.protocol.client_id();
            let say = |code: u16, reason: &str| {
                if let (Some(sink), Some(client)) = (&lifecycle, client) {
                    sink.closing(client, code, reason);
                }
            };
            match end {
                End::Close(frames, close) => {
                    let closing = P::closing(&close);
                    say(closing.code, closing.reason);
                    self.transport.close(frames, closing, limit).await
                }
                End::Linger(first) => {
                    say(CLOSED_BY_PEER.0, CLOSED_BY_PEER.1);
                    self.transport.linger(first, limit).await
                }
                End::Gone => say(LOST.0, LOST.1),
            }
            self.transport.finish(limit).await;
            self.protocol.end().await;
        }
    }
}

/// The lifecycle events' close for a transport that ended on its own terms: the client closed
/// (or its input was refused by the protocol codec, which answered with its own close code).
const CLOSED_BY_PEER: (u16, &str) = (1000, "closed by the client or the codec");
/// The lifecycle events' close for a connection that went away without a close (WebSocket's
/// 1006: no close frame).
const LOST: (u16, &str) = (1006, "connection lost");

/// A write timed out or failed: the connection is gone, and counted as a slow consumer if its
/// queue had overflowed meanwhile.
pub(crate) fn write_failed<C>(app: &App, out: &Outbound) -> End<C> {
    count_close(app, out.drain().close.as_ref());
    End::Gone
}
