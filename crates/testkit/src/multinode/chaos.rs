//! The chaos soak: three nodes on one broker, each linked to it through its own cuttable proxy;
//! clients subscribed on random nodes, reconnecting with `since` wherever they can; publishers
//! writing through random nodes with idempotency keys; and meanwhile, at random, a node killed
//! (`kill -9`) and started again, a node's broker link cut, or the broker restarted — where the
//! broker keeps snapshots (Redis), sometimes from a snapshot a few seconds old, losing what was
//! written since (the nodes must notice and tell their clients).
//!
//! At the end, with everything back up, every client must hold every channel up to its last
//! publication, and must never have seen a duplicate or a hole in an epoch it was not told about
//! (`recovered: false`, `unsub` 4003 and a failed recovery): 0 lost without being told, 0
//! duplicates. Broker-neutral: each broker crate's `tests/e2e.rs` runs it briefly, and
//! `scripts/chaos-soak.sh` for as long as asked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};

use super::proxy::Proxy;
use super::BrokerProcess;
use crate::client::Client;
use crate::node::Node;

const NODES: usize = 3;
const CLIENTS: usize = 6;
const CHANNELS: usize = 4;
/// What a node may hold at the end beyond twice its baseline: allocator caches, not leaks.
const MEMORY_SLACK_KIB: u64 = 32 * 1024;

/// What the soak saw; [`chaos_soak`] has already asserted the guarantees.
#[derive(Debug, Default)]
pub struct SoakReport {
    /// Publications acknowledged by the API.
    pub acknowledged: u64,
    /// Publications delivered to clients (over all clients).
    pub delivered: u64,
    /// Times a client was told it could not recover a channel (then it started over from there).
    pub told: u64,
    /// Client reconnects.
    pub reconnects: u64,
    /// Chaos actions, in order.
    pub actions: Vec<String>,
    /// Broker restarts from an older snapshot among them.
    pub rollbacks: u64,
    /// Per node process: (node, RSS KiB a moment after it was (re)started with clients
    /// connected, RSS KiB at the end once the clients left).
    pub memory: Vec<(String, u64, u64)>,
    /// From the end of the last fault to n0's first acknowledged publication after the
    /// publishers stopped: how long the cluster took to come back.
    pub back_after: Duration,
}

/// Where a client stands in one channel.
#[derive(Default, Clone)]
struct Position {
    epoch: Option<String>,
    offset: u64,
}

#[derive(Default)]
struct ClientLog {
    positions: BTreeMap<String, Position>,
    delivered: u64,
    told: u64,
    reconnects: u64,
    /// Duplicates and holes, with what happened: must stay empty.
    faults: Vec<String>,
}

impl ClientLog {
    fn publication(&mut self, client: usize, channel: &str, offset: u64) {
        let pos = self.positions.entry(channel.to_owned()).or_default();
        if offset <= pos.offset {
            self.faults.push(format!(
                "client {client} {channel}: duplicate {offset} after {}",
                pos.offset
            ));
        } else if offset != pos.offset + 1 {
            self.faults.push(format!(
                "client {client} {channel}: hole, {offset} after {} without being told",
                pos.offset
            ));
        }
        pos.offset = pos.offset.max(offset);
        self.delivered += 1;
    }

    /// A subscribe result (from `connect` or `subscribe`): recovered publications, or told.
    fn subscribed(&mut self, client: usize, channel: &str, sub: &Value) -> Result<(), String> {
        if sub.get("error").is_some() {
            return Err(format!("{channel}: {sub}"));
        }
        let had = self.positions.get(channel).cloned().unwrap_or_default();
        let epoch = sub["epoch"].as_str().map(str::to_owned);
        if had.epoch.is_some() && sub["recovered"] != true {
            // Told: start over from the position the reply gives.
            self.told += 1;
            self.positions.insert(
                channel.to_owned(),
                Position {
                    epoch,
                    offset: sub["offset"].as_u64().unwrap_or(0),
                },
            );
            return Ok(());
        }
        if had.epoch.is_none() {
            self.positions.insert(
                channel.to_owned(),
                Position {
                    epoch,
                    offset: sub["offset"].as_u64().unwrap_or(0),
                },
            );
            return Ok(());
        }
        for p in sub["publications"].as_array().into_iter().flatten() {
            self.publication(client, channel, p["offset"].as_u64().unwrap_or(0));
        }
        Ok(())
    }

    fn offsets(&self) -> BTreeMap<String, u64> {
        self.positions
            .iter()
            .map(|(ch, p)| (ch.clone(), p.offset))
            .collect()
    }

    fn since(&self, channel: &str) -> Value {
        match self.positions.get(channel) {
            Some(Position {
                epoch: Some(epoch),
                offset,
            }) => json!({ "since": { "epoch": epoch, "offset": offset } }),
            _ => json!({}),
        }
    }
}

/// Live nodes' addresses, by slot; `None` while a node is down.
type Live = Arc<Mutex<Vec<Option<SocketAddr>>>>;

fn pick(live: &Live) -> Option<SocketAddr> {
    let up: Vec<SocketAddr> = live
        .lock()
        .expect("live")
        .iter()
        .flatten()
        .copied()
        .collect();
    (!up.is_empty()).then(|| up[rand::rng().random_range(0..up.len())])
}

/// Every client's offset per channel, as it goes.
type Progress = Arc<Mutex<Vec<BTreeMap<String, u64>>>>;

async fn run_client(
    id: usize,
    channels: Vec<String>,
    live: Live,
    stop: Arc<AtomicBool>,
    progress: Progress,
) -> ClientLog {
    let mut log = ClientLog::default();
    'connection: while !stop.load(Ordering::SeqCst) {
        let Some(addr) = pick(&live) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let subs: serde_json::Map<String, Value> =
            channels.iter().map(|c| (c.clone(), log.since(c))).collect();
        let mut client: Client = match Node::attach("soak", addr)
            .try_subscriber(Value::Object(subs))
            .await
        {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        log.reconnects += 1;
        let reply = client.connect_reply.clone();
        for ch in &channels {
            if log.subscribed(id, ch, &reply["subs"][ch]).is_err() {
                // Refused for now (the broker is down: 111): reconnect and try again.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue 'connection;
            }
        }
        loop {
            match client.next_within(Duration::from_millis(200)).await {
                Some(m) => {
                    if !handle(&mut log, id, &mut client, m).await {
                        continue 'connection;
                    }
                    progress.lock().expect("progress")[id] = log.offsets();
                }
                None if client.closed => continue 'connection,
                None if stop.load(Ordering::SeqCst) => break 'connection,
                None => {}
            }
        }
    }
    log
}

/// Apply one message; `false` when the connection must be made again.
async fn handle(log: &mut ClientLog, id: usize, client: &mut Client, m: Value) -> bool {
    if let Some(p) = m.get("pub") {
        log.publication(
            id,
            p["channel"].as_str().unwrap_or(""),
            p["offset"].as_u64().unwrap_or(0),
        );
        return true;
    }
    if let Some(u) = m.get("unsub") {
        let channel = u["channel"].as_str().unwrap_or("").to_owned();
        assert_eq!(u["code"], 4003, "unexpected unsub: {m}");
        let mut params = log.since(&channel);
        params["channel"] = json!(channel);
        return match client.try_call("subscribe", params).await {
            Some(r) if r.get("subscribe").is_some() => {
                log.subscribed(id, &channel, &r["subscribe"]).is_ok()
            }
            _ => false,
        };
    }
    true
}

async fn run_publisher(
    id: usize,
    channels: Vec<String>,
    live: Live,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let channel = &channels[rand::rng().random_range(0..channels.len())];
        let key = format!("p{id}-{n}");
        // Until acknowledged (or the soak ends): the same idempotency key on any node.
        while !stop.load(Ordering::SeqCst) {
            let Some(addr) = pick(&live) else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let body = json!({"channel": channel, "data": n, "idempotency_key": key});
            if let Ok((200, _)) = Node::attach("soak", addr)
                .try_http("POST", "/api/publish", Some(body))
                .await
            {
                acked.fetch_add(1, Ordering::SeqCst);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Run the soak for `duration` against `broker`, assert the guarantees, and report.
pub async fn chaos_soak(broker: &mut dyn BrokerProcess, duration: Duration) -> SoakReport {
    let mut proxies = Vec::new();
    let mut nodes: Vec<Option<Node>> = Vec::new();
    for i in 0..NODES {
        let proxy = Proxy::start(broker.addr()).await;
        nodes.push(Some(
            Node::on_broker(&format!("n{i}"), &broker.url_via(proxy.addr)).await,
        ));
        proxies.push(proxy);
    }
    let live: Live = Arc::new(Mutex::new(
        nodes.iter().map(|n| n.as_ref().map(|n| n.addr)).collect(),
    ));
    let channels: Vec<String> = (0..CHANNELS)
        .map(|i| super::unique(&format!("soak{i}")))
        .collect();
    let stop_clients = Arc::new(AtomicBool::new(false));
    let stop_publishers = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let progress: Progress = Arc::new(Mutex::new(vec![BTreeMap::new(); CLIENTS]));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let run = run_client(
                i,
                channels.clone(),
                live.clone(),
                stop_clients.clone(),
                progress.clone(),
            );
            tokio::spawn(run)
        })
        .collect();
    let publishers: Vec<_> = (0..2)
        .map(|i| {
            let run = run_publisher(
                i,
                channels.clone(),
                live.clone(),
                stop_publishers.clone(),
                acked.clone(),
            );
            tokio::spawn(run)
        })
        .collect();

    let mut report = SoakReport::default();
    let end = Instant::now() + duration;
    let mut snapshot = false;
    // Each node process's memory once it has settled with clients: the end is compared with it.
    let mut baselines: Vec<Option<u64>> = vec![None; NODES];
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(1000..3000))).await;
        for (base, node) in baselines.iter_mut().zip(&nodes) {
            if base.is_none() {
                *base = node.as_ref().and_then(Node::rss_kib);
            }
        }
        let i = rand::rng().random_range(0..NODES);
        let pause = Duration::from_millis(rand::rng().random_range(300..2000));
        // A snapshot now and then (while the broker is up), rolled back to by action 3.
        if !snapshot || rand::rng().random_range(0..3) == 0 {
            snapshot = broker.snapshot();
        }
        let action = rand::rng().random_range(0..if snapshot { 4 } else { 3 });
        match action {
            0 => {
                report.actions.push(format!("kill -9 n{i}"));
                live.lock().expect("live")[i] = None;
                baselines[i] = None;
                if let Some(node) = nodes[i].take() {
                    node.kill().await;
                }
                tokio::time::sleep(pause).await;
                let node =
                    Node::on_broker(&format!("n{i}"), &broker.url_via(proxies[i].addr)).await;
                live.lock().expect("live")[i] = Some(node.addr);
                nodes[i] = Some(node);
            }
            1 => {
                report
                    .actions
                    .push(format!("cut n{i}'s broker link for {pause:?}"));
                proxies[i].cut();
                tokio::time::sleep(pause).await;
                proxies[i].restore();
            }
            2 => {
                report.actions.push("restart the broker".into());
                broker.stop();
                tokio::time::sleep(pause).await;
                broker.start_again();
            }
            _ => {
                report
                    .actions
                    .push("restart the broker from an older snapshot".into());
                broker.restart_from_snapshot();
                report.rollbacks += 1;
                snapshot = false;
            }
        }
    }

    // Quiesce: stop publishing, let every node settle, then a last publication per channel
    // that every client must reach.
    let faults_ended = Instant::now();
    stop_publishers.store(true, Ordering::SeqCst);
    for p in publishers {
        p.await.expect("publisher");
    }
    let mut tops = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for ch in &channels {
        loop {
            let last = nodes[0].as_ref().expect("n0 is up");
            let body = json!({"channel": ch, "data": "end"});
            match last.try_http("POST", "/api/publish", Some(body)).await {
                Ok((200, body)) => {
                    tops.insert(ch.clone(), body["offset"].as_u64().expect("offset"));
                    acked.fetch_add(1, Ordering::SeqCst);
                    if tops.len() == 1 {
                        report.back_after = faults_ended.elapsed();
                    }
                    break;
                }
                other if Instant::now() >= deadline => {
                    let why = diagnose(&mut nodes).await;
                    panic!(
                        "the cluster never came back: n0's closing publication to {ch}, {:?} after \
                         the last fault: {other:?}\n{why}\nactions: {:#?}",
                        faults_ended.elapsed(),
                        report.actions
                    );
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Every client reaches the end of every channel (or the checks below say who did not).
    let settle = Instant::now() + Duration::from_secs(30);
    while Instant::now() < settle {
        let all_there = progress.lock().expect("progress").iter().all(|offsets| {
            tops.iter()
                .all(|(ch, top)| offsets.get(ch).is_some_and(|at| at >= top))
        });
        if all_there {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_clients.store(true, Ordering::SeqCst);
    report.acknowledged = acked.load(Ordering::SeqCst);
    let mut faults = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let log = c.await.expect("client");
        report.delivered += log.delivered;
        report.told += log.told;
        report.reconnects += log.reconnects;
        faults.extend(log.faults);
        for (ch, top) in &tops {
            let at = log.positions.get(ch).map_or(0, |p| p.offset);
            if at < *top {
                faults.push(format!("client {i} {ch}: at {at}, the channel is at {top}"));
            }
        }
    }
    // Memory back to where it was: every client left, so what a node still holds beyond its
    // settled baseline (plus allocator slack) would be state that outlived its connections.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (i, node) in nodes.iter().enumerate() {
        let (Some(node), Some(base)) = (node, baselines[i]) else {
            continue;
        };
        let Some(now) = node.rss_kib() else { continue };
        report.memory.push((node.name.clone(), base, now));
        if now > base * 2 + MEMORY_SLACK_KIB {
            faults.push(format!(
                "{}: RSS {now} KiB at the end, {base} KiB after it started",
                node.name
            ));
        }
    }
    if !faults.is_empty() {
        let why = diagnose(&mut nodes).await;
        panic!("faults: {faults:#?}\n{why}\nactions: {:#?}", report.actions);
    }
    report
}

/// What each node is doing, for a failure message: whether it answers `/health` within 2 s,
/// and its process's threads over one second. A node that answers nothing while its threads
/// run flat out is busy-looping (its runtime starved), not waiting on the broker; one whose
/// threads sleep is waiting.
async fn diagnose(nodes: &mut [Option<Node>]) -> String {
    let mut out = String::from("nodes now:");
    for (i, slot) in nodes.iter_mut().enumerate() {
        let Some(node) = slot.as_mut() else {
            out.push_str(&format!("\n  n{i}: not running"));
            continue;
        };
        let health = match tokio::time::timeout(
            Duration::from_secs(2),
            node.try_http("GET", "/health", None),
        )
        .await
        {
            Ok(Ok((status, _))) => format!("/health {status}"),
            Ok(Err(err)) => format!("/health failed: {err}"),
            Err(_) => "/health no answer within 2 s".to_owned(),
        };
        let threads = match node.process().id() {
            Some(pid) => {
                let before = threads_cpu(pid);
                tokio::time::sleep(Duration::from_secs(1)).await;
                let after = threads_cpu(pid);
                match (before, after) {
                    (Some((_, before)), Some((states, after))) => format!(
                        "threads {states} (R runs, S sleeps), CPU {:.2} s in the last 1 s",
                        after.saturating_sub(before) as f64 / CLOCK_TICKS_PER_S
                    ),
                    _ => "process gone".to_owned(),
                }
            }
            None => "process exited".to_owned(),
        };
        out.push_str(&format!("\n  {}: {health}; {threads}", node.name));
    }
    out
}

/// Linux reports CPU times in `/proc` in units of `USER_HZ`, 100 per second.
const CLOCK_TICKS_PER_S: f64 = 100.0;

/// The state letter of each thread of `pid` (`RSS`: one running, two sleeping) and their CPU
/// time together (user + system, in clock ticks), from `/proc/<pid>/task/*/stat`; `None` when
/// the process is gone.
fn threads_cpu(pid: u32) -> Option<(String, u64)> {
    let mut states = String::new();
    let mut ticks = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so count from its closing paren.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Fields 3 (state), 14 (utime) and 15 (stime) of proc(5), counted from the state.
        if let (Some(state), Some(utime), Some(stime)) =
            (fields.first(), fields.get(11), fields.get(12))
        {
            states.push_str(state);
            ticks += utime.parse::<u64>().unwrap_or(0) + stime.parse::<u64>().unwrap_or(0);
        }
    }
    Some((states, ticks))
}

/// The soak's length: `HERALD_SOAK_SECS`, else `default`.
pub fn soak_duration(default: Duration) -> Duration {
    std::env::var("HERALD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(default, Duration::from_secs)
}
