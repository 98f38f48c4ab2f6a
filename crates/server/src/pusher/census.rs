//! Subscriptions per Pusher channel counted for the whole cluster, for the HTTP API's channel
//! queries (`GET /apps/{id}/channels`, `GET /apps/{id}/channels/{name}`).
//!
//! The hub counts subscribers per node only. So every node shares its counts through broker
//! presence sets, as the admin's cluster view and the occupancy webhooks share theirs
//! ([`crate::cluster`]: the entries, which nodes count, the sums). Any node then answers for the
//! cluster: its own counts exact from the hub, the other nodes' from those sets.
//!
//! An app's channels are spread over [`BUCKETS`] sets, `herald!pusher:<app id>:census:<bucket>`
//! (`!` is outside the channel alphabet: no client can subscribe to them or read them), by an
//! FNV-1a hash of the name, stable across builds and versions. A node's entry in one set lists its
//! subscription counts of that bucket's channels; a node with no channel in a bucket has no entry
//! there. One channel's query reads one set; the channel list reads all of them, concurrently.
//!
//! Writes: a Pusher subscribe or unsubscribe on the node wakes the writer, which rewrites the
//! entries whose counts changed, then waits [`WRITE_GAP`] before the next pass (changes meanwhile
//! are gathered into it). It also looks every [`RESCAN_EVERY`] without being woken, for Herald
//! protocol subscribers of Pusher channels and for writes that failed. So another node's change is
//! seen within [`WRITE_GAP`] plus a broker round trip (within [`RESCAN_EVERY`] for a Herald
//! protocol subscriber); the answering node's own are exact.
//!
//! Nodes that are gone: a node withdraws its entries when it shuts down. One that stops without
//! doing so (crash, network cut) is left out once the hub has not heard its heartbeat for 15 s,
//! and the broker drops its entries after its presence TTL. A node that started less than
//! [`HEARD_ALL_AFTER`](crate::cluster::HEARD_ALL_AFTER) ago may not have heard every live node
//! yet, so it counts every entry ([`crate::cluster::heard_nodes`]).
//! Entries are keyed by node name: names must be unique in the cluster (the default ones are).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use herald_broker::BrokerError;
use herald_core::Hub;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};

use super::apps::{PusherApp, Registry, NAMESPACE};
use crate::cluster;

/// Presence sets per app.
pub const BUCKETS: usize = 16;
/// Least time between two write passes of a node.
pub const WRITE_GAP: Duration = Duration::from_secs(1);
/// Longest time between two write passes of a node.
pub const RESCAN_EVERY: Duration = Duration::from_secs(10);

/// Subscriptions per Pusher channel (the name without the app's prefix).
pub type Counts = BTreeMap<String, u64>;

/// A node's presence entry in one set.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    channels: Counts,
}

/// The bucket of a Pusher channel: FNV-1a, so every node and version agrees.
pub fn bucket_of(channel: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in channel.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % BUCKETS as u64) as usize
}

fn set_of(app_id: &str, bucket: usize) -> String {
    format!("herald!pusher:{app_id}:census:{bucket}")
}

/// What this node wrote, per (app id, bucket); `None` once withdrawn.
type Written = Option<HashMap<(String, usize), Counts>>;

/// See the module docs.
pub struct Census {
    hub: Hub,
    /// The apps in force (they may change at run time).
    apps: Arc<Registry>,
    wake: Notify,
    /// Held for a whole write pass, so that a withdrawal never races a write.
    written: Mutex<Written>,
}

impl Census {
    /// Start sharing this node's counts of `apps`' channels.
    pub fn start(hub: Hub, apps: Arc<Registry>) -> Arc<Census> {
        let census = Arc::new(Census {
            hub,
            apps,
            wake: Notify::new(),
            written: Mutex::new(Some(HashMap::new())),
        });
        tokio::spawn(census.clone().run());
        census
    }

    /// This node's subscriptions changed: share them soon.
    pub fn changed(&self) {
        self.wake.notify_one();
    }

    async fn run(self: Arc<Self>) {
        self.clear_leftovers().await;
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(RESCAN_EVERY) => {}
            }
            if !self.write_changes().await {
                return;
            }
            tokio::time::sleep(WRITE_GAP).await;
        }
    }

    /// A node restarted under a configured name finds its previous run's entries: remove them.
    async fn clear_leftovers(&self) {
        let node = self.hub.node_name();
        let broker = self.hub.broker();
        let sets: Vec<String> = self
            .apps
            .all()
            .iter()
            .flat_map(|app| (0..BUCKETS).map(|b| set_of(&app.config.id, b)))
            .collect();
        let removals = sets.iter().map(|set| cluster::remove(&**broker, set, node));
        for result in join_all(removals).await {
            if let Err(e) = result {
                tracing::debug!(cause = %e, "pusher census: old entry not removed");
            }
        }
    }

    /// Rewrite the entries whose counts changed since the last pass. `false` once withdrawn.
    async fn write_changes(&self) -> bool {
        let mut guard = self.written.lock().await;
        let Some(written) = guard.as_mut() else {
            return false;
        };
        let local = self.local_all();
        let broker = self.hub.broker();
        let node = self.hub.node_name();
        let mut failed = 0;
        // The apps in force, and those no longer in force whose entries are still written
        // (their counts are now empty: the entries are removed).
        let mut ids: std::collections::BTreeSet<String> = self
            .apps
            .all()
            .iter()
            .map(|a| a.config.id.clone())
            .collect();
        ids.extend(written.keys().map(|(id, _)| id.clone()));
        let in_force: HashSet<String> = self
            .apps
            .all()
            .iter()
            .map(|a| a.config.id.clone())
            .collect();
        for id in &ids {
            let mut buckets = vec![Counts::new(); BUCKETS];
            let local = local.get(id.as_str()).filter(|_| in_force.contains(id));
            for (name, n) in local.into_iter().flatten() {
                buckets[bucket_of(name)].insert(name.clone(), *n);
            }
            for (bucket, counts) in buckets.into_iter().enumerate() {
                let key = (id.clone(), bucket);
                let unchanged = match written.get(&key) {
                    Some(before) => *before == counts,
                    None => counts.is_empty(),
                };
                if unchanged {
                    continue;
                }
                let set = set_of(id, bucket);
                let result = if counts.is_empty() {
                    cluster::remove(&**broker, &set, node).await
                } else {
                    let entry = Entry {
                        channels: counts.clone(),
                    };
                    cluster::put(&**broker, &set, node, Some(&entry)).await
                };
                match result {
                    Ok(()) if counts.is_empty() => {
                        written.remove(&key);
                    }
                    Ok(()) => {
                        written.insert(key, counts);
                    }
                    Err(e) => {
                        failed += 1;
                        tracing::debug!(set, cause = %e, "pusher census entry not written");
                    }
                }
            }
        }
        if failed > 0 {
            // One line per pass, however many entries: the broker is likely down.
            tracing::warn!(
                failed,
                "pusher channel counts not shared with the cluster; tried again at the next pass"
            );
        }
        true
    }

    /// Stop sharing and remove this node's entries (at shutdown: the node's subscriptions are
    /// about to end with it).
    pub async fn withdraw(&self) {
        let mut guard = self.written.lock().await;
        let Some(written) = guard.take() else {
            return;
        };
        let broker = self.hub.broker();
        let node = self.hub.node_name();
        let sets: Vec<String> = written.keys().map(|(id, b)| set_of(id, *b)).collect();
        let removals = sets.iter().map(|set| cluster::remove(&**broker, set, node));
        for result in join_all(removals).await {
            if let Err(e) = result {
                tracing::warn!(cause = %e, "pusher census entry not withdrawn");
            }
        }
    }

    /// This node's subscriptions per app id and Pusher channel. Users' own channels are left out:
    /// they are not listed (as with Pusher).
    fn local_all(&self) -> HashMap<String, Counts> {
        let mut all: HashMap<String, Counts> = HashMap::new();
        for (internal, n) in self.hub.channels() {
            let Some((id, name)) = internal
                .strip_prefix(NAMESPACE)
                .and_then(|rest| rest.strip_prefix(':'))
                .and_then(|rest| rest.split_once(':'))
            else {
                continue;
            };
            if n > 0 && !name.starts_with('#') {
                all.entry(id.to_owned())
                    .or_default()
                    .insert(name.to_owned(), n as u64);
            }
        }
        all
    }

    /// Every node's entry among `app`'s sets in `buckets`: (node, its counts).
    async fn entries(
        &self,
        app: &PusherApp,
        buckets: &[usize],
    ) -> Result<Vec<(String, Counts)>, BrokerError> {
        let broker = self.hub.broker();
        let sets: Vec<String> = buckets.iter().map(|b| set_of(&app.config.id, *b)).collect();
        let mut entries = Vec::new();
        for read in join_all(
            sets.iter()
                .map(|set| cluster::read::<Entry>(&**broker, set)),
        )
        .await
        {
            entries.extend(read?.into_iter().map(|(node, e)| (node, e.channels)));
        }
        Ok(entries)
    }

    /// The cluster's counts from the nodes' `entries` and this node's own (`local`).
    fn totals(&self, entries: Vec<(String, Counts)>, local: Counts) -> Counts {
        let live = cluster::heard_nodes(&self.hub);
        merge(entries, self.hub.node_name(), live.as_ref(), local)
    }

    /// Subscriptions to each of `app`'s channels in the cluster (channels with none left out).
    pub async fn channels(&self, app: &PusherApp) -> Result<Counts, BrokerError> {
        let buckets: Vec<usize> = (0..BUCKETS).collect();
        let entries = self.entries(app, &buckets).await?;
        let here = self.local_all().remove(&app.config.id).unwrap_or_default();
        Ok(self.totals(entries, here))
    }

    /// Subscriptions to one of `app`'s channels in the cluster.
    pub async fn channel(&self, app: &PusherApp, name: &str) -> Result<u64, BrokerError> {
        let entries = self.entries(app, &[bucket_of(name)]).await?;
        let internal = app.internal(name);
        let here = self
            .hub
            .channels()
            .into_iter()
            .find(|(c, _)| *c == internal)
            .map_or(0, |(_, n)| n as u64);
        let all = self.totals(entries, Counts::from([(name.to_owned(), here)]));
        Ok(all.get(name).copied().unwrap_or(0))
    }
}

/// The other nodes' counts summed (`me`'s own entry left out: the hub counts it exactly, in
/// `local`), of the nodes in `live` only when it is given, plus `local`; channels with no
/// subscription left out.
fn merge(
    entries: Vec<(String, Counts)>,
    me: &str,
    live: Option<&HashSet<String>>,
    local: Counts,
) -> Counts {
    let mut all = cluster::channel_totals(entries, me, live, local);
    all.retain(|_, n| *n > 0);
    all
}

#[cfg(test)]
mod tests {
    use herald_protocol::ClientInfo;

    use super::*;

    fn entry(node: &str, channels: &[(&str, u64)]) -> ClientInfo {
        let channels = channels.iter().map(|(c, n)| (c.to_string(), *n)).collect();
        cluster::entry(node, Some(&Entry { channels }))
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        // Fixed values: every node and every version must agree on them.
        assert_eq!(bucket_of(""), (0xcbf2_9ce4_8422_2325u64 % 16) as usize);
        assert_eq!(bucket_of("a"), (0xaf63_dc4c_8601_ec8cu64 % 16) as usize);
        let used: HashSet<usize> = (0..200).map(|i| bucket_of(&format!("room-{i}"))).collect();
        assert_eq!(used.len(), BUCKETS, "200 channels reach every bucket");
    }

    #[test]
    fn merge_sums_other_live_nodes() {
        let entries = || {
            let read = vec![
                entry("a", &[("news", 2), ("sports", 1)]),
                entry("b", &[("news", 3)]),
                entry("me", &[("news", 100)]),
                entry("dead", &[("news", 7), ("gone", 1), ("none", 0)]),
                cluster::entry::<Entry>("garbled", None),
            ];
            cluster::bodies::<Entry>(read)
                .into_iter()
                .map(|(node, e)| (node, e.channels))
                .collect::<Vec<_>>()
        };
        let here = || Counts::from([("news".into(), 1), ("mine".into(), 2)]);
        let all = merge(entries(), "me", None, here());
        assert_eq!(
            all["news"], 13,
            "own entry left out, the rest and the hub's summed"
        );
        assert_eq!(all["gone"], 1);
        assert!(!all.contains_key("none"), "channels with none left out");
        let live: HashSet<String> = ["a", "b", "me"].map(String::from).into();
        let live_only = merge(entries(), "me", Some(&live), here());
        assert_eq!(
            live_only,
            Counts::from([("news".into(), 6), ("sports".into(), 1), ("mine".into(), 2)])
        );
    }
}
