//! A connection's bounded outbound queue, shared by the hub (which pushes) and the connection's
//! task (which drains it into one write).
//!
//! An idle connection's queue holds no allocation: `VecDeque::new()` allocates on first push. The
//! bound is in bytes; a push that would pass it closes the connection as a slow consumer (4001)
//! and frees what was queued, so one slow client never grows memory or slows the fan-out.

use std::collections::VecDeque;
use std::sync::Mutex;

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

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    bytes: usize,
    controls: Vec<Control>,
    close: Option<CloseRequest>,
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
        let mut state = self.state.lock().expect("outbound lock");
        if state.close.is_some() {
            return false;
        }
        // A frame always fits an empty queue: a reply that carries a large recovery must reach
        // the client, or it would reconnect with the same `since` and overflow again forever.
        if state.bytes > 0 && state.bytes + frame.len() > self.limit {
            state.frames = VecDeque::new();
            state.bytes = 0;
            state.close = Some(CloseRequest {
                code: CloseCode::SLOW_CONSUMER,
                reason: "slow consumer".into(),
                after_ms: None,
            });
            drop(state);
            self.notify.notify_one();
            return false;
        }
        // Only the push that makes the queue non-empty wakes the writer: it drains everything.
        let wake = state.frames.is_empty();
        state.bytes += frame.len();
        state.frames.push_back(frame);
        drop(state);
        if wake {
            self.notify.notify_one();
        }
        true
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
    pub fn drain_frames(&self) -> Vec<Bytes> {
        let mut state = self.state.lock().expect("outbound lock");
        state.bytes = 0;
        std::mem::take(&mut state.frames).into()
    }

    /// Wake the connection task, so that it drains what [`drain_frames`](Self::drain_frames)
    /// left behind.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Take everything queued.
    pub fn drain(&self) -> Drained {
        let mut state = self.state.lock().expect("outbound lock");
        state.bytes = 0;
        Drained {
            frames: std::mem::take(&mut state.frames).into(),
            controls: std::mem::take(&mut state.controls),
            close: state.close.clone(),
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
    async fn drain_frames_leaves_controls_and_close() {
        let q = Outbound::new(100);
        q.push(Bytes::from_static(b"a"));
        q.control(Control::Subscribe("c".into()));
        assert_eq!(q.drain_frames(), vec![Bytes::from_static(b"a")]);
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
