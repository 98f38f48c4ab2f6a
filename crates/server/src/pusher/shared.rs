//! Pusher events translated once per publication, not once per subscriber.
//!
//! The hub encodes a publication once and pushes the same bytes (one allocation) to every
//! subscriber. The first Pusher connection to translate them stores the result under the
//! allocation's address; the others find it there. An entry keeps the source bytes alive, so the
//! address cannot be reused by another frame while the entry exists: a hit is always the same
//! publication.
//!
//! Channel names are shared too: every translation of a channel's publications carries the same
//! `Arc<str>` while the name stays in [`NAME_SLOTS`], so that a connection can recognise the
//! channel of its previous delivery by the pointer alone (see `PusherConn::translate`) instead of
//! looking the name up in its own subscription map, whose memory is cold by the time the next
//! publication arrives.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::apps::PusherApp;
use super::wire;

/// Slots in the cache: publications in flight at once that still hit (older ones are translated
/// again, which is only slower). Bounds the memory the cache holds to this many frames.
const SLOTS: usize = 256;

/// Slots for shared channel names. A name pushed out by another with the same slot is allocated
/// again at its next publication (its connections then look it up once more: only slower).
const NAME_SLOTS: usize = 64;

/// A publication as Pusher clients receive it.
pub struct Translated {
    /// The Pusher channel (the same allocation for every publication of the channel while it
    /// keeps its name slot).
    pub channel: Arc<str>,
    /// The socket that must not receive it.
    pub exclude: Option<String>,
    /// The event frame.
    pub plain: Bytes,
    /// The event frame with `herald_offset` (the catch-up extension).
    pub positioned: Bytes,
}

/// A cached translation and the source bytes it is kept under (and keeps alive).
type Slot = Mutex<Option<(Bytes, Arc<Translated>)>>;

/// See the module docs.
pub struct SharedFrames {
    slots: Box<[Slot]>,
    names: Box<[Mutex<Option<Arc<str>>>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for SharedFrames {
    fn default() -> Self {
        SharedFrames {
            slots: (0..SLOTS).map(|_| Mutex::new(None)).collect(),
            names: (0..NAME_SLOTS).map(|_| Mutex::new(None)).collect(),
            hasher: Default::default(),
        }
    }
}

impl SharedFrames {
    /// The Pusher event of a hub publication frame (`{"pub": …}`) of `app`'s channels; `None`
    /// for anything else.
    pub fn publication(&self, frame: &Bytes, app: &PusherApp) -> Option<Arc<Translated>> {
        let address = frame.as_ptr() as usize;
        let slot = &self.slots[(address >> 4) % SLOTS];
        {
            let cached = slot.lock().expect("frames lock");
            if let Some((source, translated)) = cached.as_ref() {
                if source.as_ptr() as usize == address && source.len() == frame.len() {
                    return Some(translated.clone());
                }
            }
        }
        let translated = Arc::new(translate(frame, app, |c| self.name(c))?);
        *slot.lock().expect("frames lock") = Some((frame.clone(), translated.clone()));
        Some(translated)
    }

    /// The event socket `socket_id` of `app` receives for a hub publication frame: `None` when
    /// the frame is not one of the app's publications or the publication excludes the socket
    /// (the HTTP API's `socket_id`, a client event's sender). The one place that decides it, for
    /// the connection's task (`PusherConn::translate`) and the fan-out's direct writes alike
    /// (super::direct).
    pub fn event_for(
        &self,
        frame: &Bytes,
        app: &PusherApp,
        socket_id: &str,
    ) -> Option<Arc<Translated>> {
        let event = self.publication(frame, app)?;
        (event.exclude.as_deref() != Some(socket_id)).then_some(event)
    }

    /// The shared allocation of a channel name (once per publication, not per delivery).
    fn name(&self, channel: &str) -> Arc<str> {
        let slot = &self.names[(self.hasher.hash_one(channel) as usize) % NAME_SLOTS];
        let mut held = slot.lock().expect("names lock");
        match held.as_ref() {
            Some(name) if **name == *channel => name.clone(),
            _ => held.insert(Arc::from(channel)).clone(),
        }
    }
}

fn translate(
    frame: &[u8],
    app: &PusherApp,
    name: impl FnOnce(&str) -> Arc<str>,
) -> Option<Translated> {
    let push: wire::HubPush<'_> = serde_json::from_slice(frame).ok()?;
    let p = push.publication?;
    let channel = app.external(&p.channel)?;
    let envelope = wire::envelope_of(p.data);
    let event = |offset| {
        wire::event(
            &envelope.event,
            channel,
            envelope.data,
            envelope.user_id.as_deref(),
            offset,
        )
    };
    Some(Translated {
        channel: name(channel),
        exclude: envelope.exclude.map(|e| e.into_owned()),
        plain: event(None),
        positioned: event(Some(p.offset)),
    })
}

/// Also the fixtures of `super::direct`'s tests.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pusher::apps::{AppConfig, PusherApp};
    use herald_protocol::encode::push_publication;
    use herald_protocol::Publication;

    pub(crate) fn app() -> PusherApp {
        PusherApp::new(AppConfig {
            id: "7".into(),
            key: "k".into(),
            secret: "s".into(),
            ..AppConfig::default()
        })
    }

    pub(crate) fn frame(channel: &str, offset: u64, data: &str) -> Bytes {
        let p = Publication {
            offset,
            data: Bytes::copy_from_slice(data.as_bytes()),
            info: None,
            tags: Default::default(),
        };
        push_publication(channel, &p)
    }

    #[test]
    fn one_translation_per_publication() {
        let frames = SharedFrames::default();
        let app = app();
        let a = frame(
            "pusher:7:news",
            3,
            r#"{"event":"e","data":"x","exclude":"1.2"}"#,
        );
        let first = frames.publication(&a, &app).unwrap();
        let again = frames.publication(&a.clone(), &app).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the same bytes hit the cache");
        assert_eq!(&*first.channel, "news");
        assert_eq!(first.exclude.as_deref(), Some("1.2"));
        let v: serde_json::Value = serde_json::from_slice(&first.positioned).unwrap();
        assert_eq!(v["herald_offset"], 3);
        // Equal content in another allocation is translated on its own (and equally).
        let b = frame(
            "pusher:7:news",
            3,
            r#"{"event":"e","data":"x","exclude":"1.2"}"#,
        );
        let other = frames.publication(&b, &app).unwrap();
        assert_eq!(other.plain, first.plain);
        assert!(
            Arc::ptr_eq(&other.channel, &first.channel),
            "one name per channel"
        );
        assert!(frames
            .publication(&frame("pusher:8:news", 1, "1"), &app)
            .is_none());
    }
}
