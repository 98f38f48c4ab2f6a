//! The cluster as the admin UI sees it: every node's latest stats snapshot, shared through a
//! broker presence set, and a few minutes of cluster-wide samples for the charts.
//!
//! Why presence: it is the one piece of state every broker (memory, Redis, NATS) already shares
//! between nodes, readable from any node, with entries that expire when their node dies (the
//! Pusher census and occupancy webhooks share theirs the same way: [`crate::cluster`]). So no
//! broker changes: each node with the admin UI enabled, once a second, reads its own counters
//! (the same atomics `/metrics` exports: nothing is added to the publish or fan-out path), stores
//! its snapshot as its presence entry in [`NODES_CHANNEL`], then reads the whole set back and
//! records the cluster's totals.
//!
//! A user's connections are asked for the same way, since the hub's registry is per node: the
//! asking node adds a question to [`ASK_CHANNEL`]; every node reads the questions at its next
//! tick and answers with its own presence entry in the question's reply set, removed again after
//! [`ANSWER_KEPT`]. The asker waits for every live node's answer, at most [`ASK_WAIT`].
//!
//! Staleness: a snapshot is at most [`EVERY`] old when written, and the reader's view is one
//! more tick old at worst, so about 2 s. A node whose snapshot has not changed for [`FRESH`]
//! (crashed, or cut off from the broker) is shown as lost, with when it was last seen, measured
//! on the reader's clock so that clock skew between nodes does not matter; it is left out of the
//! totals and charts, and forgotten after [`LOST_KEPT`]. The broker drops its entry after its
//! presence TTL.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_core::Hub;
use serde::{Deserialize, Serialize};

use crate::cluster::{self, unix_ms};

/// The presence set holding one entry per node. `!` is outside the channel alphabet, so no
/// client can subscribe to it or read it through the API.
pub const NODES_CHANNEL: &str = "herald!admin:nodes";
/// The presence set of open questions about a user's connections.
pub const ASK_CHANNEL: &str = "herald!admin:ask";
/// How long a node's answer stays in a reply set.
pub const ANSWER_KEPT: Duration = Duration::from_secs(15);
/// How long the asking node waits for the other nodes' answers.
pub const ASK_WAIT: Duration = Duration::from_secs(3);
/// How often a node writes its snapshot and samples the cluster.
pub const EVERY: Duration = Duration::from_secs(1);
/// A snapshot unchanged for this long belongs to a node that is gone.
pub const FRESH: Duration = Duration::from_secs(5);
/// A lost node stays listed (as lost) this long after it was last seen, then is forgotten.
pub const LOST_KEPT: Duration = Duration::from_secs(600);
/// Samples kept for the charts: five minutes at one a second.
const SERIES_LEN: usize = 300;
/// Users one question asks about at most.
pub const MAX_ASKED_USERS: usize = 200;
/// Busiest channels each node reports.
pub const TOP_CHANNELS: usize = 100;

/// One node's snapshot, as stored in its presence entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeStats {
    /// Node name.
    pub name: String,
    /// Herald version.
    pub version: String,
    /// When it was taken (the writer's clock, ms since the epoch; for display only).
    pub at_ms: u64,
    /// Seconds since the node started.
    pub uptime_s: u64,
    /// Open client connections.
    pub connections: u64,
    /// Client subscriptions (connection × channel).
    pub subscriptions: u64,
    /// Channels with at least one local subscriber.
    pub channels: u64,
    /// Publications accepted through this node per second (last second).
    pub publications_per_s: f64,
    /// Publications queued to this node's connections per second (last second).
    pub deliveries_per_s: f64,
    /// Mean time a publish took at the broker over the last second, in ms (none published: 0).
    pub publish_ms: f64,
    /// Errors per second: failed broker publishes and failed or refused proxy calls (an older
    /// node does not send it: 0).
    #[serde(default)]
    pub errors_per_s: f64,
    /// Connections closed as slow consumers (close 4001) per second.
    #[serde(default)]
    pub slow_consumers_per_s: f64,
    /// WebSocket handshakes refused by the per-address rate limit per second.
    #[serde(default)]
    pub rate_limited_per_s: f64,
    /// CPU used by the process over the last second, in percent of one core.
    pub cpu_percent: f64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// `memory`, `redis` or `nats`.
    pub broker: String,
    /// Whether the node's last write to the broker succeeded.
    pub broker_ok: bool,
    /// The node's busiest channels: (name, local subscribers).
    pub top_channels: Vec<(String, usize)>,
}

/// The cluster's totals at one moment, for the charts.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// ms since the epoch (the answering node's clock).
    pub t: u64,
    /// Nodes seen.
    pub nodes: usize,
    /// Open connections, all nodes.
    pub connections: u64,
    /// Publications per second, all nodes.
    pub publications_per_s: f64,
    /// Deliveries per second, all nodes.
    pub deliveries_per_s: f64,
    /// The slowest node's mean publish time, ms.
    pub publish_ms: f64,
    /// Errors per second, all nodes ([`NodeStats::errors_per_s`]).
    pub errors_per_s: f64,
    /// Slow-consumer closes per second, all nodes.
    pub slow_consumers_per_s: f64,
    /// Rate-limit refusals per second, all nodes.
    pub rate_limited_per_s: f64,
}

/// A node as the overview lists it: its latest snapshot, and whether it still answers.
#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    /// The latest snapshot read.
    #[serde(flatten)]
    pub stats: NodeStats,
    /// `live`, or `lost`: its snapshot has not changed for [`FRESH`].
    pub state: &'static str,
    /// A lost node: when its snapshot last changed (ms since the epoch, the reader's clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_since_ms: Option<u64>,
}

/// A question about a user's connections (and, for a channel's presence, several users'; an
/// older node answers for `user` alone).
#[derive(Debug, Serialize, Deserialize)]
struct Ask {
    id: String,
    user: String,
    from: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    users: Vec<String>,
}

/// One node's answer: the user's connections there.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    /// The node.
    pub node: String,
    /// Client ids of the user's connections on it.
    pub clients: Vec<String>,
}

/// Every node's answer, and the live nodes that did not answer in time.
#[derive(Debug, Serialize)]
pub struct UserConnections {
    /// Answers, this node's first.
    pub nodes: Vec<Answer>,
    /// Live nodes that did not answer within [`ASK_WAIT`].
    pub missing: Vec<String>,
}

fn reply_channel(id: &str) -> String {
    format!("herald!admin:reply:{id}")
}

/// Counters read at the previous tick, to turn totals into rates.
#[derive(Default)]
struct Previous {
    at: Option<Instant>,
    publications: u64,
    deliveries: u64,
    publish_sum: f64,
    publish_count: u64,
    cpu_ticks: u64,
    errors: u64,
    slow_consumers: u64,
    rate_limited: u64,
}

/// What this node knows about the cluster.
pub struct Cluster {
    broker_kind: String,
    /// name → (snapshot, when this node last saw it change).
    nodes: Mutex<Snapshots>,
    series: Mutex<VecDeque<Sample>>,
    previous: Mutex<Previous>,
    /// Questions this node answered (id → when), so each is answered once.
    answered: Mutex<HashMap<String, Instant>>,
}

impl Cluster {
    /// An empty view; `broker_url` names the broker kind shown per node.
    pub fn new(broker_url: &str) -> Cluster {
        let kind = broker_url.split(':').next().unwrap_or("memory");
        let kind = if kind.starts_with("redis") {
            "redis"
        } else if kind.starts_with("nats") {
            "nats"
        } else {
            "memory"
        };
        Cluster {
            broker_kind: kind.to_owned(),
            nodes: Mutex::default(),
            series: Mutex::new(VecDeque::with_capacity(SERIES_LEN)),
            previous: Mutex::default(),
            answered: Mutex::default(),
        }
    }

    /// Write this node's snapshot and sample the cluster every [`EVERY`], for as long as the
    /// node runs.
    pub fn spawn(self: &Arc<Self>, hub: Hub) {
        let cluster = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                cluster.tick(&hub).await;
            }
        });
    }

    async fn tick(&self, hub: &Hub) {
        let mut mine = self.local(hub);
        let broker = hub.broker();
        let written = cluster::put(&**broker, NODES_CHANNEL, &mine.name, Some(&mine)).await;
        mine.broker_ok = written.is_ok();
        let read = match cluster::read::<NodeStats>(&**broker, NODES_CHANNEL).await {
            Ok(all) => Some(all.into_iter().map(|(_, stats)| stats).collect()),
            Err(e) => {
                tracing::debug!(cause = %e, "admin: reading the cluster's snapshots failed");
                mine.broker_ok = false;
                None
            }
        };
        self.record(read, mine);
        self.answer_asks(hub).await;
    }

    /// Keep the snapshots read from the broker (`None`: the read failed) and this node's own,
    /// and sample the totals.
    fn record(&self, read: Option<Vec<NodeStats>>, mine: NodeStats) {
        let now = Instant::now();
        let mut nodes = self.nodes.lock().expect("nodes lock");
        merge(&mut nodes, read, mine, now);
        let live: Vec<&NodeStats> = nodes
            .values()
            .filter(|(_, changed)| is_live(*changed, now))
            .map(|(s, _)| s)
            .collect();
        let sum = |f: fn(&NodeStats) -> f64| round2(live.iter().map(|s| f(s)).sum());
        let sample = Sample {
            t: unix_ms(),
            nodes: live.len(),
            connections: live.iter().map(|s| s.connections).sum(),
            publications_per_s: sum(|s| s.publications_per_s),
            deliveries_per_s: sum(|s| s.deliveries_per_s),
            publish_ms: live.iter().map(|s| s.publish_ms).fold(0.0, f64::max),
            errors_per_s: sum(|s| s.errors_per_s),
            slow_consumers_per_s: sum(|s| s.slow_consumers_per_s),
            rate_limited_per_s: sum(|s| s.rate_limited_per_s),
        };
        drop(nodes);
        let mut series = self.series.lock().expect("series lock");
        if series.len() == SERIES_LEN {
            series.pop_front();
        }
        series.push_back(sample);
    }

    /// Answer the other nodes' open questions about a user's connections.
    async fn answer_asks(&self, hub: &Hub) {
        let broker = hub.broker();
        let Ok(asks) = cluster::read::<Ask>(&**broker, ASK_CHANNEL).await else {
            return;
        };
        let me = hub.node_name().to_owned();
        let new: Vec<Ask> = {
            let mut answered = self.answered.lock().expect("answered lock");
            answered.retain(|_, at| at.elapsed() < ANSWER_KEPT * 4);
            asks.into_iter()
                .map(|(_, ask)| ask)
                .filter(|ask| {
                    ask.from != me && answered.insert(ask.id.clone(), Instant::now()).is_none()
                })
                .collect()
        };
        for ask in new {
            let mut clients = hub.user_clients(&ask.user);
            for user in ask.users.iter().take(MAX_ASKED_USERS) {
                if *user != ask.user {
                    clients.extend(hub.user_clients(user));
                }
            }
            let answer = Answer {
                node: me.clone(),
                clients,
            };
            let channel = reply_channel(&ask.id);
            if cluster::put(&**broker, &channel, &me, Some(&answer))
                .await
                .is_err()
            {
                continue;
            }
            let broker = broker.clone();
            let me = me.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ANSWER_KEPT).await;
                let _ = cluster::remove(&*broker, &channel, &me).await;
            });
        }
    }

    /// `user`'s connections on every live node: this node's from its registry, the others'
    /// asked through the broker (answered within about a second, at most [`ASK_WAIT`]).
    pub async fn user_connections(
        &self,
        hub: &Hub,
        user: &str,
    ) -> Result<UserConnections, herald_broker::BrokerError> {
        self.ask(hub, user, Vec::new()).await
    }

    /// The connections of several users (at most [`MAX_ASKED_USERS`]) on every live node, in one
    /// question: which node hosts each client of a channel's presence.
    pub async fn users_connections(
        &self,
        hub: &Hub,
        mut users: Vec<String>,
    ) -> Result<UserConnections, herald_broker::BrokerError> {
        users.truncate(MAX_ASKED_USERS);
        let first = users.first().cloned().unwrap_or_default();
        self.ask(hub, &first, users).await
    }

    async fn ask(
        &self,
        hub: &Hub,
        user: &str,
        users: Vec<String>,
    ) -> Result<UserConnections, herald_broker::BrokerError> {
        let me = hub.node_name().to_owned();
        let mut clients = hub.user_clients(user);
        for u in users.iter().filter(|u| *u != user) {
            clients.extend(hub.user_clients(u));
        }
        let mut found = vec![Answer {
            node: me.clone(),
            clients,
        }];
        let mut waiting: Vec<String> = self
            .nodes()
            .into_iter()
            .map(|n| n.name)
            .filter(|n| *n != me)
            .collect();
        if waiting.is_empty() {
            return Ok(UserConnections {
                nodes: found,
                missing: Vec::new(),
            });
        }
        let broker = hub.broker();
        let id = format!("{:032x}", rand::random::<u128>());
        let ask = Ask {
            id: id.clone(),
            user: user.to_owned(),
            from: me,
            users,
        };
        cluster::put(&**broker, ASK_CHANNEL, &id, Some(&ask)).await?;
        let deadline = Instant::now() + ASK_WAIT;
        while !waiting.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(answers) = cluster::read::<Answer>(&**broker, &reply_channel(&id)).await else {
                continue;
            };
            for (_, answer) in answers {
                if let Some(i) = waiting.iter().position(|n| *n == answer.node) {
                    waiting.swap_remove(i);
                    found.push(answer);
                }
            }
        }
        let _ = cluster::remove(&**broker, ASK_CHANNEL, &id).await;
        found[1..].sort_by(|a, b| a.node.cmp(&b.node));
        waiting.sort();
        Ok(UserConnections {
            nodes: found,
            missing: waiting,
        })
    }

    /// This node's snapshot from its counters (rates over the time since the last call).
    fn local(&self, hub: &Hub) -> NodeStats {
        let info = hub.node_info();
        let m = hub.metrics();
        let publications = m.publications.get();
        let deliveries = m.deliveries.get();
        let slow_consumers = m.slow_consumers.get();
        let rate_limited = m.handshakes_refused.get();
        let broker_errors = counter_total(
            &hub.broker().metrics_text(),
            "herald_broker_publish_errors_total",
        );
        let errors = broker_errors + m.proxy_unavailable.get() + m.proxy_bad_answers.get();
        // The histogram's sum and count are only readable from its text rendering.
        let (publish_sum, publish_count) = histogram_totals(&m.render(), "herald_publish_seconds");
        let cpu_ticks = process_cpu_ticks().unwrap_or(0);
        let now = Instant::now();
        let mut prev = self.previous.lock().expect("previous lock");
        let mut per_s = [0.0; 3];
        let (pubs, dels, publish_ms, cpu) = match prev.at {
            Some(at) => {
                let secs = now.duration_since(at).as_secs_f64().max(0.001);
                let n = publish_count.saturating_sub(prev.publish_count);
                let ms = if n == 0 {
                    0.0
                } else {
                    (publish_sum - prev.publish_sum) * 1000.0 / n as f64
                };
                // Linux counts CPU time in ticks of 1/100 s (USER_HZ).
                let cpu = cpu_ticks.saturating_sub(prev.cpu_ticks) as f64 / secs;
                per_s = [
                    errors.saturating_sub(prev.errors) as f64 / secs,
                    slow_consumers.saturating_sub(prev.slow_consumers) as f64 / secs,
                    rate_limited.saturating_sub(prev.rate_limited) as f64 / secs,
                ];
                (
                    publications.saturating_sub(prev.publications) as f64 / secs,
                    deliveries.saturating_sub(prev.deliveries) as f64 / secs,
                    ms,
                    cpu,
                )
            }
            None => (0.0, 0.0, 0.0, 0.0),
        };
        *prev = Previous {
            at: Some(now),
            publications,
            deliveries,
            publish_sum,
            publish_count,
            cpu_ticks,
            errors,
            slow_consumers,
            rate_limited,
        };
        drop(prev);
        NodeStats {
            name: info.name,
            version: info.version,
            at_ms: unix_ms(),
            uptime_s: info.uptime_s,
            connections: info.connections,
            subscriptions: info.subscriptions,
            channels: info.channels,
            publications_per_s: round2(pubs),
            deliveries_per_s: round2(dels),
            publish_ms: round2(publish_ms),
            errors_per_s: round2(per_s[0]),
            slow_consumers_per_s: round2(per_s[1]),
            rate_limited_per_s: round2(per_s[2]),
            cpu_percent: round2(cpu),
            rss_bytes: process_rss_bytes().unwrap_or(0),
            broker: self.broker_kind.clone(),
            broker_ok: true,
            top_channels: top_channels(hub.channels(), TOP_CHANNELS),
        }
    }

    /// Every live node's latest snapshot, by name.
    pub fn nodes(&self) -> Vec<NodeStats> {
        let now = Instant::now();
        let nodes = self.nodes.lock().expect("nodes lock");
        let mut all: Vec<NodeStats> = nodes
            .values()
            .filter(|(_, changed)| is_live(*changed, now))
            .map(|(s, _)| s.clone())
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Every node known: the live ones and those lost within [`LOST_KEPT`], by name.
    pub fn all_nodes(&self) -> Vec<NodeView> {
        let now = Instant::now();
        let wall = unix_ms();
        let nodes = self.nodes.lock().expect("nodes lock");
        let mut all: Vec<NodeView> = nodes
            .values()
            .filter(|(_, changed)| is_kept(*changed, now))
            .filter_map(|(s, changed)| {
                let changed = (*changed)?;
                let lost_since_ms = (!is_live(Some(changed), now))
                    .then(|| wall.saturating_sub(now.duration_since(changed).as_millis() as u64));
                Some(NodeView {
                    stats: s.clone(),
                    state: if lost_since_ms.is_some() {
                        "lost"
                    } else {
                        "live"
                    },
                    lost_since_ms,
                })
            })
            .collect();
        all.sort_by(|a, b| a.stats.name.cmp(&b.stats.name));
        all
    }

    /// The samples kept for the charts, oldest first.
    pub fn series(&self) -> Vec<Sample> {
        self.series
            .lock()
            .expect("series lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Channels by subscribers over every node: each live node's busiest channels, summed by
    /// name, plus `local` (this node's full list; [`cluster::channel_totals`]), filtered by
    /// `query` (a substring), busiest first.
    pub fn channels(
        &self,
        local_name: &str,
        local: Vec<(String, usize)>,
        query: &str,
        limit: usize,
    ) -> Vec<(String, u64)> {
        let as_u64 = |list: Vec<(String, usize)>| {
            list.into_iter()
                .map(|(name, n)| (name, n as u64))
                .collect::<Vec<_>>()
        };
        let nodes = self
            .nodes()
            .into_iter()
            .map(|node| (node.name, as_u64(node.top_channels)));
        let sum = cluster::channel_totals(nodes, local_name, None, as_u64(local));
        let mut all: Vec<(String, u64)> = sum
            .into_iter()
            .filter(|(name, _)| query.is_empty() || name.contains(query))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(limit);
        all
    }
}

/// Every node's snapshot as last read, with when this node saw it change (`None`: not yet).
type Snapshots = HashMap<String, (NodeStats, Option<Instant>)>;

/// Fold one read of the presence set into `nodes`. A snapshot counts as live while it keeps
/// changing: one first read is not enough, since a dead node's entry stays in the broker until
/// its presence TTL, and would otherwise show up after every restart of the reader. A failed
/// read (`None`) keeps what was known, which goes stale after [`FRESH`]. A node once seen live
/// stays (lost) for [`LOST_KEPT`] after its last change, even once the broker dropped its entry.
fn merge(nodes: &mut Snapshots, read: Option<Vec<NodeStats>>, mine: NodeStats, now: Instant) {
    if let Some(read) = read {
        let mut next = Snapshots::with_capacity(read.len() + 1);
        for stats in read {
            if stats.name == mine.name {
                continue;
            }
            let changed = match nodes.get(&stats.name) {
                Some((old, changed)) if old.at_ms == stats.at_ms => *changed,
                Some(_) => Some(now),
                None => None,
            };
            next.insert(stats.name.clone(), (stats, changed));
        }
        // Gone from the broker (its presence TTL ran out): still shown as lost for a while.
        for (name, (stats, changed)) in nodes.drain() {
            if !next.contains_key(&name) && is_kept(changed, now) {
                next.insert(name, (stats, changed));
            }
        }
        *nodes = next;
    }
    nodes.insert(mine.name.clone(), (mine, Some(now)));
}

/// Whether a node is still listed: seen live, within [`LOST_KEPT`] of its last change.
fn is_kept(changed: Option<Instant>, now: Instant) -> bool {
    changed.is_some_and(|at| now.duration_since(at) < LOST_KEPT)
}

fn is_live(changed: Option<Instant>, now: Instant) -> bool {
    changed.is_some_and(|at| now.duration_since(at) < FRESH)
}

/// The `n` channels with the most subscribers.
fn top_channels(mut all: Vec<(String, usize)>, n: usize) -> Vec<(String, usize)> {
    if all.len() > n {
        all.select_nth_unstable_by(n, |a, b| b.1.cmp(&a.1));
        all.truncate(n);
    }
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all
}

/// A counter's value from Prometheus text (0 when absent: the memory broker has none).
fn counter_total(text: &str, name: &str) -> u64 {
    let key = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// `<name>_sum` and `<name>_count` from Prometheus text.
fn histogram_totals(text: &str, name: &str) -> (f64, u64) {
    let value = |suffix: &str| {
        let key = format!("{name}_{suffix} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("sum"), value("count") as u64)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// User + system CPU time of this process in clock ticks (Linux; `None` elsewhere).
fn process_cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory of this process (Linux; `None` elsewhere).
fn process_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_channels_keeps_the_busiest() {
        let all = vec![("a".into(), 1), ("b".into(), 5), ("c".into(), 3)];
        assert_eq!(
            top_channels(all, 2),
            vec![("b".to_string(), 5), ("c".to_string(), 3)]
        );
    }

    fn stats(name: &str, at_ms: u64) -> NodeStats {
        NodeStats {
            name: name.into(),
            at_ms,
            ..NodeStats::default()
        }
    }

    fn live(nodes: &Snapshots, now: Instant) -> Vec<String> {
        let mut names: Vec<String> = nodes
            .iter()
            .filter(|(_, (_, c))| is_live(*c, now))
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_node_is_live_while_its_snapshot_changes() {
        let mut nodes = Snapshots::new();
        let t0 = Instant::now();
        // First read: "b" is known but not yet live; "dead" never changes.
        let read = vec![stats("b", 1), stats("dead", 7), stats("a", 1)];
        merge(&mut nodes, Some(read), stats("a", 1), t0);
        assert_eq!(live(&nodes, t0), ["a"]);
        // "b" changed: live. "dead" did not.
        let t1 = t0 + EVERY;
        merge(
            &mut nodes,
            Some(vec![stats("b", 2), stats("dead", 7)]),
            stats("a", 2),
            t1,
        );
        assert_eq!(live(&nodes, t1), ["a", "b"]);
        // A failed read keeps what was known until it is older than FRESH.
        let t2 = t1 + EVERY;
        merge(&mut nodes, None, stats("a", 3), t2);
        assert_eq!(live(&nodes, t2), ["a", "b"]);
        let t3 = t1 + FRESH;
        merge(&mut nodes, None, stats("a", 4), t3);
        assert_eq!(live(&nodes, t3), ["a"]);
        // Gone from the broker: kept (lost) until LOST_KEPT after its last change, then
        // forgotten; "dead", never seen live, is forgotten at once.
        merge(&mut nodes, Some(vec![]), stats("a", 5), t3);
        let mut names: Vec<&String> = nodes.keys().collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        assert!(!is_live(nodes["b"].1, t3) && is_kept(nodes["b"].1, t3));
        let t4 = t1 + LOST_KEPT;
        merge(&mut nodes, Some(vec![]), stats("a", 6), t4);
        assert_eq!(nodes.len(), 1);
    }

    #[test]
    fn histogram_totals_come_from_the_text() {
        let text = "# TYPE herald_publish_seconds histogram\nherald_publish_seconds_sum 0.5\nherald_publish_seconds_count 4\nherald_publish_seconds_bucket{le=\"0.001\"} 1\n";
        assert_eq!(histogram_totals(text, "herald_publish_seconds"), (0.5, 4));
    }

    #[test]
    fn process_stats_are_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_rss_bytes().unwrap() > 0);
            assert!(process_cpu_ticks().is_some());
        }
    }
}
