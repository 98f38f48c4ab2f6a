//! Delta compression of live publications (`subscribe` with `delta: "fossil"`).
//!
//! A subscriber that asked for deltas gets each live publication with its data as a JSON string:
//! the publication's JSON text when it is sent in full (`delta: false`), or a Fossil delta from
//! the previous publication's text (`delta: true`) when the connection was last queued exactly
//! the previous offset of the channel. The channel keeps the previous publication's data on the
//! node while it has delta subscribers; the delta is computed at most once per publication, and
//! only when a subscriber can take it, and its frame is shared by all of them. A delta that is not
//! smaller than the full frame, or not valid UTF-8 (a copy may cut a multi-byte character), is not
//! used: the full text goes instead.
//!
//! The connection's queue may still shed publications of a `conflate`/`drop_oldest` namespace:
//! each delta frame carries its full frame in its tag, and the queue sends that instead whenever
//! what came before it was left out (see [`crate::outbound`]).

use bytes::Bytes;
use herald_protocol::encode::{push_publication, push_publication_text};
use herald_protocol::Publication;

/// A delta subscriber's state on its channel.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DeltaSubscriber {
    /// The offset of the last publication queued for it in text form (full or delta), which its
    /// client keeps as the next delta's base. `None`: the next publication goes full.
    pub holds: Option<u64>,
}

/// A Fossil delta turning `previous` into `next`, if it is valid UTF-8 (a JSON string can carry
/// it as it is).
pub fn fossil_delta(previous: &[u8], next: &[u8]) -> Option<String> {
    // The crate's argument order: the target first, then the source.
    String::from_utf8(fossil_delta::delta(next, previous)).ok()
}

/// The text-form frames of one publication for the channel's delta subscribers, made at most
/// once each, when a subscriber first needs them.
pub(crate) struct DeltaFrames<'a> {
    channel: &'a str,
    publication: &'a Publication,
    /// The data of the channel's previous offset (`publication.offset - 1`), if the node kept it.
    previous: Option<&'a Bytes>,
    full: Option<Bytes>,
    /// `Some(None)`: computed, and not worth sending.
    delta: Option<Option<Bytes>>,
    /// Deltas computed (for tests and metrics).
    pub(crate) computed: usize,
}

impl<'a> DeltaFrames<'a> {
    /// `previous`: the channel's kept publication (offset and data), if any.
    pub(crate) fn new(
        channel: &'a str,
        publication: &'a Publication,
        previous: Option<&'a (u64, Bytes)>,
    ) -> Self {
        let previous = previous
            .filter(|(offset, _)| offset.checked_add(1) == Some(publication.offset))
            .map(|(_, data)| data);
        DeltaFrames {
            channel,
            publication,
            previous,
            full: None,
            delta: None,
            computed: 0,
        }
    }

    /// The frame for a delta subscriber whose client holds `holds`, and, when that frame is a
    /// delta, the full frame that may replace it.
    pub(crate) fn for_subscriber(&mut self, holds: Option<u64>) -> (Bytes, Option<Bytes>) {
        let follows = holds.and_then(|h| h.checked_add(1)) == Some(self.publication.offset);
        if follows {
            if let Some(delta) = self.delta() {
                return (delta, Some(self.full()));
            }
        }
        (self.full(), None)
    }

    /// The publication in full, its data as text (`delta: false`).
    pub(crate) fn full(&mut self) -> Bytes {
        let (channel, p) = (self.channel, self.publication);
        self.full
            .get_or_insert_with(|| match std::str::from_utf8(&p.data) {
                Ok(text) => push_publication_text(channel, p, text, false),
                // Never for validated data; the plain form tells the client to drop its base.
                Err(_) => push_publication(channel, p),
            })
            .clone()
    }

    /// The delta frame, if the previous data is kept and the delta is worth sending.
    fn delta(&mut self) -> Option<Bytes> {
        if let Some(made) = &self.delta {
            return made.clone();
        }
        let previous = self.previous?;
        self.computed += 1;
        let full = self.full();
        let made = fossil_delta(previous, &self.publication.data)
            .map(|d| push_publication_text(self.channel, self.publication, &d, true))
            .filter(|frame| frame.len() < full.len());
        self.delta = Some(made.clone());
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publication(offset: u64, data: &str) -> Publication {
        Publication {
            offset,
            data: Bytes::from(data.to_owned()),
            info: None,
            tags: Default::default(),
        }
    }

    fn book(bid: u32) -> String {
        let levels: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"price":{},"size":{}}}"#, 100 + i, i * 7))
            .collect();
        format!(
            r#"{{"symbol":"ABC","bid":{bid},"levels":[{}]}}"#,
            levels.join(",")
        )
    }

    fn pub_of(frame: &Bytes) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_slice(frame).unwrap();
        v["pub"].clone()
    }

    #[test]
    fn one_delta_is_shared_by_every_subscriber_that_holds_the_previous_offset() {
        let (old, new) = (book(1), book(2));
        let kept = (6, Bytes::from(old.clone()));
        let p = publication(7, &new);
        let mut frames = DeltaFrames::new("c", &p, Some(&kept));
        let (a, full_a) = frames.for_subscriber(Some(6));
        let (b, _) = frames.for_subscriber(Some(6));
        assert_eq!(frames.computed, 1);
        assert_eq!(a, b, "the same frame");
        assert!(a.len() < full_a.as_ref().unwrap().len() / 4);
        let delta = pub_of(&a);
        assert_eq!(delta["delta"], true);
        let applied = fossil_delta::apply(&old, delta["data"].as_str().unwrap()).unwrap();
        assert_eq!(applied, new.as_bytes());
        let full = pub_of(full_a.as_ref().unwrap());
        assert_eq!(full["delta"], false);
        assert_eq!(full["data"].as_str().unwrap(), new);
    }

    #[test]
    fn a_subscriber_without_the_previous_offset_gets_the_full_text_and_no_delta_is_made() {
        let kept = (6, Bytes::from(book(1)));
        let p = publication(7, &book(2));
        let mut frames = DeltaFrames::new("c", &p, Some(&kept));
        for holds in [None, Some(5), Some(7)] {
            let (frame, full) = frames.for_subscriber(holds);
            assert!(full.is_none());
            assert_eq!(pub_of(&frame)["delta"], false);
        }
        assert_eq!(frames.computed, 0);
    }

    #[test]
    fn without_the_previous_data_kept_it_goes_full() {
        let kept = (5, Bytes::from(book(1)));
        let p = publication(7, &book(2));
        let (frame, _) = DeltaFrames::new("c", &p, Some(&kept)).for_subscriber(Some(6));
        assert_eq!(pub_of(&frame)["delta"], false);
        let (frame, _) = DeltaFrames::new("c", &p, None).for_subscriber(Some(6));
        assert_eq!(pub_of(&frame)["delta"], false);
    }

    #[test]
    fn a_delta_that_is_not_smaller_is_not_sent() {
        let kept = (
            1,
            Bytes::from_static(b"\"abcdefghijklmnopqrstuvwxyz0123456789\""),
        );
        let p = publication(2, "[1,2,3]");
        let mut frames = DeltaFrames::new("c", &p, Some(&kept));
        let (frame, full) = frames.for_subscriber(Some(1));
        assert_eq!(frames.computed, 1);
        assert!(full.is_none());
        assert_eq!(pub_of(&frame)["data"], "[1,2,3]");
    }

    #[test]
    fn non_ascii_text_reconstructs_exactly_or_goes_full() {
        let old = format!(r#"{{"name":"{}","n":1}}"#, "é日本語ü".repeat(20));
        let new = format!(r#"{{"name":"{}","n":2}}"#, "é日本語ü".repeat(20));
        let kept = (1, Bytes::from(old.clone()));
        let p = publication(2, &new);
        let (frame, _) = DeltaFrames::new("c", &p, Some(&kept)).for_subscriber(Some(1));
        let v = pub_of(&frame);
        let text = v["data"].as_str().unwrap();
        let got = if v["delta"] == true {
            String::from_utf8(fossil_delta::apply(&old, text).unwrap()).unwrap()
        } else {
            text.to_owned()
        };
        assert_eq!(got, new);
    }
}
