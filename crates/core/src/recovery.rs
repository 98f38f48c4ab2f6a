//! The recovery decision: all or nothing, never partial.

use herald_broker::HistoryResult;
use herald_protocol::types::PublicationWire;
use herald_protocol::{Publication, StreamPosition};
use serde::Serialize;

/// The result of `subscribe` (and of each channel in `connect.subs`).
#[derive(Debug, Clone)]
pub struct SubscribeResult {
    /// The stream's epoch and newest offset when the subscription took effect. Live publications
    /// that follow have greater offsets.
    pub position: StreamPosition,
    /// Whether the namespace keeps history, so that this subscription can be recovered later.
    pub recoverable: bool,
    /// With `since`: whether every missed publication is in `publications`.
    pub recovered: Option<bool>,
    /// Recovered publications, in offset order.
    pub publications: Vec<Publication>,
}

impl Serialize for SubscribeResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Wire<'a> {
            epoch: &'a str,
            offset: u64,
            recoverable: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            recovered: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            publications: Option<Vec<PublicationWire<'a>>>,
        }
        Wire {
            epoch: &self.position.epoch,
            offset: self.position.offset,
            recoverable: self.recoverable,
            recovered: self.recovered,
            publications: self.recovered.map(|_| {
                self.publications
                    .iter()
                    .map(PublicationWire::from)
                    .collect()
            }),
        }
        .serialize(s)
    }
}

impl SubscribeResult {
    /// Bytes the recovered publications take in a reply (data and info, roughly as encoded).
    fn recovered_bytes(&self) -> usize {
        self.publications
            .iter()
            .map(|p| {
                p.data.len()
                    + p.info
                        .as_ref()
                        .map_or(0, |i| i.user.len() + i.client.len() + 64)
                    + 32
            })
            .sum()
    }

    /// Whether the reply carries recovered publications.
    pub fn carries_publications(&self) -> bool {
        !self.publications.is_empty()
    }

    /// Take this result's recovered publications out of `budget`; past it, recovery fails
    /// plainly (`recovered: false`) instead of growing the reply. Returns false then.
    pub fn charge(&mut self, budget: &mut usize) -> bool {
        if self.recovered != Some(true) {
            return true;
        }
        let bytes = self.recovered_bytes();
        if bytes <= *budget {
            *budget -= bytes;
            return true;
        }
        self.recovered = Some(false);
        self.publications = Vec::new();
        false
    }
}

/// Decide what a subscription with an optional `since` gets, from the history read made after the
/// node's broker subscription took effect.
pub fn decide(
    since: Option<&StreamPosition>,
    history: HistoryResult,
    recoverable: bool,
) -> SubscribeResult {
    let Some(_) = since else {
        return SubscribeResult {
            position: history.position,
            recoverable,
            recovered: None,
            publications: Vec::new(),
        };
    };
    let recovered = recoverable && history.continuous;
    SubscribeResult {
        position: history.position,
        recoverable,
        recovered: Some(recovered),
        publications: if recovered {
            history.publications
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn history(continuous: bool, offsets: &[u64]) -> HistoryResult {
        HistoryResult {
            position: StreamPosition {
                epoch: "e".into(),
                offset: 10,
            },
            publications: offsets
                .iter()
                .map(|o| Publication {
                    offset: *o,
                    data: Bytes::from_static(b"1"),
                    info: None,
                    tags: Default::default(),
                })
                .collect(),
            continuous,
            stored_at_ms: Vec::new(),
        }
    }

    fn since(offset: u64) -> StreamPosition {
        StreamPosition {
            epoch: "e".into(),
            offset,
        }
    }

    #[test]
    fn fresh_subscribe_has_no_recovery_fields() {
        let r = decide(None, history(true, &[]), true);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, r#"{"epoch":"e","offset":10,"recoverable":true}"#);
    }

    #[test]
    fn continuous_history_recovers_everything() {
        let r = decide(Some(&since(8)), history(true, &[9, 10]), true);
        assert_eq!(r.recovered, Some(true));
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"epoch":"e","offset":10,"recoverable":true,"recovered":true,"publications":[{"offset":9,"data":1},{"offset":10,"data":1}]}"#
        );
    }

    #[test]
    fn broken_history_recovers_nothing() {
        let r = decide(Some(&since(2)), history(false, &[]), true);
        assert_eq!(r.recovered, Some(false));
        assert!(r.publications.is_empty());
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.ends_with(r#""recovered":false,"publications":[]}"#),
            "{json}"
        );
    }

    #[test]
    fn namespace_without_history_never_recovers() {
        let r = decide(Some(&since(10)), history(true, &[]), false);
        assert_eq!(r.recovered, Some(false));
    }
}
