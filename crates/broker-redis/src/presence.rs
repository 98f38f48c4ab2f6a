//! Presence: entries in a per-channel hash with per-entry expiry, added and removed through
//! scripts, and refreshed by this node while it lives, so a crashed node's entries expire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use herald_broker::BrokerError;
use herald_protocol::ClientInfo;

use crate::broker::Inner;
use crate::scripts;

/// Presence entries refreshed per script call.
const PRESENCE_CHUNK: usize = 200;

/// Presence entries this node added: channel → client → info.
pub(crate) type LocalPresence = Mutex<HashMap<String, HashMap<String, ClientInfo>>>;

impl Inner {
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
        let result = self
            .presence_add(channel, &[(who.client.clone(), json)])
            .await;
        if result.is_err() {
            // Not refreshed later either: the hub treats the subscribe as failed.
            forget_local(&self.local_presence, channel, &who.client);
        }
        result
    }

    /// Remove `client` from `channel`'s presence.
    pub(crate) async fn remove_presence(
        &self,
        channel: &str,
        client: &str,
    ) -> Result<(), BrokerError> {
        forget_local(&self.local_presence, channel, client);
        self.presence_remove(channel, client).await
    }

    /// Everyone present in `channel`, on every node (expired entries skipped).
    pub(crate) async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        let k = self.names.channel(channel);
        let raw = self
            .run(self.shard(channel), |mut c| async move {
                scripts::PRESENCE_LIST
                    .key(&k.presence)
                    .key(&k.presence_expiry)
                    .invoke_async::<Vec<Vec<u8>>>(&mut c)
                    .await
            })
            .await?;
        Ok(raw
            .iter()
            .filter_map(|j| serde_json::from_slice(j).ok())
            .collect())
    }

    /// Run the add script for `channel` with `ARGV` = TTL, then (client, info JSON) pairs.
    async fn presence_add(
        &self,
        channel: &str,
        entries: &[(String, String)],
    ) -> Result<(), BrokerError> {
        let k = self.names.channel(channel);
        let ttl_ms = self.cfg.presence_ttl_s.max(1) * 1000;
        self.run(self.shard(channel), |mut c| async move {
            let mut inv = scripts::PRESENCE_ADD.prepare_invoke();
            inv.key(&k.presence).key(&k.presence_expiry).arg(ttl_ms);
            for (client, info) in entries {
                inv.arg(client).arg(info);
            }
            inv.invoke_async::<()>(&mut c).await
        })
        .await
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let k = self.names.channel(channel);
        self.run(self.shard(channel), |mut c| async move {
            scripts::PRESENCE_REMOVE
                .key(&k.presence)
                .key(&k.presence_expiry)
                .arg(client)
                .invoke_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// Re-add every presence entry this node holds, so they outlive the TTL while it lives.
    async fn refresh_presence(&self) {
        let snapshot: Vec<(String, Vec<(String, String)>)> = {
            let local = self.local_presence.lock().expect("presence lock");
            local
                .iter()
                .map(|(ch, clients)| {
                    let entries = clients
                        .iter()
                        .map(|(id, who)| {
                            (id.clone(), serde_json::to_string(who).unwrap_or_default())
                        })
                        .collect();
                    (ch.clone(), entries)
                })
                .collect()
        };
        for (channel, entries) in snapshot {
            for chunk in entries.chunks(PRESENCE_CHUNK) {
                if let Err(e) = self.presence_add(&channel, chunk).await {
                    tracing::debug!(channel, cause = %e, "presence refresh failed");
                    continue;
                }
                // Entries removed while the refresh ran were just re-added: remove them again.
                let gone: Vec<String> = {
                    let local = self.local_presence.lock().expect("presence lock");
                    let clients = local.get(&channel);
                    chunk
                        .iter()
                        .filter(|(id, _)| !clients.is_some_and(|c| c.contains_key(id)))
                        .map(|(id, _)| id.clone())
                        .collect()
                };
                for id in gone {
                    let _ = self.presence_remove(&channel, &id).await;
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

fn forget_local(local: &LocalPresence, channel: &str, client: &str) {
    let mut local = local.lock().expect("presence lock");
    if let Some(clients) = local.get_mut(channel) {
        clients.remove(client);
        if clients.is_empty() {
            local.remove(channel);
        }
    }
}
