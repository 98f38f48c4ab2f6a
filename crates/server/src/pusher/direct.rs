//! The fan-out's direct writes to a Pusher connection (herald_core::outbound, "Direct writes").
//!
//! The hub queues its own frames (`{"pub": …}`) for every subscriber. Without a direct writer
//! each delivery wakes the connection's task, which translates the frame into a Pusher event and
//! writes it. [`PusherDirect`] does the same from the fan-out, as Herald's WebSocket does for its
//! frames (crate::ws::shared): the event comes from [`SharedFrames`] (translated once per
//! publication, the same bytes for every subscriber), the socket that a publication excludes
//! gets nothing ([`SharedFrames::event_for`], the one place that decides it for the task too),
//! and the connection's task is not woken.
//!
//! What it does not take goes to the task, untouched and in order (`Err(frames)`):
//! - any frame that needs the connection's state: presence joins and leaves (members, the
//!   watchlist), anything else the hub pushes that is not a publication;
//! - everything, once the connection asked for `herald_offset` on a channel ([`leave`]): the
//!   positioned event depends on the connection's subscription, which only its task knows.
//!
//! Frames the connection queues itself (replies, `subscription_count`, …) start with
//! [`wire::OWN_FRAME_PREFIX`] and are written as they are, as the task would. So are the events
//! this writer translated but could not write (the socket was busy): back in the queue, the
//! task's `PusherConn::translate` passes them on unchanged.
//!
//! [`leave`]: PusherDirect::leave

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use herald_core::outbound::{DirectWrite, Flushed};

use super::apps::PusherApp;
use super::shared::SharedFrames;
use super::wire;
use crate::compression;
use crate::ws::shared::{Locked, BATCH_BYTES};

/// A Pusher connection's direct writer. See the module docs.
pub(crate) struct PusherDirect {
    ws: Arc<Locked>,
    frames: Arc<SharedFrames>,
    app: Arc<PusherApp>,
    socket_id: Arc<str>,
    /// Set for good when the connection's task must translate everything ([`Self::leave`]).
    left: AtomicBool,
}

impl PusherDirect {
    pub(crate) fn new(
        ws: Arc<Locked>,
        frames: Arc<SharedFrames>,
        app: Arc<PusherApp>,
        socket_id: Arc<str>,
    ) -> Self {
        PusherDirect {
            ws,
            frames,
            app,
            socket_id,
            left: AtomicBool::new(false),
        }
    }

    /// From now on take nothing: the connection's task writes every frame. (Called by the task
    /// before it subscribes with `herald_offset`, so before the hub delivers that channel.)
    pub(crate) fn leave(&self) {
        self.left.store(true, Ordering::Release);
    }
}

impl DirectWrite for PusherDirect {
    fn try_write(&self, frames: Vec<Bytes>) -> Result<Flushed, Vec<Bytes>> {
        if self.left.load(Ordering::Acquire) {
            return Err(frames);
        }
        let events = events(frames, &self.frames, &self.app, &self.socket_id)?;
        if events.is_empty() {
            return Ok(Flushed::All); // all excluded: nothing to write
        }
        // One WebSocket message per event, handed over after one ready check: keep the batch
        // within what Herald's writer allows in one message.
        if events.iter().map(Bytes::len).sum::<usize>() > BATCH_BYTES {
            return Err(events);
        }
        self.ws.try_write_with(events, |events, compress| {
            events
                .into_iter()
                .map(|event| compression::text(event, compress, true))
                .collect()
        })
    }
}

/// What the connection of `socket_id` receives for queued `frames`, in order: its own frames as
/// they are, publications as their (shared) plain events, excluded ones left out. `Err(frames)`,
/// untouched, when one of them needs the connection's task (see the module docs).
fn events(
    frames: Vec<Bytes>,
    shared: &SharedFrames,
    app: &PusherApp,
    socket_id: &str,
) -> Result<Vec<Bytes>, Vec<Bytes>> {
    let own = |f: &Bytes| f.starts_with(wire::OWN_FRAME_PREFIX);
    let publication = |f: &Bytes| f.starts_with(b"{\"pub\":");
    if !frames.iter().all(|f| own(f) || publication(f)) {
        return Err(frames);
    }
    Ok(frames
        .into_iter()
        .filter_map(|f| match own(&f) {
            true => Some(f),
            // As `PusherConn::translate`: another app's channel or an excluded socket, nothing.
            false => Some(shared.event_for(&f, app, socket_id)?.plain.clone()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pusher::shared::tests::{app, frame as publication};
    use herald_protocol::ClientInfo;

    fn text(b: &Bytes) -> &str {
        std::str::from_utf8(b).unwrap()
    }

    #[test]
    fn publications_become_the_shared_plain_event_and_the_excluded_socket_gets_none() {
        let shared = SharedFrames::default();
        let app = app();
        let hello = wire::pong();
        let to_all = publication("pusher:7:news", 1, r#"{"event":"e","data":"x"}"#);
        let not_me = publication(
            "pusher:7:news",
            2,
            r#"{"event":"client-e","data":{"a":1},"user_id":"u","exclude":"1.2"}"#,
        );
        let other_app = publication("pusher:8:news", 3, r#"{"event":"e","data":"x"}"#);
        let frames = vec![hello.clone(), to_all.clone(), not_me.clone(), other_app];

        let got = events(frames.clone(), &shared, &app, "1.2").unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], hello, "the connection's own frame as it is");
        assert_eq!(
            text(&got[1]),
            r#"{"event":"e","channel":"news","data":"x"}"#
        );
        // The very bytes every subscriber (and the task's translation) gets: encoded once.
        let cached = shared.publication(&to_all, &app).unwrap();
        assert_eq!(got[1].as_ptr(), cached.plain.as_ptr());

        // Another socket gets the client event, with its sender's user_id, no herald_offset.
        let got = events(frames, &shared, &app, "3.4").unwrap();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            text(&got[2]),
            r#"{"event":"client-e","channel":"news","data":{"a":1},"user_id":"u"}"#
        );
    }

    #[test]
    fn presence_changes_and_other_pushes_go_to_the_task_untouched() {
        let shared = SharedFrames::default();
        let app = app();
        let who = ClientInfo {
            user: "u".into(),
            client: "1.2".into(),
            info: None,
        };
        let join = herald_protocol::encode::push_presence_change(true, "pusher:7:presence-a", &who);
        let skip = herald_protocol::encode::push_skip("pusher:7:news", 1, 2);
        for odd in [join, skip] {
            let frames = vec![
                publication("pusher:7:news", 1, r#"{"event":"e","data":"x"}"#),
                odd,
            ];
            assert_eq!(
                events(frames.clone(), &shared, &app, "3.4"),
                Err(frames),
                "the whole batch, as queued"
            );
        }
    }
}
