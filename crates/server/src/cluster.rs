//! What the nodes of a cluster share with one another, and how a node reads it back: the one
//! mechanism behind the admin UI's cluster view ([`crate::admin::cluster`]: every node's stats
//! snapshot, questions about a user's connections), the Pusher census
//! ([`crate::pusher::census`]: subscriptions per channel) and the Pusher occupancy webhooks
//! ([`crate::pusher::webhooks`]: which nodes host a channel).
//!
//! The hub counts per node only. What the cluster shares goes through broker presence sets, the
//! one piece of state every broker (memory, Redis, NATS) already shares between nodes, readable
//! from any node, with entries that expire when their node dies (after the broker's presence
//! TTL): no broker change. A node keeps one [`entry`] per set, keyed by its name, with a JSON
//! body; a reader parses every entry ([`bodies`]), leaves its own out where it knows its own
//! numbers exactly from its hub, and, where it matters, the nodes that are gone
//! ([`heard_nodes`]). Channel counts are summed the same way for every caller
//! ([`channel_totals`]).
//!
//! Sets that no client may read are named with `!` (`herald!admin:nodes`,
//! `herald!pusher:<app id>:census:<bucket>`): `!` is outside the channel alphabet, so no client
//! can subscribe to them or read them through the API.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_broker::{Broker, BrokerError};
use herald_core::Hub;
use herald_protocol::ClientInfo;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The hub forgets a node 15 s after its last heartbeat; before a node has been up that long it
/// cannot tell a silent node from one it has not heard yet.
pub const HEARD_ALL_AFTER: Duration = Duration::from_secs(15);

/// An entry keyed `key` (a node's name, or a question's id) with `body` as its JSON info.
pub fn entry<T: Serialize>(key: &str, body: Option<&T>) -> ClientInfo {
    ClientInfo {
        user: String::new(),
        client: key.to_owned(),
        info: body.and_then(|b| serde_json::value::to_raw_value(b).ok()),
    }
}

/// Write (or replace) the entry `key` of `set`.
pub async fn put<T: Serialize>(
    broker: &dyn Broker,
    set: &str,
    key: &str,
    body: Option<&T>,
) -> Result<(), BrokerError> {
    broker.add_presence(set, &entry(key, body)).await
}

/// Remove the entry `key` of `set`.
pub async fn remove(broker: &dyn Broker, set: &str, key: &str) -> Result<(), BrokerError> {
    broker.remove_presence(set, key).await
}

/// The entries whose body reads as a `T`, with their keys; the others (no body, another shape:
/// a node of another version) are left out.
pub fn bodies<T: DeserializeOwned>(entries: Vec<ClientInfo>) -> Vec<(String, T)> {
    entries
        .into_iter()
        .filter_map(|who| {
            let body = serde_json::from_str::<T>(who.info?.get()).ok()?;
            Some((who.client, body))
        })
        .collect()
}

/// Read `set`: its entries whose body reads as a `T`, with their keys.
pub async fn read<T: DeserializeOwned>(
    broker: &dyn Broker,
    set: &str,
) -> Result<Vec<(String, T)>, BrokerError> {
    Ok(bodies(broker.presence(set).await?))
}

/// Whether `entries` hold one of a node other than `me`.
pub fn others_in(entries: &[ClientInfo], me: &str) -> bool {
    entries.iter().any(|e| e.client != me)
}

/// The nodes this node has heard from lately (itself included), whose entries count; `None`:
/// this node started less than [`HEARD_ALL_AFTER`] ago and may not have heard every live node
/// yet, so every entry counts. A node that stopped without withdrawing its entries (a crash, a
/// network cut) is left out once the hub forgets it.
pub fn heard_nodes(hub: &Hub) -> Option<HashSet<String>> {
    let me = hub.node_info();
    if Duration::from_secs(me.uptime_s) < HEARD_ALL_AFTER {
        return None;
    }
    Some(hub.nodes().into_iter().map(|n| n.name).collect())
}

/// Subscriptions per channel summed over the cluster: every other node's counts (`me`'s own
/// entry is left out: this node counts from its hub, exactly, in `local`), of the nodes in
/// `live` only when it is given.
pub fn channel_totals<N, C>(
    nodes: impl IntoIterator<Item = (N, C)>,
    me: &str,
    live: Option<&HashSet<String>>,
    local: impl IntoIterator<Item = (String, u64)>,
) -> BTreeMap<String, u64>
where
    N: AsRef<str>,
    C: IntoIterator<Item = (String, u64)>,
{
    let mut totals = BTreeMap::<String, u64>::new();
    for (node, counts) in nodes {
        let node = node.as_ref();
        if node == me || live.is_some_and(|l| !l.contains(node)) {
            continue;
        }
        for (channel, n) in counts {
            *totals.entry(channel).or_default() += n;
        }
    }
    for (channel, n) in local {
        *totals.entry(channel).or_default() += n;
    }
    totals
}

/// Milliseconds since the Unix epoch: when a snapshot was taken, a webhook batch's `time_ms`.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Body {
        n: u64,
    }

    #[test]
    fn entries_read_back_and_other_shapes_are_left_out() {
        let entries = vec![
            entry("a", Some(&Body { n: 1 })),
            entry::<Body>("bare", None),
            entry("other", Some(&serde_json::json!({"m": 2}))),
            entry("b", Some(&Body { n: 2 })),
        ];
        assert_eq!(entries[0].user, "");
        assert_eq!(
            bodies::<Body>(entries),
            vec![("a".into(), Body { n: 1 }), ("b".into(), Body { n: 2 })]
        );
    }

    #[test]
    fn others_in_ignores_this_node() {
        let mine = entry::<Body>("me", None);
        assert!(!others_in(&[], "me"));
        assert!(!others_in(std::slice::from_ref(&mine), "me"));
        assert!(others_in(&[mine, entry::<Body>("b", None)], "me"));
    }

    #[test]
    fn totals_sum_other_live_nodes_and_this_nodes_own() {
        let counts = |c: &[(&str, u64)]| c.iter().map(|(c, n)| (c.to_string(), *n)).collect();
        let nodes: Vec<(&str, Vec<(String, u64)>)> = vec![
            ("a", counts(&[("news", 2), ("sports", 1)])),
            ("b", counts(&[("news", 3)])),
            ("me", counts(&[("news", 100)])),
            ("dead", counts(&[("news", 7), ("gone", 1)])),
        ];
        let local = || vec![("news".to_string(), 4), ("here".to_string(), 1)];
        let all = channel_totals(nodes.clone(), "me", None, local());
        assert_eq!(
            all["news"],
            2 + 3 + 7 + 4,
            "own entry left out, the hub's count added"
        );
        assert_eq!(all["gone"], 1);
        assert_eq!(all["here"], 1);
        let live: HashSet<String> = ["a", "b", "me"].map(String::from).into();
        let live_only = channel_totals(nodes, "me", Some(&live), local());
        assert_eq!(
            live_only,
            BTreeMap::from([
                ("news".into(), 2 + 3 + 4),
                ("sports".into(), 1),
                ("here".into(), 1)
            ])
        );
    }

    #[tokio::test]
    async fn entries_go_through_the_broker() {
        let broker: Arc<dyn Broker> = Arc::new(herald_broker::MemoryBroker::new());
        put(&*broker, "herald!test", "a", Some(&Body { n: 1 }))
            .await
            .unwrap();
        put(&*broker, "herald!test", "b", Some(&Body { n: 2 }))
            .await
            .unwrap();
        put(&*broker, "herald!test", "a", Some(&Body { n: 3 }))
            .await
            .unwrap();
        let mut all = read::<Body>(&*broker, "herald!test").await.unwrap();
        all.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            all,
            vec![("a".into(), Body { n: 3 }), ("b".into(), Body { n: 2 })],
            "one entry per key, the last written"
        );
        remove(&*broker, "herald!test", "a").await.unwrap();
        let left = read::<Body>(&*broker, "herald!test").await.unwrap();
        assert_eq!(left, vec![("b".into(), Body { n: 2 })]);
    }
}
