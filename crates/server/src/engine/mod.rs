//! The one connection engine: every client connection, whatever carries it (Herald's WebSocket,
//! Pusher's, SSE and NDJSON streams, WebSocket emulation over HTTP), is served by one
//! [`Driver`](driver::Driver), which owns its life: wait for the next event (queued frames, the
//! client's input, a timer, the node draining), act on it, and close.
//!
//! What differs is split in two, and the driver is generic over both (monomorphised: no dynamic
//! dispatch on the hot path, no allocation per connection beyond what the connection holds):
//!
//! - a [`Transport`] carries frames: it writes a batch and flushes, closes with a code and the
//!   protocol's last words (a WebSocket close frame; an SSE `disconnect` event and `retry:`; an
//!   emulated connection's `close` event), and delivers the client's input (nothing but "gone"
//!   for a one-way stream);
//! - a [`Protocol`] is the connection's session: Herald's [`Session`](herald_core::Session) or a
//!   Pusher connection. It runs the client's input ([`Serve`]), the hub's controls, its timers
//!   (pings, pongs, the handshake deadline, token expiry) and its end, and says how a close
//!   request reads in its own close codes.
//!
//! The policies every connection shares (slow consumers, write timeouts, the ping schedule, the
//! drain) live once, in [`policy`].

pub(crate) mod driver;
pub(crate) mod herald;
pub(crate) mod liveness;
pub(crate) mod policy;

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herald_core::outbound::{CloseRequest, Control, DirectWrite};
use herald_core::Outbound;
use tokio::time::Instant;

use crate::state::App;

/// What a connection does after an event: serve on, or end.
pub(crate) type Step<C> = ControlFlow<End<C>>;

/// How a connection ends; `C` is its protocol's close.
pub(crate) enum End<C> {
    /// Write these queued frames, the protocol's last words and the transport's close.
    Close(Vec<Bytes>, C),
    /// The transport ends on its own terms (a WebSocket codec queued its close frame, answering
    /// the client's or refusing its input): write `first` ahead of it if given, flush, and read
    /// off what the peer still sends for a moment.
    Linger(Option<Bytes>),
    /// Nothing more can be said: the client left or stopped reading.
    Gone,
}

/// How a connection closes, in its protocol's terms, for the transport to carry.
pub(crate) struct Closing<'a> {
    /// The close code (WebSocket close frame, `disconnect` push, `close` event).
    pub code: u16,
    /// Why, for people.
    pub reason: &'a str,
    /// When the client may come back (Herald's reconnect hint).
    pub after_ms: Option<u64>,
    /// The protocol's last frame before the close: Herald's `disconnect` push, Pusher's
    /// `pusher:error`. (A one-way stream writes its own `disconnect` event from the code, the
    /// reason and `after_ms` instead.)
    pub words: Bytes,
}

/// What a batch write came to.
pub(crate) enum Written {
    /// Written and flushed.
    Done,
    /// Written, and the transport must close now: what was written cannot be followed on it (a
    /// one-way stream cannot carry a resubscription).
    Close(CloseRequest),
    /// The client stopped reading (the write timed out) or left.
    Failed,
}

/// What carries a connection's frames. See the module docs.
pub(crate) trait Transport: Send {
    /// What the client's side delivers: a message, the end of its input, an error.
    type Input: Send;

    /// Wait for the client's next input. A one-way transport's only input is its client leaving.
    fn next_input(&mut self) -> impl Future<Output = Self::Input> + Send;

    /// Write `frames` (protocol frames, in order) and flush, within `limit`.
    fn write(
        &mut self,
        frames: Vec<Bytes>,
        limit: Duration,
    ) -> impl Future<Output = Written> + Send;

    /// Flush what the fan-out's direct write left in the transport's buffer; false if it failed.
    fn flush(&mut self, _limit: Duration) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }

    /// The writer the fan-out may write publications through directly
    /// (herald_core::outbound, "Direct writes"), for transports that allow it.
    fn direct(&self) -> Option<Arc<dyn DirectWrite>> {
        None
    }

    /// Write the last `frames` and the protocol's last words, then close as `closing` says.
    fn close(
        &mut self,
        frames: Vec<Bytes>,
        closing: Closing<'_>,
        limit: Duration,
    ) -> impl Future<Output = ()> + Send;

    /// The reconnect hint a drain gives this transport's clients: by default a random delay
    /// within the drain window (`policy::spread`). SSE and NDJSON add a floor (their `retry:`
    /// outlives the stream); Pusher's close 4200 carries none.
    fn drain_after_ms(app: &App) -> Option<u64> {
        Some(policy::spread(app.ctx.config.drain_ms))
    }

    /// End on the transport's own terms ([`End::Linger`]).
    fn linger(
        &mut self,
        _first: Option<Bytes>,
        _limit: Duration,
    ) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// The connection is over, however it ended (an HTTP stream's last chunk).
    fn finish(&mut self, _limit: Duration) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// A connection's session: what the client's protocol does. See the module docs.
pub(crate) trait Protocol: Send + Sized {
    /// How the protocol closes a connection.
    type Close: Send;

    /// A close queued by the hub, the API or the node ([`Outbound::close`]), in this protocol's
    /// terms.
    fn close_request(req: CloseRequest) -> Self::Close;

    /// How `close` is carried.
    fn closing(close: &Self::Close) -> Closing<'_>;

    /// When the connection's timers need it next.
    fn deadline(&self) -> Instant;

    /// The deadline passed: the close it calls for, with the frames to write before it, or
    /// `None` (a ping may have been queued in `out`).
    fn on_timer(
        &mut self,
        out: &Outbound,
    ) -> impl Future<Output = Option<(Vec<Bytes>, Self::Close)>> + Send;

    /// Act on controls the hub or the API queued.
    fn handle_controls(&mut self, controls: Vec<Control>) -> impl Future<Output = ()> + Send;

    /// The frames to write for the hub's (a protocol that speaks another wire translates them).
    fn translate(&mut self, frames: Vec<Bytes>) -> Vec<Bytes> {
        frames
    }

    /// The connection's client id in the hub's registry, once it has one (for the lifecycle
    /// events' close code and reason).
    fn client_id(&self) -> Option<&str>;

    /// The session ends: it leaves its channels.
    fn end(self) -> impl Future<Output = ()> + Send;
}

/// What a protocol needs from the driver to run the client's input.
pub(crate) struct Parts<'a, T> {
    pub app: &'a App,
    pub transport: &'a mut T,
    pub out: &'a Outbound,
}

/// A protocol that runs the input of transport `T`.
pub(crate) trait Serve<T: Transport>: Protocol {
    /// Run one input from the client.
    fn on_input(
        &mut self,
        parts: Parts<'_, T>,
        input: T::Input,
    ) -> impl Future<Output = Step<Self::Close>> + Send;
}

/// The size of a connection's task, for the tests that keep it in its allocator size class
/// (Herald's WebSocket endpoint's and Pusher's).
#[cfg(test)]
pub(crate) mod task_size {
    /// The size of the future `f` returns, without calling it.
    pub(crate) fn future_size<A, F: std::future::Future>(_: fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// tokio (1.54, x86-64) allocates a task as one cell: a 32-byte header, the scheduler's
    /// handle and the task id (16), the stage's tag (8), the future, a 48-byte trailer, the
    /// whole aligned to 128 bytes. jemalloc's size classes around it are 1,024, 1,280 and
    /// 1,536 bytes: a cell of 1,281 bytes costs 1,536.
    pub(crate) fn task_cell_size(future: usize) -> usize {
        (32 + 16 + 8 + future + 48).next_multiple_of(128)
    }
}
