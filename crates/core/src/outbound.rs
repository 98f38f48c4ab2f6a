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
//!
//! **Shedding.** A publication of a namespace whose `backpressure` is `conflate` or `drop_oldest`
//! is queued with a [`Sheddable`] tag. A conflating one replaces its channel's waiting
//! publication when that is the newest frame queued. A push that would pass the bound first sheds tagged
//! publications (all but the newest per channel, or the oldest until the queue is half empty),
//! putting a `skip` push where each run was, and closes (4001) only if that is not enough. A
//! connection that never gets a tagged frame keeps no tags: the default path is unchanged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use herald_protocol::CloseCode;
use tokio::sync::Notify;

use crate::config::Backpressure;
use crate::trace::TracedWrite;

/// A queued publication that its namespace's backpressure policy may leave out.
#[derive(Debug, Clone)]
pub struct Sheddable {
    /// The channel.
    pub channel: Arc<str>,
    /// The publication's offset.
    pub offset: u64,
    /// `Conflate` or `DropOldest` (a `Disconnect` namespace does not tag).
    pub policy: Backpressure,
    /// Set on a `skip` push the queue made (it covers `skipped_from..=offset`): a later shedding
    /// merges it with what it leaves out next, so skips do not pile up.
    pub skipped_from: Option<u64>,
    /// The publication's full frame when the queued one is a delta (see [`crate::delta`]): sent
    /// instead whenever the publication before it was left out, which the client then lacks.
    pub full: Option<Bytes>,
}

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
    /// One entry per frame once a tagged frame was queued (`None` before: nothing to shed).
    tags: Option<VecDeque<Option<Sheddable>>>,
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
    /// Channels whose last queued publication was left out: their next delta goes in full.
    needs_full: Vec<Arc<str>>,
    /// The `write` span of a traced publication's frame, queued or in the write under way
    /// ([`Outbound::push_for_fanout_traced`]).
    traced_write: Option<Box<TracedWrite>>,
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
        self.queue(state, frame, true, None).is_some()
    }

    /// [`push`](Self::push) for a publication its namespace's backpressure policy may shed.
    pub fn push_sheddable(&self, frame: Bytes, tag: Option<Sheddable>) -> bool {
        let state = self.state.lock().expect("outbound lock");
        self.queue(state, frame, true, tag).is_some()
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
        self.queue(state, frame, true, None).is_some()
    }

    /// How many more bytes of recovery replies may wait in the queue, of `cap` in all: a client
    /// that asks for recoveries without reading gets `recovered: false`, not unbounded memory.
    pub fn recovery_room(&self, cap: usize) -> usize {
        cap.saturating_sub(self.state.lock().expect("outbound lock").headroom)
    }

    /// Queue `frame` under the held lock: `None` if it was dropped (closing, or it overflowed
    /// the bound, which closes), else whether it made the queue non-empty. That push, and only
    /// that one, wakes the task when `wake` says so: the task drains everything.
    fn queue(
        &self,
        mut state: MutexGuard<'_, State>,
        frame: Bytes,
        wake: bool,
        tag: Option<Sheddable>,
    ) -> Option<bool> {
        if state.close.is_some() {
            return None;
        }
        let mut frame = frame;
        let mut tag = tag;
        let mut follows_a_skip = false;
        if let Some(t) = tag.as_ref().filter(|t| t.policy == Backpressure::Conflate) {
            follows_a_skip = Self::replace_waiting(&mut state, t);
        }
        if let Some(t) = tag.as_mut() {
            Self::full_after_skip(&mut state, t, &mut frame, follows_a_skip);
        }
        // A frame always fits an empty queue: a reply larger than the bound must still reach
        // the client.
        let over = state.bytes > 0 && state.bytes + frame.len() > self.limit + state.headroom;
        if over && (tag.is_none() && state.tags.is_none()) {
            self.overflow(state);
            return None;
        }
        let first = state.frames.is_empty();
        if tag.is_some() && state.tags.is_none() {
            state.tags = Some(std::iter::repeat_n(None, state.frames.len()).collect());
        }
        if let Some(tags) = state.tags.as_mut() {
            tags.push_back(tag);
        }
        state.bytes += frame.len();
        state.frames.push_back(frame);
        if over && !self.shed(&mut state) {
            self.overflow(state);
            return None;
        }
        drop(state);
        if first && wake {
            self.notify.notify_one();
        }
        Some(first)
    }

    /// A delta whose base was left out goes in full: just after a skip (`follows_a_skip`), or
    /// when its channel's last queued publication was shed and the queue since drained.
    fn full_after_skip(
        state: &mut State,
        tag: &mut Sheddable,
        frame: &mut Bytes,
        follows_a_skip: bool,
    ) {
        let shed_before = state.needs_full.iter().position(|c| *c == tag.channel);
        if let Some(i) = shed_before {
            state.needs_full.swap_remove(i);
        }
        if follows_a_skip || shed_before.is_some() {
            if let Some(full) = tag.full.take() {
                *frame = full;
            }
        }
    }

    /// Close as a slow consumer (4001), freeing what was queued.
    fn overflow(&self, mut state: MutexGuard<'_, State>) {
        state.frames = VecDeque::new();
        state.tags = None;
        state.bytes = 0;
        state.headroom = 0;
        state.close = Some(CloseRequest {
            code: CloseCode::SLOW_CONSUMER,
            reason: "slow consumer".into(),
            after_ms: None,
        });
        let traced = state.traced_write.take();
        drop(state);
        self.notify.notify_one();
        if let Some(w) = traced {
            w.dropped("slow consumer: the queue passed its bound and was freed");
        }
    }

    /// Conflate at once: when the newest queued frame is a publication of `next`'s channel (a
    /// ticker's usual case), it has not been written and never will be: `next` replaces it, and
    /// a `skip` (merged with one just before it) says what was replaced. O(1): a queue whose back
    /// is another channel's waits for [`shed`](Self::shed) at the bound. True when it replaced
    /// one (`next` then follows a skip).
    fn replace_waiting(state: &mut State, next: &Sheddable) -> bool {
        let Some(tags) = state.tags.as_mut() else {
            return false;
        };
        let same = |t: &Option<Sheddable>, skip: bool| {
            t.as_ref().is_some_and(|t| {
                t.channel == next.channel
                    && t.policy == Backpressure::Conflate
                    && t.skipped_from.is_some() == skip
            })
        };
        if !tags.back().is_some_and(|t| same(t, false)) {
            return false;
        }
        let replaced = tags.pop_back().flatten().expect("checked");
        let frame = state.frames.pop_back().expect("a frame per tag");
        state.bytes -= frame.len();
        let mut from = replaced.offset;
        if tags.back().is_some_and(|t| same(t, true)) {
            let skip = tags.pop_back().flatten().expect("checked");
            from = skip.skipped_from.expect("a skip");
            let frame = state.frames.pop_back().expect("a frame per tag");
            state.bytes -= frame.len();
        }
        let to = replaced.offset;
        let skip = herald_protocol::encode::push_skip(&next.channel, from, to);
        state.bytes += skip.len();
        state.frames.push_back(skip);
        tags.push_back(Some(Sheddable {
            channel: replaced.channel,
            offset: to,
            policy: Backpressure::Conflate,
            skipped_from: Some(from),
            full: None,
        }));
        true
    }

    /// Leave out tagged publications as their policies say, a `skip` push in place of each run;
    /// true when the queue is back within its bound.
    fn shed(&self, state: &mut State) -> bool {
        let Some(tags) = state.tags.take() else {
            return false;
        };
        let frames = std::mem::take(&mut state.frames);
        let mut drop_it = vec![false; frames.len()];
        // Conflate: all but each channel's newest publication.
        let publication = |t: &Option<Sheddable>, policy| {
            t.as_ref()
                .is_some_and(|t| t.skipped_from.is_none() && t.policy == policy)
        };
        let mut newest: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (i, tag) in tags.iter().enumerate().rev() {
            if publication(tag, Backpressure::Conflate) {
                let channel = &tag.as_ref().expect("tagged").channel;
                if !newest.insert(channel) {
                    drop_it[i] = true;
                }
            }
        }
        // Drop oldest: from the front, until the queue is half empty.
        let mut bytes: usize = frames
            .iter()
            .zip(&drop_it)
            .filter(|(_, d)| !**d)
            .map(|(f, _)| f.len())
            .sum();
        for (i, tag) in tags.iter().enumerate() {
            if bytes <= self.limit / 2 {
                break;
            }
            if !drop_it[i] && publication(tag, Backpressure::DropOldest) {
                drop_it[i] = true;
                bytes -= frames[i].len();
            }
        }
        // Rebuild in order. A channel's run of what is left out (with the skips made before,
        // merged) becomes one `skip` just before its next kept publication, or at the end.
        struct Run {
            channel: Arc<str>,
            policy: Backpressure,
            from: u64,
            to: u64,
        }
        let skip = |r: Run| {
            let frame = herald_protocol::encode::push_skip(&r.channel, r.from, r.to);
            let tag = Sheddable {
                channel: r.channel,
                offset: r.to,
                policy: r.policy,
                skipped_from: Some(r.from),
                full: None,
            };
            (frame, Some(tag))
        };
        let mut runs: Vec<Run> = Vec::new();
        let mut kept = VecDeque::with_capacity(frames.len());
        let mut kept_tags = VecDeque::with_capacity(frames.len());
        for ((frame, tag), dropped) in frames.into_iter().zip(tags).zip(drop_it) {
            match tag {
                Some(t) if dropped || t.skipped_from.is_some() => {
                    let from = t.skipped_from.unwrap_or(t.offset);
                    match runs.iter_mut().find(|r| r.channel == t.channel) {
                        Some(run) => {
                            run.from = run.from.min(from);
                            run.to = run.to.max(t.offset);
                        }
                        None => runs.push(Run {
                            channel: t.channel,
                            policy: t.policy,
                            from,
                            to: t.offset,
                        }),
                    }
                }
                mut tag => {
                    let before = tag
                        .as_ref()
                        .and_then(|t| runs.iter().position(|r| r.channel == t.channel));
                    let mut frame = frame;
                    if let Some(i) = before {
                        let (f, t) = skip(runs.swap_remove(i));
                        kept.push_back(f);
                        kept_tags.push_back(t);
                        // Its base was left out: a delta goes in full.
                        if let Some(full) = tag.as_mut().and_then(|t| t.full.take()) {
                            frame = full;
                        }
                    }
                    kept.push_back(frame);
                    kept_tags.push_back(tag);
                }
            }
        }
        for run in runs {
            // Nothing of this channel follows: its next publication must not be a delta.
            if !state.needs_full.contains(&run.channel) {
                state.needs_full.push(run.channel.clone());
            }
            let (f, t) = skip(run);
            kept.push_back(f);
            kept_tags.push_back(t);
        }
        state.bytes = kept.iter().map(Bytes::len).sum();
        state.frames = kept;
        state.tags = Some(kept_tags);
        state.bytes <= self.limit + state.headroom
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
        state.tags = None;
        if let Some(w) = &mut state.traced_write {
            w.take();
        }
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
        state.tags = None;
        if !state.frames.is_empty() {
            if let Some(w) = &mut state.traced_write {
                w.take();
            }
        }
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
        let traced = state.traced_write.take_if(|w| w.taken());
        drop(state);
        if again {
            self.notify.notify_one();
        }
        if let Some(w) = traced {
            w.written("task");
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
    pub fn push_for_fanout(&self, frame: Bytes, tag: Option<Sheddable>) -> Option<bool> {
        let state = self.state.lock().expect("outbound lock");
        // A writer at work takes it when done (`written`, `flush_direct`); pending controls
        // have woken the task already, which drains frames too.
        let direct = state.direct.is_some() && !state.writing && state.controls.is_empty();
        let indirect = state.direct.is_none();
        let first = self.queue(state, frame, indirect, tag)?;
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
        state.tags = None;
        let headroom = std::mem::take(&mut state.headroom);
        let frames: Vec<Bytes> = std::mem::take(&mut state.frames).into();
        if let Some(w) = &mut state.traced_write {
            w.take();
        }
        drop(state);
        let result = writer.try_write(frames);
        let mut state = self.state.lock().expect("outbound lock");
        let mut traced = None;
        match result {
            // Partly: the task flushes the rest, and its `written` ends the span.
            Ok(Flushed::All) => traced = state.traced_write.take_if(|w| w.taken()),
            Ok(Flushed::Partly) => state.needs_flush = true,
            // The queue overflowed meanwhile: what it held was freed, and these go with it.
            Err(_) if state.overflowed() => {}
            Err(frames) => {
                if let Some(w) = &mut state.traced_write {
                    w.put_back();
                }
                // Back in front of whatever came meanwhile, in order, with their headroom.
                state.bytes += frames.iter().map(Bytes::len).sum::<usize>();
                state.headroom += headroom;
                for f in frames.into_iter().rev() {
                    state.frames.push_front(f);
                    // Untagged: written as they are (what came meanwhile keeps its tags).
                    if let Some(tags) = state.tags.as_mut() {
                        tags.push_front(None);
                    }
                }
            }
        }
        state.writing = false;
        let wake = state.has_work();
        drop(state);
        if wake {
            self.notify.notify_one();
        }
        if let Some(w) = traced {
            w.written("direct");
        }
    }

    /// [`push_for_fanout`](Self::push_for_fanout) of a traced publication sampled for a `write`
    /// span: `span` is made, and ended once the frame reaches the socket, unless the connection
    /// is closing or already has a traced write under way (then nothing is made).
    pub fn push_for_fanout_traced(
        &self,
        frame: Bytes,
        tag: Option<Sheddable>,
        span: impl FnOnce() -> Box<TracedWrite>,
    ) -> Option<bool> {
        let mut state = self.state.lock().expect("outbound lock");
        let direct = state.direct.is_some() && !state.writing && state.controls.is_empty();
        let indirect = state.direct.is_none();
        if state.close.is_none() && state.traced_write.is_none() {
            // Set before the frame is queued, under the same lock: whoever drains it takes both.
            state.traced_write = Some(span());
        }
        let first = self.queue(state, frame, indirect, tag)?;
        Some(first && direct)
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

    fn tag(channel: &str, offset: u64, policy: Backpressure) -> Option<Sheddable> {
        Some(Sheddable {
            channel: Arc::from(channel),
            offset,
            policy,
            skipped_from: None,
            full: None,
        })
    }

    fn texts(frames: &[Bytes]) -> Vec<String> {
        frames
            .iter()
            .map(|f| String::from_utf8(f.to_vec()).unwrap())
            .collect()
    }

    /// A 40-byte publication frame for `channel` at `n`.
    fn publication(channel: &str, n: u64) -> Bytes {
        Bytes::from(format!("{channel}{n:<39}"))
    }

    #[test]
    fn a_conflating_queue_keeps_the_newest_per_channel_after_a_skip() {
        let q = Outbound::new(400);
        let c = Backpressure::Conflate;
        assert!(q.push(Bytes::from_static(b"reply")));
        // 200 publications of two channels: 8 KB through a 400-byte queue, never closed.
        for n in 1..=100u64 {
            assert!(
                q.push_sheddable(publication("a", n), tag("a", n, c)),
                "a{n}"
            );
            assert!(
                q.push_sheddable(publication("b", n), tag("b", n, c)),
                "b{n}"
            );
            assert!(q.state.lock().unwrap().bytes <= 400, "bounded");
        }
        let d = q.drain();
        assert!(d.close.is_none(), "shed, not closed");
        let got = texts(&d.frames);
        assert_eq!(got[0], "reply", "replies are never shed");
        // Each channel: one skip covering 1..=k, then k+1..=100 in order, nothing else.
        for ch in ["a", "b"] {
            let mine: Vec<&String> = got
                .iter()
                .filter(|f| f.starts_with(ch) || f.contains(&format!(r#""channel":"{ch}""#)))
                .collect();
            let skip = mine[0];
            let to: u64 = skip
                .split(r#""to":"#)
                .nth(1)
                .and_then(|t| t.trim_end_matches("}}").parse().ok())
                .unwrap_or_else(|| panic!("{ch}: first is a skip: {got:?}"));
            assert!(skip.contains(r#""from":1,"#), "{skip}");
            let rest: Vec<String> = mine[1..].iter().map(|f| f.trim().to_string()).collect();
            let want: Vec<String> = (to + 1..=100).map(|n| format!("{ch}{n}")).collect();
            assert_eq!(
                rest, want,
                "{ch}: after the skip, the rest in order: {got:?}"
            );
        }
    }

    #[test]
    fn a_waiting_publication_of_a_conflating_channel_is_replaced_at_once() {
        let q = Outbound::new(1 << 20);
        let c = Backpressure::Conflate;
        for n in 1..=50u64 {
            assert!(q.push_sheddable(publication("a", n), tag("a", n, c)));
        }
        let got = texts(&q.drain().frames);
        assert_eq!(
            got.iter().map(|f| f.trim()).collect::<Vec<_>>(),
            [r#"{"skip":{"channel":"a","from":1,"to":49}}"#, "a50"],
            "far below the bound, the queue holds the newest only"
        );
        // Another channel's frame at the back: nothing replaced before the bound.
        let d = Backpressure::DropOldest;
        assert!(q.push_sheddable(publication("a", 51), tag("a", 51, c)));
        assert!(q.push_sheddable(publication("b", 1), tag("b", 1, d)));
        assert!(q.push_sheddable(publication("a", 52), tag("a", 52, c)));
        assert_eq!(q.drain().frames.len(), 3);
    }

    #[test]
    fn skips_merge_instead_of_piling_up() {
        let q = Outbound::new(400);
        for n in 1..=1000u64 {
            assert!(q.push_sheddable(publication("a", n), tag("a", n, Backpressure::Conflate)));
        }
        let got = texts(&q.drain().frames);
        let skips = got.iter().filter(|f| f.starts_with(r#"{"skip""#)).count();
        assert_eq!(skips, 1, "{got:?}");
        assert!(
            got[0].starts_with(r#"{"skip":{"channel":"a","from":1,"#),
            "{got:?}"
        );
        assert_eq!(got.last().map(|f| f.trim()), Some("a1000"));
    }

    #[test]
    fn a_drop_oldest_queue_sheds_from_the_front_to_half_and_says_what() {
        let q = Outbound::new(400);
        let d = Backpressure::DropOldest;
        for n in 1..=11u64 {
            assert!(q.push_sheddable(publication("a", n), tag("a", n, d)));
        }
        let drained = q.drain();
        assert!(drained.close.is_none());
        let got = texts(&drained.frames);
        // 11 × 40 passed 400: the oldest went until the queue was at most half full.
        assert!(
            got[0].starts_with(r#"{"skip":{"channel":"a","from":1,"#),
            "{got:?}"
        );
        let first_kept: u64 = got[1].trim()[1..].parse().unwrap();
        let rest: Vec<String> = got[1..].iter().map(|f| f.trim().to_string()).collect();
        let want: Vec<String> = (first_kept..=11).map(|n| format!("a{n}")).collect();
        assert_eq!(rest, want);
        assert!(
            got[0].contains(&format!(r#""to":{}}}"#, first_kept - 1)),
            "{got:?}"
        );
        assert!(rest.len() * 40 <= 200, "{got:?}");
    }

    /// A 40-byte delta frame "dN" whose tag carries its full frame "fN".
    fn delta(channel: &str, n: u64, policy: Backpressure) -> (Bytes, Option<Sheddable>) {
        let mut t = tag(channel, n, policy).unwrap();
        t.full = Some(Bytes::from(format!("f{n:<39}")));
        (Bytes::from(format!("d{n:<39}")), Some(t))
    }

    fn trimmed(frames: &[Bytes]) -> Vec<String> {
        texts(frames).iter().map(|f| f.trim().to_owned()).collect()
    }

    #[test]
    fn a_delta_that_replaces_a_conflated_publication_goes_full() {
        let q = Outbound::new(1 << 20);
        let c = Backpressure::Conflate;
        assert!(q.push_sheddable(publication("a", 1), tag("a", 1, c)));
        let (frame, t) = delta("a", 2, c);
        assert!(q.push_sheddable(frame, t));
        let (frame, t) = delta("a", 3, c);
        assert!(q.push_sheddable(frame, t));
        assert_eq!(
            trimmed(&q.drain().frames),
            [r#"{"skip":{"channel":"a","from":1,"to":2}}"#, "f3"],
            "its base (2) never reached the client"
        );
        // Drained and written: the next delta's base is held.
        let (frame, t) = delta("a", 4, c);
        assert!(q.push_sheddable(frame, t));
        assert_eq!(trimmed(&q.drain().frames), ["d4"]);
    }

    #[test]
    fn a_delta_after_shed_publications_goes_full_in_the_queue_and_after_it() {
        let q = Outbound::new(400);
        let d = Backpressure::DropOldest;
        for n in 1..=11u64 {
            let (frame, t) = delta("a", n, d);
            assert!(q.push_sheddable(frame, t));
        }
        let got = trimmed(&q.drain().frames);
        assert!(got[0].starts_with(r#"{"skip""#), "{got:?}");
        assert!(
            got[1].starts_with('f'),
            "the first kept after the skip: {got:?}"
        );
        assert!(got[2..].iter().all(|f| f.starts_with('d')), "{got:?}");

        // Shed at the end of the queue (another channel fills it): a's next delta goes full,
        // even after a drain.
        for n in 12..=13u64 {
            let (frame, t) = delta("a", n, d);
            assert!(q.push_sheddable(frame, t));
        }
        // 80 bytes of a, then 350 of b (never shed): the tenth passes the bound.
        for n in 1..=10u64 {
            assert!(q.push(Bytes::from(format!("b{n:<34}"))));
        }
        let got = trimmed(&q.drain().frames);
        assert!(
            got.iter()
                .any(|f| f.starts_with(r#"{"skip":{"channel":"a""#)),
            "{got:?}"
        );
        assert!(!got.iter().any(|f| f == "d12" || f == "d13"), "{got:?}");
        let (frame, t) = delta("a", 14, d);
        assert!(q.push_sheddable(frame, t));
        let (frame, t) = delta("a", 15, d);
        assert!(q.push_sheddable(frame, t));
        assert_eq!(trimmed(&q.drain().frames), ["f14", "d15"]);
    }

    #[test]
    fn untagged_frames_are_never_shed_and_a_queue_of_them_still_closes() {
        let q = Outbound::new(10);
        assert!(q.push_sheddable(
            Bytes::from_static(b"12345"),
            tag("a", 1, Backpressure::Conflate)
        ));
        assert!(q.push(Bytes::from_static(b"12345")));
        // Shedding cannot make room: a's only publication is its newest.
        assert!(!q.push(Bytes::from_static(b"123")));
        assert_eq!(
            q.drain().close.map(|c| c.code),
            Some(CloseCode::SLOW_CONSUMER)
        );
    }

    #[test]
    fn a_default_connection_keeps_no_tags() {
        let q = Outbound::new(100);
        assert!(q.push(Bytes::from_static(b"x")));
        assert!(q.state.lock().unwrap().tags.is_none());
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
        assert_eq!(q.push_for_fanout(b("a"), None), Some(false));
        assert!(woken(&q).await);
        assert_eq!(q.drain().frames, vec![b("a")]);
        assert_eq!(q.drain().frames, Vec::<Bytes>::new(), "no role kept");
    }

    #[tokio::test]
    async fn a_direct_write_takes_the_queue_in_order_without_waking_the_task() {
        let w = FakeWriter::new(Some(Flushed::All));
        let q = direct_queue(&w);
        assert_eq!(
            q.push_for_fanout(b("a"), None),
            Some(true),
            "first: the caller writes"
        );
        assert_eq!(
            q.push_for_fanout(b("b"), None),
            Some(false),
            "queued behind it"
        );
        q.flush_direct();
        assert_eq!(*w.wrote.lock().unwrap(), vec![b("a"), b("b")]);
        assert!(!woken(&q).await);
        assert!(q.drain().frames.is_empty());
    }

    #[tokio::test]
    async fn frames_a_direct_write_cannot_take_go_back_in_front_for_the_task() {
        let w = FakeWriter::new(None);
        let q = direct_queue(&w);
        assert_eq!(q.push_for_fanout(b("a"), None), Some(true));
        q.flush_direct();
        assert_eq!(q.push_for_fanout(b("c"), None), Some(false));
        assert!(woken(&q).await);
        let d = q.drain();
        assert_eq!(d.frames, vec![b("a"), b("c")]);
        assert!(!d.needs_flush);
    }

    #[tokio::test]
    async fn a_partial_direct_write_asks_the_task_to_flush() {
        let w = FakeWriter::new(Some(Flushed::Partly));
        let q = direct_queue(&w);
        assert_eq!(q.push_for_fanout(b("a"), None), Some(true));
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
            assert_eq!(during.push_for_fanout(b("b"), None), Some(false));
            assert!(during.drain().busy);
            assert_eq!(during.drain_frames(), None);
        }));
        assert_eq!(q.push_for_fanout(b("a"), None), Some(true));
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
        assert_eq!(q.push_for_fanout(b("pub"), None), Some(false));
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
        assert_eq!(q.push_for_fanout(b("a"), None), None);
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
