//! The log on NATS JetStream (`[lifecycle] nats_url`), for a cluster that has no Redis.
//!
//! - `<prefix>-events`, subject `<prefix>.events`: the stream every node appends to (file
//!   storage). Each event is published with its `id` as `Nats-Msg-Id`, so a retried append (or a
//!   redone reap) inside the stream's duplicate window is stored once.
//! - the KV bucket `<prefix>`: `conns.<node>` a node's connection set (one JSON entry, written
//!   with compare-and-set on its revision); `lease.<node>` the node's last renewal (its clock, in
//!   ms); `sender` which node delivers and since when; `acked` the last sequence the sink took.
//!
//! Unlike the Redis log, an append is two steps (the set, then the events), not one script: see
//! docs/lifecycle.md ("On NATS") for what that leaves open.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};

use super::super::recorder::{now_ms, Effect, Entry};
use super::super::LifecycleConfig;
use super::Fenced;

/// How long the server remembers a message id: a redone append or reap inside it is dropped.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

pub(in super::super) struct NatsLog {
    js: jetstream::Context,
    stream: stream::Stream,
    kv: kv::Store,
    subject: String,
    node: String,
    pub(super) lease_ms: u64,
    /// This node's connection set as last written, and the revision it was written at (`None`:
    /// no entry).
    conns: tokio::sync::Mutex<(ConnSet, Option<u64>)>,
}

/// A node's connections.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ConnSet {
    clients: BTreeMap<String, Conn>,
    /// A reaper took this set over: the node's own later writes are refused ([`Fenced`]).
    #[serde(default)]
    claimed: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Conn {
    user: String,
    channels: BTreeSet<String>,
}

/// A node name as a KV key token (keys allow only `[-/_=.a-zA-Z0-9]`): hex.
fn token(node: &str) -> String {
    node.bytes().map(|b| format!("{b:02x}")).collect()
}

fn untoken(token: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn conns_key(node: &str) -> String {
    format!("conns.{}", token(node))
}

fn lease_key(node: &str) -> String {
    format!("lease.{}", token(node))
}

impl NatsLog {
    pub(super) async fn connect(
        url: &str,
        config: &LifecycleConfig,
        node: &str,
    ) -> anyhow::Result<Self> {
        let client = tokio::time::timeout(CONNECT_LIMIT, async_nats::connect(url))
            .await
            .context("connecting to the lifecycle NATS timed out")?
            .context("connecting to the lifecycle NATS")?;
        let js = jetstream::new(client);
        let subject = format!("{}.events", config.prefix);
        let stream = js
            .get_or_create_stream(stream::Config {
                name: format!("{}-events", config.prefix),
                subjects: vec![subject.clone()],
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await
            .context("lifecycle NATS: the events stream")?;
        // Created with the same config by whichever node comes first (creating an identical
        // bucket again succeeds).
        let kv = match js.get_key_value(config.prefix.as_str()).await {
            Ok(kv) => kv,
            Err(_) => {
                // The bucket's stream, as a KV bucket is laid out, created directly: async-nats's
                // create_key_value fails against nats-server 2.9 (it sends fields 2.9 rejects).
                js.get_or_create_stream(stream::Config {
                    name: format!("KV_{}", config.prefix),
                    subjects: vec![format!("$KV.{}.>", config.prefix)],
                    max_messages_per_subject: 1,
                    storage: stream::StorageType::File,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    discard: stream::DiscardPolicy::New,
                    ..Default::default()
                })
                .await
                .context("lifecycle NATS: the KV bucket")?;
                js.get_key_value(config.prefix.as_str())
                    .await
                    .context("lifecycle NATS: the KV bucket")?
            }
        };
        Ok(NatsLog {
            js,
            stream,
            kv,
            subject,
            node: node.to_owned(),
            lease_ms: config.lease_ms,
            conns: tokio::sync::Mutex::new((ConnSet::default(), None)),
        })
    }

    /// `key`'s current value; `None` when absent or removed. A removed key still has an entry,
    /// its delete marker, with an empty value: read as a value, that is not one.
    async fn current(&self, key: &str) -> anyhow::Result<Option<kv::Entry>> {
        let entry = self.kv.entry(key).await.context("lifecycle NATS")?;
        Ok(entry.filter(|e| e.operation == kv::Operation::Put))
    }

    /// Publish events in order, each with its id as the message id; wait for every ack.
    async fn publish(
        &self,
        events: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<()> {
        let mut acks = Vec::new();
        for (id, json) in events {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            acks.push(
                self.js
                    .publish_with_headers(self.subject.clone(), headers, Bytes::from(json))
                    .await
                    .context("lifecycle NATS: publish")?,
            );
        }
        for ack in acks {
            ack.await
                .context("lifecycle NATS: publish not acknowledged")?;
        }
        Ok(())
    }

    /// The connection set first (compare-and-set: a reaper's claim fences this node), then the
    /// events. A retry after a failure redoes both: the set's effects are idempotent and the
    /// events' message ids make the server drop what it already stored.
    pub(super) async fn append(&self, entries: &[Entry]) -> anyhow::Result<()> {
        let mut cached = self.conns.lock().await;
        let (mut set, revision) = cached.clone();
        for e in entries {
            let client = &e.event.client;
            match &e.effect {
                Effect::Connected(user) => {
                    set.clients.entry(client.clone()).or_default().user = user.clone();
                }
                Effect::Subscribed(channel) => {
                    set.clients
                        .entry(client.clone())
                        .or_default()
                        .channels
                        .insert(channel.clone());
                }
                Effect::Unsubscribed(channel) => {
                    if let Some(c) = set.clients.get_mut(client) {
                        c.channels.remove(channel);
                    }
                }
                Effect::Disconnected => {
                    set.clients.remove(client);
                }
            }
        }
        let key = conns_key(&self.node);
        let value = Bytes::from(serde_json::to_vec(&set)?);
        let written = match revision {
            None => self
                .kv
                .create(&key, value)
                .await
                .map_err(anyhow::Error::new),
            Some(r) => self
                .kv
                .update(&key, value, r)
                .await
                .map_err(anyhow::Error::new),
        };
        match written {
            Ok(r) => *cached = (set, Some(r)),
            Err(e) => {
                // Someone else wrote the set: a reaper's claim, or our own write whose answer
                // was lost. Re-read it; a claimed or reaped set fences this node.
                let now = self.current(&key).await?;
                match now {
                    Some(entry) => {
                        let current: ConnSet = serde_json::from_slice(&entry.value)
                            .context("lifecycle NATS: a connection set")?;
                        if current.claimed {
                            *cached = (ConnSet::default(), Some(entry.revision));
                            return Err(Fenced.into());
                        }
                        *cached = (current, Some(entry.revision));
                        return Err(e.context("lifecycle NATS: connection set"));
                    }
                    None if revision.is_some() => {
                        *cached = (ConnSet::default(), None);
                        return Err(Fenced.into());
                    }
                    None => return Err(e.context("lifecycle NATS: connection set")),
                }
            }
        }
        drop(cached);
        let mut events = Vec::with_capacity(entries.len());
        for e in entries {
            events.push((e.event.id.clone(), serde_json::to_string(&e.event)?));
        }
        self.publish(events).await
    }

    /// A lost node's set: claim it (compare-and-set on its revision, so its owner's later writes
    /// and other reapers fail), publish its events with deterministic ids, remove it. A reaper
    /// that dies after the claim leaves a claimed set, which the next one redoes (its events are
    /// dropped as duplicates inside the window).
    pub(super) async fn reap(&self, node: &str, force: bool) -> anyhow::Result<u64> {
        let key = conns_key(node);
        let Some(entry) = self.kv.entry(&key).await.context("lifecycle NATS")? else {
            return Ok(0);
        };
        if entry.operation != kv::Operation::Put {
            // Removed before (reaped, or the node stopped cleanly): drop its marker, so that
            // the reapers stop looking at every node name ever used.
            self.purge_removed(&key, entry.revision).await;
            let lease = lease_key(node);
            if let Some(l) = self.kv.entry(&lease).await.context("lifecycle NATS")? {
                if l.operation != kv::Operation::Put {
                    self.purge_removed(&lease, l.revision).await;
                }
            }
            return Ok(0);
        }
        if !force && self.alive(node).await? {
            return Ok(0);
        }
        let mut set: ConnSet =
            serde_json::from_slice(&entry.value).context("lifecycle NATS: a connection set")?;
        let revision = if set.claimed {
            entry.revision
        } else {
            set.claimed = true;
            let value = Bytes::from(serde_json::to_vec(&set)?);
            match self.kv.update(&key, value, entry.revision).await {
                Ok(r) => r,
                // Another reaper claimed it, or the node wrote (it is back): not ours.
                Err(_) => return Ok(0),
            }
        };
        let time_ms = now_ms();
        let mut events = Vec::new();
        let event = |kind: &str, client: &str, user: &str, channel: Option<&str>| {
            let id = match channel {
                Some(ch) => format!("{node}/{client}/lost/{ch}"),
                None => format!("{node}/{client}/lost"),
            };
            let mut e = serde_json::json!({
                "id": id, "type": kind, "time_ms": time_ms, "node": node,
                "client": client, "user": user,
            });
            if let Some(ch) = channel {
                e["channel"] = ch.into();
            }
            if kind == "disconnect" {
                e["code"] = 1006.into();
                e["reason"] = "node lost".into();
            }
            (id, e.to_string())
        };
        for (client, c) in &set.clients {
            for channel in &c.channels {
                events.push(event("unsubscribe", client, &c.user, Some(channel)));
            }
        }
        for (client, c) in &set.clients {
            events.push(event("disconnect", client, &c.user, None));
        }
        let n = events.len() as u64;
        self.publish(events).await?;
        // Whoever removes it second finds another revision: nothing to do.
        let _ = self.kv.delete_expect_revision(&key, Some(revision)).await;
        if !force {
            let _ = self.kv.delete(lease_key(node)).await;
        }
        if node == self.node {
            *self.conns.lock().await = (ConnSet::default(), None);
        }
        Ok(n)
    }

    /// Remove `key`'s messages up to its delete marker at `marker`. Race-free: a value written
    /// after the marker (the node back under its name) has a higher sequence and stays.
    async fn purge_removed(&self, key: &str, marker: u64) {
        let subject = format!("{}{key}", self.kv.prefix);
        if let Err(e) = self
            .kv
            .stream
            .purge()
            .filter(subject)
            .sequence(marker + 1)
            .await
        {
            tracing::debug!(cause = %e, "lifecycle NATS: a removed key's marker not purged");
        }
    }

    async fn alive(&self, node: &str) -> anyhow::Result<bool> {
        let lease = self.current(&lease_key(node)).await?;
        Ok(lease
            .and_then(|e| std::str::from_utf8(&e.value).ok()?.parse::<u64>().ok())
            .is_some_and(|t| now_ms().saturating_sub(t) < self.lease_ms))
    }

    pub(super) async fn renew_lease(&self) -> anyhow::Result<()> {
        self.kv
            .put(lease_key(&self.node), now_ms().to_string().into())
            .await
            .context("lifecycle NATS: lease")?;
        Ok(())
    }

    pub(super) async fn release(&self, node: &str) -> anyhow::Result<()> {
        self.kv
            .delete(lease_key(node))
            .await
            .context("lifecycle NATS: lease")?;
        // An empty set goes too; one still holding connections stays to be reaped.
        let cached = self.conns.lock().await;
        if let (true, Some(r)) = (cached.0.clients.is_empty(), cached.1) {
            let _ = self
                .kv
                .delete_expect_revision(conns_key(node), Some(r))
                .await;
        }
        Ok(())
    }

    /// Nodes with a connection set whose lease lapsed. The sets are found from the bucket
    /// stream's subjects (one request a page), not a KV key listing: that listing ends on a
    /// pending count which the other nodes' constant lease writes leave stale, so it could wait
    /// for good (a killed node was never reaped). A removed set's subject stays (its delete
    /// marker) until a reaper looks at it once more: [`NatsLog::reap`] then purges the marker.
    pub(super) async fn lost_nodes(&self) -> anyhow::Result<Vec<String>> {
        let prefix = format!("{}conns.", self.kv.prefix);
        let subjects: Vec<(String, usize)> = self
            .kv
            .stream
            .info_with_subjects(format!("{prefix}>"))
            .await
            .context("lifecycle NATS: connection sets")?
            .try_collect()
            .await
            .context("lifecycle NATS: connection sets")?;
        let mut nodes: Vec<String> = subjects
            .iter()
            .filter_map(|(subject, _)| untoken(subject.strip_prefix(&prefix)?))
            .filter(|n| *n != self.node)
            .collect();
        nodes.sort();
        let mut lost = Vec::new();
        for node in nodes {
            if !self.alive(&node).await? {
                lost.push(node);
            }
        }
        Ok(lost)
    }

    /// `sender` holds `<renewal ms> <node>`: taken when absent or lapsed, renewed by its holder
    /// a third of the way through, always by compare-and-set.
    pub(super) async fn lead(&self) -> anyhow::Result<bool> {
        let now = now_ms();
        let value = Bytes::from(format!("{now} {}", self.node));
        let Some(entry) = self.kv.entry("sender").await.context("lifecycle NATS")? else {
            return Ok(self.kv.create("sender", value).await.is_ok());
        };
        let (since, holder) = std::str::from_utf8(&entry.value)
            .ok()
            .and_then(|v| v.split_once(' '))
            .and_then(|(t, n)| Some((t.parse::<u64>().ok()?, n)))
            .unwrap_or((0, ""));
        let age = now.saturating_sub(since);
        if holder == self.node && age < self.lease_ms / 3 {
            return Ok(true);
        }
        if holder != self.node && age < self.lease_ms {
            return Ok(false);
        }
        Ok(self
            .kv
            .update("sender", value, entry.revision)
            .await
            .is_ok())
    }

    async fn acked(&self) -> anyhow::Result<(u64, Option<u64>)> {
        let entry = self.kv.entry("acked").await.context("lifecycle NATS")?;
        Ok(match entry {
            Some(e) => (
                std::str::from_utf8(&e.value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                Some(e.revision),
            ),
            None => (0, None),
        })
    }

    pub(super) async fn unacked(&self, max: usize) -> anyhow::Result<Vec<(String, String)>> {
        let (acked, _) = self.acked().await?;
        let info = self
            .stream
            .get_info()
            .await
            .context("lifecycle NATS: stream info")?;
        let last = info.state.last_sequence.min(acked + max as u64);
        let mut out = Vec::new();
        for seq in (acked + 1).max(info.state.first_sequence)..=last {
            match self.stream.get_raw_message(seq).await {
                Ok(m) => out.push((
                    seq.to_string(),
                    String::from_utf8(m.payload.to_vec()).context("lifecycle NATS: an event")?,
                )),
                // Removed (purged below an older ack): nothing to deliver there.
                Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {}
                Err(e) => return Err(anyhow::Error::new(e).context("lifecycle NATS: read")),
            }
        }
        Ok(out)
    }

    /// Store the acked sequence (only forward, by compare-and-set) while this node still holds
    /// `sender`, then drop what is acked from the stream.
    pub(super) async fn ack(&self, cursor: &str) -> anyhow::Result<()> {
        let upto: u64 = cursor.parse().context("cursor")?;
        let holder = self.kv.entry("sender").await.context("lifecycle NATS")?;
        let ours = holder.is_some_and(|e| {
            std::str::from_utf8(&e.value)
                .ok()
                .and_then(|v| v.split_once(' '))
                .is_some_and(|(_, n)| n == self.node)
        });
        if !ours {
            return Ok(());
        }
        let (acked, revision) = self.acked().await?;
        if upto <= acked {
            return Ok(());
        }
        let value = Bytes::from(upto.to_string());
        let stored = match revision {
            None => self.kv.create("acked", value).await.is_ok(),
            Some(r) => self.kv.update("acked", value, r).await.is_ok(),
        };
        if stored {
            if let Err(e) = self.stream.purge().sequence(upto + 1).await {
                tracing::debug!(cause = %e, "lifecycle NATS: acked events not purged");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LifecycleConfig {
        LifecycleConfig::load(Some(&serde_json::json!({
            "http_url": "http://127.0.0.1:9/events",
            "lease_ms": 1000,
        })))
        .expect("config")
        .expect("section")
    }

    /// The reaper lists the nodes while the others keep writing the bucket (leases, sets, the
    /// sender): each listing must end. A KV key listing waited for a pending count that such
    /// writes made stale, and the reaper stopped for good (CI: a killed node never reaped).
    #[tokio::test]
    async fn lost_nodes_are_listed_while_the_bucket_is_written() {
        let nats = herald_testkit::nats::NatsServer::start();
        let config = config();
        let writer = std::sync::Arc::new(
            NatsLog::connect(&nats.url(), &config, "busy")
                .await
                .expect("connect"),
        );
        let reaper = NatsLog::connect(&nats.url(), &config, "reaper")
            .await
            .expect("connect");
        for node in ["gone-1", "gone-2"] {
            reaper
                .kv
                .put(conns_key(node), Bytes::from_static(b"{\"clients\":{}}"))
                .await
                .expect("put");
        }
        let busy = writer.clone();
        let writes = tokio::spawn(async move {
            loop {
                busy.renew_lease().await.expect("renew");
                let _ = busy.lead().await;
            }
        });
        for i in 0..40 {
            let lost = tokio::time::timeout(Duration::from_secs(10), reaper.lost_nodes())
                .await
                .unwrap_or_else(|_| panic!("listing {i} did not end in 10 s"))
                .expect("listed");
            assert_eq!(lost, ["gone-1", "gone-2"], "listing {i}");
        }
        writes.abort();
    }

    fn connected(node: &str, client: &str) -> Entry {
        use super::super::super::recorder::Event;
        Entry {
            event: Event {
                id: format!("{node}/{client}/1"),
                kind: "connect",
                time_ms: now_ms(),
                node: node.to_owned(),
                client: client.to_owned(),
                user: "alice".to_owned(),
                channel: None,
                code: None,
                reason: None,
            },
            effect: Effect::Connected("alice".to_owned()),
        }
    }

    /// A node whose set another node reaped (its delete marker left in the bucket) is fenced
    /// on its next write, writes again after that, and starts again under its name. The delete
    /// marker is an entry with an empty value: read as a set, it failed every one of these.
    #[tokio::test]
    async fn a_reaped_node_is_fenced_then_writes_and_starts_again() {
        let nats = herald_testkit::nats::NatsServer::start();
        let config = config();
        let a = NatsLog::connect(&nats.url(), &config, "a")
            .await
            .expect("a");
        let b = NatsLog::connect(&nats.url(), &config, "b")
            .await
            .expect("b");
        a.renew_lease().await.expect("lease");
        a.append(&[connected("a", "c1")]).await.expect("append");
        // a's lease lapses (1 s): b emits c1's disconnect and removes the set.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(b.lost_nodes().await.expect("lost"), ["a"]);
        assert_eq!(b.reap("a", false).await.expect("reap"), 1);
        assert_eq!(
            b.lost_nodes().await.expect("lost"),
            ["a"],
            "its marker, until a reaper looks again"
        );
        assert_eq!(b.reap("a", false).await.expect("reap again"), 0);
        assert!(
            b.lost_nodes().await.expect("lost").is_empty(),
            "the second look purged the marker: reapers do not check every name ever used"
        );
        let subjects: Vec<(String, usize)> =
            b.kv.stream
                .info_with_subjects(format!("{}>", b.kv.prefix))
                .await
                .expect("subjects")
                .try_collect()
                .await
                .expect("subjects");
        assert!(
            !subjects
                .iter()
                .any(|(s, _)| s.ends_with(&conns_key("a")) || s.ends_with(&lease_key("a"))),
            "nothing of a's is left: {subjects:?}"
        );

        let err = a
            .append(&[connected("a", "c2")])
            .await
            .expect_err("a reaped node's write is refused");
        assert!(err.is::<Fenced>(), "fenced, not {err:#}");
        a.append(&[connected("a", "c3")])
            .await
            .expect("then it writes a new set");

        let restarted = NatsLog::connect(&nats.url(), &config, "a")
            .await
            .expect("a again");
        assert_eq!(
            restarted
                .reap("a", true)
                .await
                .expect("its own set at start"),
            1,
            "c3's disconnect"
        );
        assert_eq!(restarted.reap("a", true).await.expect("again"), 0);
    }
}
