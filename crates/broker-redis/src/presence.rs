//! Presence: entries in a per-channel hash with per-entry expiry, added and removed through
//! scripts, and refreshed by this node while it lives, so a crashed node's entries expire. Beside
//! the hash the scripts keep the client ids in a lexically ordered zset (for pages) and a count
//! per user (for `presence_stats`), so that neither reads the whole member list.
//!
//! With `presence_parts` above 1 a channel's presence is split into that many parts by a hash of
//! the user (names::presence_part), each under its own hash tag, so that a crowded channel spreads
//! over Cluster slots and standalone shards. A count is the sum of the parts' (a user's clients all
//! sit in one part, so users are not counted twice); a page merges each part's first page.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use herald_broker::{BrokerError, PresencePage, PresenceStats};
use herald_protocol::ClientInfo;

use crate::broker::Inner;
use crate::names::{presence_part, PresenceKeys};
use crate::scripts;

/// Presence entries refreshed per script call.
const PRESENCE_CHUNK: usize = 200;

/// One entry as the add script takes it: client id, user, ClientInfo JSON.
type PresenceRecord = (String, String, String);

/// Presence entries this node added: channel → client → info.
pub(crate) type LocalPresence = Mutex<HashMap<String, HashMap<String, ClientInfo>>>;

impl Inner {
    fn presence_parts(&self) -> usize {
        self.cfg.presence_parts.max(1)
    }

    /// The keys of part `part` of `channel`'s presence.
    fn part_keys(&self, channel: &str, part: usize) -> PresenceKeys {
        self.names.presence(channel, part, self.presence_parts())
    }

    /// The part that holds `user`'s clients.
    fn part_of(&self, user: &str) -> usize {
        presence_part(user, self.presence_parts())
    }

    /// Add `who` to `channel`'s presence (and to this node's refresh list).
    pub(crate) async fn add_presence(
        &self,
        channel: &str,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        let json = serde_json::to_string(who)
            .map_err(|e| BrokerError::internal(e.to_string()).caused_by(e))?;
        self.local_presence
            .lock()
            .expect("presence lock")
            .entry(channel.to_owned())
            .or_default()
            .insert(who.client.clone(), who.clone());
        let part = self.part_of(&who.user);
        let result = self
            .presence_add(
                channel,
                part,
                &[(who.client.clone(), who.user.clone(), json)],
            )
            .await;
        if result.is_err() {
            // Not refreshed later either: the hub treats the subscribe as failed.
            forget_local(&self.local_presence, channel, &who.client);
        }
        result
    }

    /// Remove `client` from `channel`'s presence: from its user's part when this node added it,
    /// else from every part.
    pub(crate) async fn remove_presence(
        &self,
        channel: &str,
        client: &str,
    ) -> Result<(), BrokerError> {
        let known = forget_local(&self.local_presence, channel, client);
        let parts: Vec<usize> = match known {
            Some(who) => vec![self.part_of(&who.user)],
            None => (0..self.presence_parts()).collect(),
        };
        let removals = parts
            .into_iter()
            .map(|part| self.presence_remove(channel, part, client));
        join_all(removals).await.into_iter().collect()
    }

    /// Everyone present in `channel`, on every node (expired entries skipped).
    pub(crate) async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        let lists = (0..self.presence_parts()).map(|part| {
            let k = self.part_keys(channel, part);
            self.run(self.shard(&k.tag), |mut c| async move {
                scripts::PRESENCE_LIST
                    .key(&k.entries)
                    .key(&k.expiry)
                    .key(&k.order)
                    .key(&k.users)
                    .invoke_async::<Vec<Vec<u8>>>(&mut c)
                    .await
            })
        });
        let mut clients = Vec::new();
        for raw in join_all(lists).await {
            clients.extend(raw?.iter().filter_map(|j| serde_json::from_slice(j).ok()));
        }
        Ok(clients)
    }

    /// Counts of `channel`'s presence: two `HLEN`s per part (expired entries dropped first).
    pub(crate) async fn presence_stats(&self, channel: &str) -> Result<PresenceStats, BrokerError> {
        let counts = (0..self.presence_parts()).map(|part| {
            let k = self.part_keys(channel, part);
            self.run(self.shard(&k.tag), |mut c| async move {
                scripts::PRESENCE_STATS
                    .key(&k.entries)
                    .key(&k.expiry)
                    .key(&k.order)
                    .key(&k.users)
                    .invoke_async::<(u64, u64)>(&mut c)
                    .await
            })
        });
        let mut stats = PresenceStats::default();
        for count in join_all(counts).await {
            let (clients, users) = count?;
            stats.num_clients += clients;
            stats.num_users += users;
        }
        Ok(stats)
    }

    /// Up to `limit` clients after `after`, in id order: each part's first `limit` after it
    /// (read from its order zset), merged. The first `limit` overall are among them.
    pub(crate) async fn presence_page(
        &self,
        channel: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        let after = after.unwrap_or("");
        let pages = (0..self.presence_parts()).map(|part| {
            let k = self.part_keys(channel, part);
            self.run(self.shard(&k.tag), |mut c| async move {
                scripts::PRESENCE_PAGE
                    .key(&k.entries)
                    .key(&k.expiry)
                    .key(&k.order)
                    .key(&k.users)
                    .arg(after)
                    .arg(limit)
                    .invoke_async::<(u8, Vec<Vec<u8>>)>(&mut c)
                    .await
            })
        });
        let mut clients: Vec<ClientInfo> = Vec::new();
        let mut more = false;
        for page in join_all(pages).await {
            let (part_more, raw) = page?;
            more |= part_more == 1;
            clients.extend(raw.iter().filter_map(|j| serde_json::from_slice(j).ok()));
        }
        clients.sort_by(|a, b| a.client.cmp(&b.client));
        more |= clients.len() > limit;
        clients.truncate(limit);
        Ok(PresencePage { clients, more })
    }

    /// Run the add script on one part with `ARGV` = TTL, then (client, user, info JSON) triples.
    async fn presence_add(
        &self,
        channel: &str,
        part: usize,
        entries: &[PresenceRecord],
    ) -> Result<(), BrokerError> {
        let k = self.part_keys(channel, part);
        let ttl_ms = self.cfg.presence_ttl_s.max(1) * 1000;
        self.run(self.shard(&k.tag), |mut c| async move {
            let mut inv = scripts::PRESENCE_ADD.prepare_invoke();
            inv.key(&k.entries)
                .key(&k.expiry)
                .key(&k.order)
                .key(&k.users)
                .arg(ttl_ms);
            for (client, user, info) in entries {
                inv.arg(client).arg(user).arg(info);
            }
            inv.invoke_async::<()>(&mut c).await
        })
        .await
    }

    async fn presence_remove(
        &self,
        channel: &str,
        part: usize,
        client: &str,
    ) -> Result<(), BrokerError> {
        let k = self.part_keys(channel, part);
        self.run(self.shard(&k.tag), |mut c| async move {
            scripts::PRESENCE_REMOVE
                .key(&k.entries)
                .key(&k.expiry)
                .key(&k.order)
                .key(&k.users)
                .arg(client)
                .invoke_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// Re-add every presence entry this node holds, so they outlive the TTL while it lives.
    async fn refresh_presence(&self) {
        // (channel, part) → entries.
        let mut snapshot: HashMap<(String, usize), Vec<PresenceRecord>> = HashMap::new();
        {
            let local = self.local_presence.lock().expect("presence lock");
            for (ch, clients) in local.iter() {
                for (id, who) in clients {
                    let record = (
                        id.clone(),
                        who.user.clone(),
                        serde_json::to_string(who).unwrap_or_default(),
                    );
                    snapshot
                        .entry((ch.clone(), self.part_of(&who.user)))
                        .or_default()
                        .push(record);
                }
            }
        }
        for ((channel, part), entries) in snapshot {
            for chunk in entries.chunks(PRESENCE_CHUNK) {
                if let Err(e) = self.presence_add(&channel, part, chunk).await {
                    tracing::debug!(channel, cause = %e, "presence refresh failed");
                    continue;
                }
                // Entries removed while the refresh ran were just re-added: remove them again.
                let gone: Vec<String> = {
                    let local = self.local_presence.lock().expect("presence lock");
                    let clients = local.get(&channel);
                    chunk
                        .iter()
                        .filter(|(id, _, _)| !clients.is_some_and(|c| c.contains_key(id)))
                        .map(|(id, _, _)| id.clone())
                        .collect()
                };
                for id in gone {
                    let _ = self.presence_remove(&channel, part, &id).await;
                }
            }
        }
    }
}

/// Spawn the presence refresher; it stops when the broker is dropped.
pub(crate) fn spawn_presence_refresh(inner: &Arc<Inner>) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let every = Duration::from_millis((inner.cfg.presence_ttl_s.max(1) * 1000 / 3).max(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            inner.refresh_presence().await;
        }
    });
}

/// Drop a client from this node's refresh list; what it held, if anything.
fn forget_local(local: &LocalPresence, channel: &str, client: &str) -> Option<ClientInfo> {
    let mut local = local.lock().expect("presence lock");
    let clients = local.get_mut(channel)?;
    let who = clients.remove(client);
    if clients.is_empty() {
        local.remove(channel);
    }
    who
}
