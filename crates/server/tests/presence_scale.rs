//! Presence for large channels, against the real binary on each broker: `presence_stats` (counts
//! without a member list) and paged `presence` (client command and HTTP API), with members spread
//! over several nodes.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use herald_testkit::nats::NatsServer;
use herald_testkit::redis::{RedisCluster, RedisServer};
use serde_json::{json, Value};

/// How long a count may take to reach every node (leaves travel through the broker).
const SETTLE: Duration = Duration::from_secs(10);

/// A client connected on `node` as `user`, subscribed to `channel`.
async fn member(node: &Node, user: &str, channel: &str) -> Client {
    let mut c = node.client().await;
    let r = c
        .call(
            "connect",
            json!({"token": token(json!({"sub": user})), "subs": {channel: {}}}),
        )
        .await;
    assert!(r["connect"]["subs"][channel].get("error").is_none(), "{r}");
    c.connect_reply = r["connect"].clone();
    c
}

/// `presence_stats` over the client command of `c`: (clients, users).
async fn stats_of(c: &mut Client, channel: &str) -> (u64, u64) {
    let r = c.call("presence_stats", json!({"channel": channel})).await;
    let s = &r["presence_stats"];
    match (s["num_clients"].as_u64(), s["num_users"].as_u64()) {
        (Some(clients), Some(users)) => (clients, users),
        _ => panic!("not a presence_stats reply: {r}"),
    }
}

/// Every client id of `channel`, read page by page (`limit` each) through the client command.
async fn paged_by_command(c: &mut Client, channel: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 100, "paging did not end: {ids:?}");
        let mut params = json!({"channel": channel, "limit": limit});
        if let Some(cur) = &cursor {
            params["cursor"] = json!(cur);
        }
        let r = c.call("presence", params).await;
        let body = &r["presence"];
        let clients = body["clients"].as_object().unwrap_or_else(|| panic!("{r}"));
        assert!(clients.len() <= limit, "page over its limit: {r}");
        let mut page_ids: Vec<String> = clients.keys().cloned().collect();
        page_ids.sort();
        ids.extend(page_ids);
        match body["cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    ids
}

/// The same through `POST /api/presence`.
async fn paged_by_api(node: &Node, channel: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor = Value::Null;
    for page in 0.. {
        assert!(page < 100, "paging did not end: {ids:?}");
        let mut body = json!({"channel": channel, "limit": limit});
        if !cursor.is_null() {
            body["cursor"] = cursor.clone();
        }
        let (status, r) = node.api("/api/presence", Some(body)).await;
        assert_eq!(status, 200, "{r}");
        let clients = r["clients"].as_object().unwrap_or_else(|| panic!("{r}"));
        assert!(clients.len() <= limit, "page over its limit: {r}");
        let mut page_ids: Vec<String> = clients.keys().cloned().collect();
        page_ids.sort();
        ids.extend(page_ids);
        cursor = r["cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    ids
}

/// Wait until every node's `presence_stats` (command and API) answers `want`.
async fn settle(nodes: &[Node], probes: &mut [Client], channel: &str, want: (u64, u64)) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut seen = Vec::new();
        for (node, probe) in nodes.iter().zip(probes.iter_mut()) {
            seen.push(stats_of(probe, channel).await);
            let (status, r) = node
                .api("/api/presence_stats", Some(json!({"channel": channel})))
                .await;
            assert_eq!(status, 200, "{r}");
            seen.push((
                r["num_clients"].as_u64().unwrap_or(u64::MAX),
                r["num_users"].as_u64().unwrap_or(u64::MAX),
            ));
        }
        if seen.iter().all(|s| *s == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "presence_stats never reached {want:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 23 members of 5 users spread over `nodes`: counts and pages agree on every node, through both
/// the client command and the API; pages hold every member exactly once in id order; bad paging
/// is refused with 107; after 5 members leave, counts follow. Returns the members still
/// connected, so that the caller can look at the broker while they are.
async fn counts_and_pages_on(nodes: &[Node]) -> Vec<Client> {
    let channel = "scale";
    let mut members = Vec::new();
    for n in 0..23 {
        let node = &nodes[n % nodes.len()];
        members.push(member(node, &format!("user{}", n % 5), channel).await);
    }
    let mut all: Vec<String> = members
        .iter()
        .map(|c| c.connect_reply["client"].as_str().unwrap().to_owned())
        .collect();
    all.sort();
    // One probe per node: a member of the channel (presence needs a subscription or the right to
    // subscribe), counted in the totals.
    let mut probes = Vec::new();
    for node in nodes {
        let probe = member(node, "prober", channel).await;
        all.push(probe.connect_reply["client"].as_str().unwrap().to_owned());
        probes.push(probe);
    }
    all.sort();
    settle(nodes, &mut probes, channel, (all.len() as u64, 6)).await;

    for (node, probe) in nodes.iter().zip(probes.iter_mut()) {
        assert_eq!(paged_by_command(probe, channel, 4).await, all);
        assert_eq!(paged_by_api(node, channel, 7).await, all);
        assert_eq!(paged_by_command(probe, channel, 1000).await, all);
    }

    // Bad paging: a clear 107 from the command and HTTP 400 from the API.
    let probe = &mut probes[0];
    for bad in [
        json!({"channel": channel, "limit": 0}),
        json!({"channel": channel, "limit": 1001}),
        json!({"channel": channel, "cursor": "x"}),
        json!({"channel": channel, "limit": 5, "page": 2}),
    ] {
        let r = probe.call("presence", bad.clone()).await;
        assert_eq!(r["error"]["code"], 107, "{bad} → {r}");
        let (status, r) = nodes[0].api("/api/presence", Some(bad.clone())).await;
        assert_eq!((status, &r["error"]["code"]), (400, &json!(107)), "{bad}");
    }
    let r = probe
        .call("presence", json!({"channel": channel, "limit": 1001}))
        .await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("1 to 1000"),
        "{r}"
    );
    let r = probe
        .call("presence_stats", json!({"channel": "other"}))
        .await;
    assert!(r.get("presence_stats").is_some(), "{r}");

    // Every member of user0 (0, 5, 10, 15, 20) leaves: 6 → 5 users.
    for n in [20, 15, 10, 5, 0] {
        drop(members.remove(n));
    }
    settle(nodes, &mut probes, channel, (all.len() as u64 - 5, 5)).await;
    members.extend(probes);
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_pages_on_memory() {
    counts_and_pages_on(&[Node::dev().await]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_pages_on_three_redis_nodes() {
    let redis = RedisServer::start();
    let mut nodes = Vec::new();
    for name in ["r1", "r2", "r3"] {
        nodes.push(Node::on_broker(name, &redis.url()).await);
    }
    let _members = counts_and_pages_on(&nodes).await;
    // Counts are kept beside the member hash, not computed from it.
    let keys = redis.cli(&["KEYS", "herald:*"]);
    for suffix in ["pr", "pe", "po", "pu"] {
        assert!(
            keys.contains(&format!("herald:{{scale}}:{suffix}")),
            "no {suffix} key: {keys}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_pages_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let nodes = vec![
        Node::on_broker("c1", &cluster.url()).await,
        Node::on_broker("c2", &cluster.url()).await,
    ];
    counts_and_pages_on(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_pages_on_nats() {
    let nats = NatsServer::start();
    let nodes = vec![
        Node::on_broker("n1", &nats.url()).await,
        Node::on_broker("n2", &nats.url()).await,
    ];
    counts_and_pages_on(&nodes).await;
}

/// A node (`--dev`, node name `name`, on `broker_url` or in memory) with namespace `crowd`:
/// presence, join/leave pushes batched every `batch_ms`. Keep the config file as long as the node.
async fn crowd_node(name: &str, broker_url: Option<&str>, batch_ms: u64) -> (Node, ConfigFile) {
    crowd_node_with(name, broker_url, batch_ms, "").await
}

/// [`crowd_node`] with `extra` lines in the `crowd` namespace.
async fn crowd_node_with(
    name: &str,
    broker_url: Option<&str>,
    batch_ms: u64,
    extra: &str,
) -> (Node, ConfigFile) {
    let broker = broker_url
        .map(|url| format!("broker_url = \"{url}\"\n"))
        .unwrap_or_default();
    let cfg = config_file(
        "herald.toml",
        &format!(
            r#"
        {broker}
        node_name = "{name}"
        [[namespaces]]
        name = "crowd"
        presence = true
        join_leave = true
        join_leave_batch_ms = {batch_ms}
        {extra}
        "#
        ),
    );
    let node = Node::start(&["--dev", "--config", &cfg], &[]).await;
    (node, cfg)
}

/// What one observer saw of the other members' joins or leaves.
#[derive(Default)]
struct Seen {
    /// Client ids, in the order the pushes carried them.
    clients: Vec<String>,
    /// `presence_batch` pushes that carried them.
    batches: usize,
    /// Single `join` / `leave` pushes (none where batching is on).
    singles: usize,
}

/// Read `observer`'s pushes until it has seen `want` (client ids) `kind` (`join` or `leave`).
async fn observe(observer: &mut Client, kind: &str, want: &BTreeSet<String>) -> Seen {
    let mut seen = Seen::default();
    let deadline = Instant::now() + SETTLE;
    while !want.iter().all(|c| seen.clients.contains(c)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(msg) = observer.next_within(left).await else {
            panic!(
                "{kind}: saw {} of {} within {SETTLE:?}",
                seen.clients.len(),
                want.len()
            );
        };
        if let Some(batch) = msg.get("presence_batch") {
            assert_eq!(batch["channel"], "crowd:room", "{msg}");
            let changes = batch["changes"].as_array().expect("changes");
            assert!(!changes.is_empty() && changes.len() <= 500, "{msg}");
            let mut counted = false;
            for change in changes {
                if let Some(who) = change.get(kind) {
                    let client = who["client"].as_str().expect("client").to_owned();
                    if want.contains(&client) {
                        seen.clients.push(client);
                        counted = true;
                    }
                }
            }
            seen.batches += usize::from(counted);
        } else if let Some(single) = msg.get(kind) {
            seen.singles += 1;
            seen.clients
                .push(single["info"]["client"].as_str().unwrap_or("").to_owned());
        }
    }
    seen
}

/// A storm of `members` joins spread over `nodes` (observers subscribed on each node first),
/// then half of them leave: every observer sees every join and leave exactly once, only in
/// `presence_batch` pushes, in far fewer pushes than members; counts end right on every node.
async fn batched_storm_on(nodes: &[Node], members: usize) {
    let channel = "crowd:room";
    let mut observers = Vec::new();
    for node in nodes {
        observers.push(member(node, "observer", channel).await);
    }
    // The observers' own joins are not part of the storm.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for o in observers.iter_mut() {
        while o.next_within(Duration::from_millis(50)).await.is_some() {}
    }
    let started = Instant::now();
    let mut crowd = Vec::new();
    for n in 0..members {
        crowd.push(member(&nodes[n % nodes.len()], &format!("m{n}"), channel).await);
    }
    let storm = started.elapsed();
    let joined: BTreeSet<String> = crowd
        .iter()
        .map(|c| c.connect_reply["client"].as_str().unwrap().to_owned())
        .collect();
    // At most one push per 300 ms batch and node-side chunk, plus the batch still open.
    let most = (storm.as_millis() as usize / 300 + 2) * members.div_ceil(500);
    for o in observers.iter_mut() {
        let seen = observe(o, "join", &joined).await;
        assert_eq!(seen.singles, 0, "single join pushes in a batched namespace");
        assert_eq!(seen.clients.len(), members, "each join once");
        assert!(
            seen.batches <= most && seen.batches < members / 4,
            "{} joins in {} pushes over {storm:?} (at most {most})",
            members,
            seen.batches
        );
    }
    let leaving: BTreeSet<String> = crowd
        .drain(..members / 2)
        .map(|c| c.connect_reply["client"].as_str().unwrap().to_owned())
        .collect();
    for o in observers.iter_mut() {
        let seen = observe(o, "leave", &leaving).await;
        assert_eq!(
            seen.singles, 0,
            "single leave pushes in a batched namespace"
        );
        assert_eq!(seen.clients.len(), members / 2, "each leave once");
    }
    let want = (members - members / 2 + nodes.len()) as u64;
    settle(
        nodes,
        &mut observers,
        channel,
        (want, want - nodes.len() as u64 + 1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_leave_batched_on_memory() {
    let (node, _cfg) = crowd_node("m1", None, 300).await;
    batched_storm_on(&[node], 120).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_leave_batched_on_three_redis_nodes() {
    let redis = RedisServer::start();
    let mut nodes = Vec::new();
    let mut cfgs = Vec::new();
    for name in ["b1", "b2", "b3"] {
        let (node, cfg) = crowd_node(name, Some(&redis.url()), 300).await;
        nodes.push(node);
        cfgs.push(cfg);
    }
    batched_storm_on(&nodes, 120).await;
}

/// `join_leave_counts` on three Redis nodes: members joining on every node are pushed the
/// channel's counts, never who joined; every member's last count is the whole crowd, within a
/// few pushes per batch interval; after some leave, the counts follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_leave_counts_on_three_redis_nodes() {
    let redis = RedisServer::start();
    let mut nodes = Vec::new();
    let mut cfgs = Vec::new();
    for name in ["c1", "c2", "c3"] {
        let (node, cfg) =
            crowd_node_with(name, Some(&redis.url()), 200, "join_leave_counts = true").await;
        nodes.push(node);
        cfgs.push(cfg);
    }
    let members = 30;
    let started = Instant::now();
    let mut crowd = Vec::new();
    for n in 0..members {
        crowd.push(member(&nodes[n % nodes.len()], &format!("m{n}"), "crowd:room").await);
    }
    let storm = started.elapsed();
    // Read each member's pushes until its count is the whole crowd (and counts only).
    async fn until_count(c: &mut Client, want: u64) -> usize {
        let deadline = Instant::now() + SETTLE;
        let mut pushes = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(msg) = c.next_within(left).await else {
                panic!("no presence_count of {want} within {SETTLE:?} ({pushes} pushes)");
            };
            assert!(
                msg.get("presence_batch").is_none() && msg.get("join").is_none(),
                "a member list in a counts namespace: {msg}"
            );
            if let Some(count) = msg.get("presence_count") {
                assert_eq!(count["channel"], "crowd:room", "{msg}");
                pushes += 1;
                if count["num_clients"] == json!(want) {
                    assert_eq!(count["num_users"], json!(want), "{msg}");
                    return pushes;
                }
            }
        }
    }
    // At most one push per 200 ms batch and node, plus the batches still open.
    let most = (storm.as_millis() as usize / 200 + 3) * nodes.len();
    for c in crowd.iter_mut() {
        let pushes = until_count(c, members as u64).await;
        assert!(
            pushes <= most,
            "{pushes} count pushes over {storm:?} (at most {most})"
        );
    }
    crowd.truncate(members / 2);
    for c in crowd.iter_mut() {
        until_count(c, (members / 2) as u64).await;
    }
}

/// Without `join_leave_batch_ms` each join is its own push, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_leave_unbatched_by_default() {
    let (node, _cfg) = crowd_node("u1", None, 0).await;
    let mut observer = member(&node, "observer", "crowd:room").await;
    assert_eq!(observer.push("join").await["channel"], "crowd:room");
    let other = member(&node, "other", "crowd:room").await;
    let join = observer.push("join").await;
    assert_eq!(join["info"]["client"], other.connect_reply["client"]);
}

/// The same on three nodes whose Redis broker splits each channel's presence in four parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_pages_on_three_redis_nodes_in_parts() {
    let redis = RedisServer::start();
    let mut nodes = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let env = [("HERALD_REDIS__PRESENCE_PARTS", "4")];
        nodes.push(Node::on_broker_with(name, &redis.url(), &env).await);
    }
    let _members = counts_and_pages_on(&nodes).await;
    let keys = redis.cli(&["KEYS", "herald:*"]);
    let parts = keys
        .lines()
        .filter(|k| k.starts_with("herald:{scale|") && k.ends_with("}:pr"))
        .count();
    assert!(parts > 1, "presence not split: {keys}");
}

/// The join storm benchmark (docs/benchmarks.md): `STORM_MEMBERS` members (2000) join one
/// presence channel spread over three nodes on one Redis, `STORM_CONCURRENCY` (200) connecting at
/// once, with joins batched every `STORM_BATCH_MS` (100; 0: one push per join) and presence in
/// `STORM_PARTS` parts (1). Each member subscribes in its `connect`, then reads the member list
/// once and adds the joins it is pushed: its count is right when it knows every member (list ∪
/// joins, so nothing is counted twice). Prints one JSON line: the storm's duration, the time
/// until every member's count was right, join pushes per member, Redis `used_memory` before and
/// after. Ignored in ordinary runs; `HERALD_BIN` may name a release binary.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn join_storm_benchmark() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    let knob = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
            })
            .unwrap_or(default)
    };
    let members = knob("STORM_MEMBERS", 2000) as usize;
    let concurrency = knob("STORM_CONCURRENCY", 200) as usize;
    let batch_ms = knob("STORM_BATCH_MS", 100);
    let parts = knob("STORM_PARTS", 1).to_string();
    let limit = Duration::from_secs(knob("STORM_LIMIT_S", 600));

    let redis = RedisServer::start();
    let used_memory = || -> u64 {
        let info = redis.cli(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory in INFO memory")
    };
    let mut nodes = Vec::new();
    let mut cfgs = Vec::new();
    for name in ["s1", "s2", "s3"] {
        let cfg = config_file(
            "herald.toml",
            &format!(
                r#"
            broker_url = "{url}"
            node_name = "{name}"
            [[namespaces]]
            name = "crowd"
            presence = true
            join_leave = true
            join_leave_batch_ms = {batch_ms}
            "#,
                url = redis.url()
            ),
        );
        let env = [("HERALD_REDIS__PRESENCE_PARTS", parts.as_str())];
        nodes.push(Node::start(&["--dev", "--config", &cfg], &env).await);
        cfgs.push(cfg);
    }
    let memory_before = used_memory();
    let addrs: Vec<Node> = nodes
        .iter()
        .map(|n| Node::attach(&n.name, n.addr))
        .collect();
    let addrs = Arc::new(addrs);
    let gate = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..members {
        let (addrs, gate) = (addrs.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.expect("gate");
            let mut c = member(&addrs[n % addrs.len()], &format!("m{n}"), "crowd:room").await;
            let joined_at = started.elapsed();
            drop(permit);
            let mut known = vec![false; members];
            let mut count = 0usize;
            let mut learn = |who: &Value, known: &mut Vec<bool>| {
                let index = who["user"]
                    .as_str()
                    .and_then(|u| u.strip_prefix('m'))
                    .and_then(|i| i.parse::<usize>().ok());
                if let Some(i) = index.filter(|i| *i < members) {
                    if !known[i] {
                        known[i] = true;
                        count += 1;
                    }
                }
                count
            };
            let list = c.call("presence", json!({"channel": "crowd:room"})).await;
            let mut now = 0;
            for who in list["presence"]["clients"]
                .as_object()
                .expect("presence list")
                .values()
            {
                now = learn(who, &mut known);
            }
            let mut pushes = 0u64;
            while now < members {
                let Some(msg) = c.next_within(limit).await else {
                    panic!("member {n} knew {now} of {members} after {limit:?}");
                };
                if let Some(batch) = msg.get("presence_batch") {
                    pushes += 1;
                    for change in batch["changes"].as_array().expect("changes") {
                        if let Some(who) = change.get("join") {
                            now = learn(who, &mut known);
                        }
                    }
                } else if let Some(join) = msg.get("join") {
                    pushes += 1;
                    now = learn(&join["info"], &mut known);
                }
            }
            (joined_at, started.elapsed(), pushes, c)
        }));
    }
    let mut last_joined = Duration::ZERO;
    let mut right = Duration::ZERO;
    let mut pushes = Vec::new();
    let mut clients = Vec::new();
    for t in tasks {
        let (joined_at, right_at, p, c) = t.await.expect("member task");
        last_joined = last_joined.max(joined_at);
        right = right.max(right_at);
        pushes.push(p);
        clients.push(c);
    }
    let memory_after = used_memory();
    let mut probe = member(&nodes[0], "probe", "crowd:room").await;
    let (num_clients, _) = stats_of(&mut probe, "crowd:room").await;
    assert_eq!(num_clients, members as u64 + 1);
    pushes.sort_unstable();
    let mean = pushes.iter().sum::<u64>() as f64 / members as f64;
    println!(
        "{}",
        json!({
            "members": members,
            "nodes": nodes.len(),
            "concurrency": concurrency,
            "join_leave_batch_ms": batch_ms,
            "presence_parts": parts,
            "storm_s": last_joined.as_secs_f64(),
            "all_counts_right_s": right.as_secs_f64(),
            "join_pushes_per_member": {
                "mean": mean,
                "p50": pushes[members / 2],
                "max": pushes[members - 1],
            },
            "redis_used_memory_before": memory_before,
            "redis_used_memory_after": memory_after,
            "redis_bytes_per_member": (memory_after as f64 - memory_before as f64) / members as f64,
        })
    );
    drop(clients);
}
