//! A connection's bounded outbound queue, shared by the hub (which pushes) and the connection's
//! task (which drains it into one write).
//!
//! An idle connection's queue holds no allocation: `VecDeque::new()` allocates on first push. The
//! bound is in bytes; a push that would pass it closes the connection as a slow consumer (4001)
//! and frees what was queued, so one slow client never grows memory or slows the fan-out.
//!
//! **Direct writes.** A connection whose socket can be written from outside its task registers a
//! [`DirectWrite`]. The fan-out then queues a publication without waking the task
//! ([`push_for_fanout`](Outbound::push_for_fanout)) and, once the channel's lock is released,
//! writes the queue itself ([`flush_direct`](Outbound::flush_direct)) when the socket takes it at
//! once: a delivery then costs no task wake-up. Order holds because frames enter the queue in
//! order and only one writer drains it at a time (the task or a fan-out, whichever holds the
//! `writing` role); whatever a direct write cannot finish goes back to the task.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use herald_protocol::CloseCode;
use tokio::sync::Notify;

/// Why and how the connection is to be closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseRequest {
    /// Close code (and `disconnect` push code).
    pub code: CloseCode,
    /// Human-readable reason.
    pub reason: String,
    /// Reconnect hint for the client.
    pub after_ms: Option<u64>,
}

/// Work for the connection's session that comes from elsewhere (API, hub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Subscribe the connection to a channel (API `subscribe`).
    Subscribe(String),
    /// Unsubscribe the connection from a channel (API `unsubscribe`).
    Unsubscribe(String),
    /// The node lost continuity on a channel: the hub stopped delivering it to this connection,
    /// which leaves it and tells its client to resubscribe with `since` (`unsub` 4003).
    Lost {
        /// The channel.
        channel: String,
        /// Why, for the `unsub` push.
        reason: String,
    },
}

/// How much of a [`DirectWrite::try_write`] reached the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Every frame was written and flushed.
    All,
    /// The frames were taken, but some bytes wait in the writer's buffer (or the write failed):
    /// the connection's task must flush (and so find out).
    Partly,
}

/// Writes frames to a connection's socket from outside its task, without waiting.
pub trait DirectWrite: Send + Sync {
    /// Write `frames` now if the writer is free and the socket takes them; `Err(frames)` when
    /// they were not taken at all (the task writes them).
    fn try_write(&self, frames: Vec<Bytes>) -> Result<Flushed, Vec<Bytes>>;
}

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    bytes: usize,
    controls: Vec<Control>,
    close: Option<CloseRequest>,
    /// The connection's direct writer, if it has one.
    direct: Option<Arc<dyn DirectWrite>>,
    /// Someone took frames and has not finished writing them: nobody else drains meanwhile.
    writing: bool,
    /// A direct write left bytes in the writer's buffer: the task must flush.
    needs_flush: bool,
    /// Bytes of queued recovery replies, allowed on top of the bound until they are taken (see
    /// [`Outbound::push_recovery`]).
    headroom: usize,
}

impl State {
    /// The task takes the `writing` role before it drains; false while a direct write holds it.
    /// Without a direct writer nobody else writes, and the role is not kept.
    fn take_writing(&mut self) -> bool {
        if self.direct.is_none() {
            return true;
        }
        if self.writing {
            return false;
        }
        self.writing = true;
        true
    }

    /// Whether the queue was closed for passing its bound (its frames freed).
    fn overflowed(&self) -> bool {
        self.close
            .as_ref()
            .is_some_and(|c| c.code == CloseCode::SLOW_CONSUMER)
    }

    /// Whether the task has anything to do.
    fn has_work(&self) -> bool {
        !self.frames.is_empty()
            || !self.controls.is_empty()
            || self.close.is_some()
            || self.needs_flush
    }
}

/// What the connection task takes out of the queue in one go.
#[derive(Default)]
pub struct Drained {
    /// Frames to write, in order.
    pub frames: Vec<Bytes>,
    /// Controls for the session.
    pub controls: Vec<Control>,
    /// Close after writing `frames`.
    pub close: Option<CloseRequest>,
    /// A direct write left bytes in the writer's buffer: flush them.
    pub needs_flush: bool,
    /// A direct write is under way: nothing was taken, and the task is woken when it ends.
    pub busy: bool,
}

/// The queue. See the module docs.
pub struct Outbound {
    state: Mutex<State>,
    notify: Notify,
    limit: usize,
}

impl Outbound {
    /// A queue that holds at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Outbound {
            state: Mutex::default(),
            notify: Notify::new(),
            limit,
        }
    }

    /// Queue a frame. Returns false if the connection is closing (now or already); the frame is
    /// dropped then, and the connection will recover what it missed when it reconnects.
    pub fn push(&self, frame: Bytes) -> bool {
        let state = self.state.lock().expect("outbound lock");
        self.queue(state, frame, true).is_some()
    }

    /// Queue a reply that carries recovered publications. Its bytes do not count against the
    /// bound while it waits: what follows it (the client's own join, live publications) still
    /// gets the whole bound. A recovery the session allowed is then always deliverable; were it
    /// counted, a recovery near the bound would close the connection with 4001 on every
    /// reconnect, forever. The session keeps these bytes bounded ([`recovery_room`]).
    ///
    /// [`recovery_room`]: Self::recovery_room
    pub fn push_recovery(&self, frame: Bytes) -> bool {
        let mut state = self.state.lock().expect("outbound lock");
        if state.close.is_some() {
            return false;
        }
        state.headroom += frame.len();
        self.queue(state, frame, true).is_some()
    }

    /// How many more bytes of recovery replies may wait in the queue, of `cap` in all: a client
    /// that asks for recoveries without reading gets `recovered: false`, not unbounded memory.
    pub fn recovery_room(&self, cap: usize) -> usize {
        cap.saturating_sub(self.state.lock().expect("outbound lock").headroom)
    }

    /// Queue `frame` under the held lock: `None` if it was dropped (closing, or it overflowed
    /// the bound, which closes), else whether it made the queue non-empty. That push, and only
    /// that one, wakes the task when `wake` says so: the task drains everything.
    fn queue(&self, mut state: MutexGuard<'_, State>, frame: Bytes, wake: bool) -> Option<bool> {
        if state.close.is_some() {
            return None;
        }
        // A frame always fits an empty queue: a reply larger than the bound must still reach
        // the client.
        if state.bytes > 0 && state.bytes + frame.len() > self.limit + state.headroom {
            state.frames = VecDeque::new();
            state.bytes = 0;
            state.headroom = 0;
            state.close = Some(CloseRequest {
                code: CloseCode::SLOW_CONSUMER,
                reason: "slow consumer".into(),
                after_ms: None,
            });
            drop(state);
            self.notify.notify_one();
            return None;
        }
        let first = state.frames.is_empty();
        state.bytes += frame.len();
        state.frames.push_back(frame);
        drop(state);
        if first && wake {
            self.notify.notify_one();
        }
        Some(first)
    }

    /// Ask the connection to close after what is queued. The first request wins.
    pub fn close(&self, request: CloseRequest) {
        let mut state = self.state.lock().expect("outbound lock");
        if state.close.is_none() {
            state.close = Some(request);
        }
        drop(state);
        self.notify.notify_one();
    }

    /// Hand the session a control message.
    pub fn control(&self, control: Control) {
        self.state
            .lock()
            .expect("outbound lock")
            .controls
            .push(control);
        self.notify.notify_one();
    }

    /// Wait until something was queued since the last [`drain`](Self::drain).
    pub async fn ready(&self) {
        self.notify.notified().await;
    }

    /// Take the queued frames only, leaving controls and a close request for the next
    /// [`drain`](Self::drain): for a connection task whose session is busy with a command (a
    /// proxy call), which can write but not act on controls. Call [`wake`](Self::wake) after.
    /// While a direct write is under way it takes nothing (the task is woken when it ends).
    /// Call [`written`](Self::written) once what it took is written.
    pub fn drain_frames(&self) -> Option<Vec<Bytes>> {
        let mut state = self.state.lock().expect("outbound lock");
        if state.frames.is_empty() || !state.take_writing() {
            return None;
        }
        state.bytes = 0;
        state.headroom = 0;
        Some(std::mem::take(&mut state.frames).into())
    }

    /// Wake the connection task, so that it drains what [`drain_frames`](Self::drain_frames)
    /// left behind.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Take everything queued, and the `writing` role with it: call [`written`](Self::written)
    /// once the frames are written. While a direct write is under way it takes nothing and says
    /// `busy`: the task is woken when that write ends.
    pub fn drain(&self) -> Drained {
        let mut state = self.state.lock().expect("outbound lock");
        if !state.take_writing() {
            return Drained {
                busy: true,
                ..Drained::default()
            };
        }
        state.bytes = 0;
        state.headroom = 0;
        Drained {
            frames: std::mem::take(&mut state.frames).into(),
            controls: std::mem::take(&mut state.controls),
            close: state.close.clone(),
            needs_flush: std::mem::take(&mut state.needs_flush),
            busy: false,
        }
    }

    /// The task wrote what it drained: give up the `writing` role, and wake the task again if
    /// frames came meanwhile (the fan-out leaves them to whoever writes).
    pub fn written(&self) {
        let mut state = self.state.lock().expect("outbound lock");
        state.writing = false;
        let again = state.has_work();
        drop(state);
        if again {
            self.notify.notify_one();
        }
    }

    /// Let the fan-out write to this connection through `writer` (see the module docs), or stop
    /// it (`None`: the connection is ending, and the queue must not keep its socket open).
    pub fn set_direct(&self, writer: Option<Arc<dyn DirectWrite>>) {
        self.state.lock().expect("outbound lock").direct = writer;
    }

    /// The fan-out's push: queue `frame` like [`push`](Self::push), but where the connection has
    /// a direct writer, do not wake its task. `None`: dropped (the connection is closing).
    /// `Some(true)`: the caller must call [`flush_direct`](Self::flush_direct) (after releasing
    /// its own locks); `Some(false)`: someone else writes it.
    pub fn push_for_fanout(&self, frame: Bytes) -> Option<bool> {
        let state = self.state.lock().expect("outbound lock");
        // A writer at work takes it when done (`written`, `flush_direct`); pending controls
        // have woken the task already, which drains frames too.
        let direct = state.direct.is_some() && !state.writing && state.controls.is_empty();
        let indirect = state.direct.is_none();
        let first = self.queue(state, frame, indirect)?;
        Some(first && direct)
    }

    /// Write what is queued from the caller's thread, through the direct writer, if nobody else
    /// is writing; what it cannot write at once goes back to the task.
    pub fn flush_direct(&self) {
        let mut state = self.state.lock().expect("outbound lock");
        if state.writing || state.frames.is_empty() {
            return;
        }
        let writer = match &state.direct {
            Some(w) if state.controls.is_empty() && state.close.is_none() => w.clone(),
            _ => {
                drop(state);
                self.notify.notify_one();
                return;
            }
        };
        state.writing = true;
        state.bytes = 0;
        let headroom = std::mem::take(&mut state.headroom);
        let frames: Vec<Bytes> = std::mem::take(&mut state.frames).into();
        drop(state);
        let result = writer.try_write(frames);
        let mut state = self.state.lock().expect("outbound lock");
        match result {
            Ok(Flushed::All) => {}
            Ok(Flushed::Partly) => state.needs_flush = true,
            // The queue overflowed meanwhile: what it held was freed, and these go with it.
            Err(_) if state.overflowed() => {}
            Err(frames) => {
                // Back in front of whatever came meanwhile, in order, with their headroom.
                state.bytes += frames.iter().map(Bytes::len).sum::<usize>();
                state.headroom += headroom;
                for f in frames.into_iter().rev() {
                    state.frames.push_front(f);
                }
            }
        }
        state.writing = false;
        let wake = state.has_work();
        drop(state);
        if wake {
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_closes_with_4001_and_frees() {
        let q = Outbound::new(10);
        assert!(q.push(Bytes::from_static(b"12345")));
        assert!(q.push(Bytes::from_static(b"12345")));
        assert!(!q.push(Bytes::from_static(b"1")));
        let d = q.drain();
        assert!(d.frames.is_empty(), "queued frames are freed on overflow");
        assert_eq!(d.close.unwrap().code, CloseCode::SLOW_CONSUMER);
        assert!(
            !q.push(Bytes::from_static(b"1")),
            "closed queues take nothing"
        );
    }

    #[test]
    fn an_oversized_frame_fits_an_empty_queue_only() {
        let q = Outbound::new(4);
        assert!(q.push(Bytes::from_static(b"a large recovery reply")));
        assert!(
            !q.push(Bytes::from_static(b"x")),
            "nothing more until drained"
        );
    }

    #[test]
    fn a_recovery_reply_leaves_the_whole_bound_to_what_follows() {
        let q = Outbound::new(10);
        assert!(q.push(Bytes::from_static(b"123")));
        // Counted, this reply would pass the bound and close the connection with 4001.
        assert!(q.push_recovery(Bytes::from(vec![b'r'; 40])));
        assert!(
            q.push(Bytes::from_static(b"join+4")),
            "the join after it fits"
        );
        assert_eq!(q.recovery_room(100), 60);
        assert!(
            !q.push(Bytes::from_static(b"12")),
            "the bound itself still holds"
        );
        let d = q.drain();
        assert_eq!(d.close.map(|c| c.code), Some(CloseCode::SLOW_CONSUMER));
        assert_eq!(q.recovery_room(100), 100, "freed with the queue");
    }

    #[test]
    fn recovery_headroom_ends_when_the_reply_is_taken() {
        let q = Outbound::new(10);
        assert!(q.push_recovery(Bytes::from(vec![b'r'; 40])));
        assert_eq!(q.drain().frames.len(), 1);
        q.written();
        assert_eq!(q.recovery_room(100), 100);
        assert!(q.push(Bytes::from_static(b"123456")));
        assert!(
            !q.push(Bytes::from_static(b"123456")),
            "back to the plain bound"
        );
    }

    #[test]
    fn drain_keeps_order_and_resets_bound() {
        let q = Outbound::new(10);
        for f in [&b"a"[..], b"b", b"c"] {
            q.push(Bytes::copy_from_slice(f));
        }
        let d = q.drain();
        assert_eq!(
            d.frames,
            vec![
                Bytes::from_static(b"a"),
                Bytes::from_static(b"b"),
                Bytes::from_static(b"c")
            ]
        );
        assert!(q.push(Bytes::from_static(b"0123456789")));
    }

    #[tokio::test]
    async fn drain_frames_takes_nothing_when_only_controls_wait() {
        let q = Outbound::new(100);
        q.control(Control::Subscribe("c".into()));
        // An empty batch here made the connection task write nothing and call `written`, which
        // woke it again for the control it may not take while its command runs: a busy loop.
        assert_eq!(q.drain_frames(), None);
        assert_eq!(q.drain().controls, vec![Control::Subscribe("c".into())]);
    }

    #[tokio::test]
    async fn drain_frames_leaves_controls_and_close() {
        let q = Outbound::new(100);
        q.push(Bytes::from_static(b"a"));
        q.control(Control::Subscribe("c".into()));
        assert_eq!(q.drain_frames(), Some(vec![Bytes::from_static(b"a")]));
        q.close(CloseRequest {
            code: CloseCode::SHUTDOWN,
            reason: "bye".into(),
            after_ms: None,
        });
        let d = q.drain();
        assert!(d.frames.is_empty());
        assert_eq!(d.controls, vec![Control::Subscribe("c".into())]);
        assert_eq!(d.close.unwrap().code, CloseCode::SHUTDOWN);
    }

    /// A direct writer for the tests: records what it wrote, answers as told, and can act on the
    /// queue in the middle of a write (as another thread would).
    struct FakeWriter {
        wrote: Mutex<Vec<Bytes>>,
        answer: Mutex<Option<Flushed>>,
        during: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }

    impl FakeWriter {
        fn new(answer: Option<Flushed>) -> Arc<Self> {
            Arc::new(FakeWriter {
                wrote: Mutex::default(),
                answer: Mutex::new(answer),
                during: Mutex::default(),
            })
        }
    }

    impl DirectWrite for FakeWriter {
        fn try_write(&self, frames: Vec<Bytes>) -> Result<Flushed, Vec<Bytes>> {
            if let Some(f) = self.during.lock().unwrap().take() {
                f();
            }
            match *self.answer.lock().unwrap() {
                Some(flushed) => {
                    self.wrote.lock().unwrap().extend(frames);
                    Ok(flushed)
                }
                None => Err(frames),
            }
        }
    }

    fn direct_queue(writer: &Arc<FakeWriter>) -> Arc<Outbound> {
        let q = Arc::new(Outbound::new(100));
        q.set_direct(Some(writer.clone()));
        q
    }

    /// Whether the task would be woken now.
    async fn woken(q: &Outbound) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(20), q.ready())
            .await
            .is_ok()
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[tokio::test]
    async fn without_a_direct_writer_the_fanout_wakes_the_task() {
        let q = Outbound::new(100);
        assert_eq!(q.push_for_fanout(b("a")), Some(false));
        assert!(woken(&q).await);
        assert_eq!(q.drain().frames, vec![b("a")]);
        assert_eq!(q.drain().frames, Vec::<Bytes>::new(), "no role kept");
    }

    #[tokio::test]
    async fn a_direct_write_takes_the_queue_in_order_without_waking_the_task() {
        let w = FakeWriter::new(Some(Flushed::All));
        let q = direct_queue(&w);
        assert_eq!(
            q.push_for_fanout(b("a")),
            Some(true),
            "first: the caller writes"
        );
        assert_eq!(q.push_for_fanout(b("b")), Some(false), "queued behind it");
        q.flush_direct();
        assert_eq!(*w.wrote.lock().unwrap(), vec![b("a"), b("b")]);
        assert!(!woken(&q).await);
        assert!(q.drain().frames.is_empty());
    }

    #[tokio::test]
    async fn frames_a_direct_write_cannot_take_go_back_in_front_for_the_task() {
        let w = FakeWriter::new(None);
        let q = direct_queue(&w);
        assert_eq!(q.push_for_fanout(b("a")), Some(true));
        q.flush_direct();
        assert_eq!(q.push_for_fanout(b("c")), Some(false));
        assert!(woken(&q).await);
        let d = q.drain();
        assert_eq!(d.frames, vec![b("a"), b("c")]);
        assert!(!d.needs_flush);
    }

    #[tokio::test]
    async fn a_partial_direct_write_asks_the_task_to_flush() {
        let w = FakeWriter::new(Some(Flushed::Partly));
        let q = direct_queue(&w);
        assert_eq!(q.push_for_fanout(b("a")), Some(true));
        q.flush_direct();
        assert!(woken(&q).await);
        let d = q.drain();
        assert!(d.frames.is_empty() && d.needs_flush);
    }

    #[tokio::test]
    async fn the_task_takes_nothing_while_a_direct_write_runs() {
        let w = FakeWriter::new(Some(Flushed::All));
        let q = direct_queue(&w);
        let during = q.clone();
        *w.during.lock().unwrap() = Some(Box::new(move || {
            // A publication arrives and the task wakes while the fan-out writes.
            assert_eq!(during.push_for_fanout(b("b")), Some(false));
            assert!(during.drain().busy);
            assert_eq!(during.drain_frames(), None);
        }));
        assert_eq!(q.push_for_fanout(b("a")), Some(true));
        q.flush_direct();
        assert_eq!(*w.wrote.lock().unwrap(), vec![b("a")]);
        assert!(woken(&q).await, "woken for what came meanwhile");
        assert_eq!(q.drain().frames, vec![b("b")]);
    }

    #[tokio::test]
    async fn no_direct_write_while_the_task_writes() {
        let w = FakeWriter::new(Some(Flushed::All));
        let q = direct_queue(&w);
        q.push(b("reply"));
        assert!(woken(&q).await);
        assert_eq!(q.drain().frames, vec![b("reply")]);
        // The task is writing: the fan-out leaves its frame to it.
        assert_eq!(q.push_for_fanout(b("pub")), Some(false));
        q.flush_direct();
        assert!(w.wrote.lock().unwrap().is_empty());
        q.written();
        assert!(woken(&q).await);
        assert_eq!(q.drain().frames, vec![b("pub")]);
    }

    #[tokio::test]
    async fn a_closing_queue_takes_no_fanout_frames_and_stops_direct_writes() {
        let w = FakeWriter::new(Some(Flushed::All));
        let q = direct_queue(&w);
        q.close(CloseRequest {
            code: CloseCode::SHUTDOWN,
            reason: "bye".into(),
            after_ms: None,
        });
        assert_eq!(q.push_for_fanout(b("a")), None);
        q.set_direct(None);
        assert_eq!(Arc::strong_count(&w), 1, "the queue let go of the writer");
    }

    #[tokio::test]
    async fn push_wakes_the_writer() {
        let q = std::sync::Arc::new(Outbound::new(100));
        let q2 = q.clone();
        let waiter = tokio::spawn(async move {
            q2.ready().await;
            q2.drain().frames.len()
        });
        tokio::task::yield_now().await;
        q.push(Bytes::from_static(b"x"));
        assert_eq!(waiter.await.unwrap(), 1);
    }
}
