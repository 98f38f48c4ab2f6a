//! The multi-node suite: real `herald` nodes sharing one broker, proving the guarantees of
//! docs/protocol.md end to end. Written against [`BrokerProcess`] only, so the one suite runs
//! against every broker: each broker crate's `tests/e2e.rs` calls these functions with its server.
//!
//! - [`chaos`]: the chaos soak (kills, link cuts and broker restarts under load).
//! - [`proxy`]: a TCP proxy that can cut one node off the broker.
//! - [`redis`]: [`BrokerProcess`] for a standalone Redis and a Redis Cluster.
//! - [`rollback`]: a broker restored from an older snapshot with two nodes (issue 29 item 5).

pub mod chaos;
pub mod proxy;
pub mod redis;
pub mod rollback;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::node::Node;
use crate::{eventually, eventually_ok};

/// A broker server the nodes share, which the suite can inspect, stop and start.
pub trait BrokerProcess {
    /// What nodes get as `HERALD_BROKER_URL`.
    fn url(&self) -> String;
    /// Stop it (the way an operator restarts it; data on disk stays).
    fn stop(&mut self);
    /// Start it again at the same address with the same data.
    fn start_again(&mut self);
    /// Every herald channel some node holds a broker subscription for, with the number of
    /// subscriptions (one per hosting node), as the broker server reports them.
    fn channel_subscriptions(&self) -> BTreeMap<String, usize>;
    /// Panic if any node holds a pattern (wildcard) subscription: nodes subscribe per channel.
    fn assert_no_patterns(&self);
    /// The broker's TCP address.
    fn addr(&self) -> std::net::SocketAddr;
    /// The broker URL with `addr` in place of the broker's own (to go through a proxy).
    fn url_via(&self, addr: std::net::SocketAddr) -> String;
    /// Keep a snapshot of the broker's data to roll back to; `false` where this broker has none.
    fn snapshot(&mut self) -> bool {
        false
    }
    /// Kill the broker and start it from the last [`snapshot`](Self::snapshot), losing what was
    /// written since (only called after `snapshot` returned `true`).
    fn restart_from_snapshot(&mut self) {
        unimplemented!("this broker keeps no snapshots")
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

async fn nodes(broker: &dyn BrokerProcess, names: &[&str]) -> Vec<Node> {
    nodes_with(broker, names, &[]).await
}

async fn nodes_with(broker: &dyn BrokerProcess, names: &[&str], env: &[(&str, &str)]) -> Vec<Node> {
    let mut out = Vec::new();
    for name in names {
        out.push(Node::on_broker_with(name, &broker.url(), env).await);
    }
    out
}

/// Publications reach every node that hosts a subscriber, exactly once and in order, and only
/// those nodes: a node without subscribers neither subscribes at the broker nor receives.
pub async fn cross_node_delivery_exactly_once(broker: &mut dyn BrokerProcess) {
    let n = nodes(broker, &["a", "b", "c"]).await;
    let (a, b, c) = (&n[0], &n[1], &n[2]);
    let ch = unique("room");
    let mut on_b = b.subscriber(json!({ &ch: {} })).await;
    let mut on_c = c.subscriber(json!({ &ch: {} })).await;
    let other = unique("elsewhere");
    let _on_c_other = c.subscriber(json!({ &other: {} })).await;

    // Each node subscribes only to the channels it hosts (once), never to a pattern: the broker
    // server sees exactly these subscriptions, and each node reports its own.
    let expected = BTreeMap::from([(ch.clone(), 2), (other.clone(), 1)]);
    assert_eq!(
        broker.channel_subscriptions(),
        expected,
        "b and c host {ch}, c {other}"
    );
    broker.assert_no_patterns();
    for (node, hosted) in [(a, 0.0), (b, 1.0), (c, 2.0)] {
        assert_eq!(
            node.metric("herald_broker_subscribed_channels").await,
            hosted,
            "channels {} subscribes to",
            node.name
        );
    }

    for i in 0..100 {
        let offset = a.publish(&ch, json!({ "i": i })).await["offset"]
            .as_u64()
            .expect("offset");
        assert_eq!(offset, i + 1);
    }
    let all: Vec<u64> = (1..=100).collect();
    assert_eq!(
        on_b.offsets(&ch, 100, Duration::from_secs(5)).await,
        all,
        "b"
    );
    assert_eq!(
        on_c.offsets(&ch, 100, Duration::from_secs(5)).await,
        all,
        "c"
    );
    for client in [&mut on_b, &mut on_c] {
        let extra = client.offsets(&ch, 1, Duration::from_millis(300)).await;
        assert!(extra.is_empty(), "exactly once: got {extra:?} again");
    }
    for node in [a, b, c] {
        let stray = node
            .metric("herald_hub_publications_without_subscriber_total")
            .await;
        assert_eq!(
            stray, 0.0,
            "{} received publications it does not host",
            node.name
        );
    }

    // Interest follows the last local subscriber.
    let reply = on_b.call("unsubscribe", json!({ "channel": &ch })).await;
    assert!(reply.get("unsubscribe").is_some(), "{reply}");
    let expected = BTreeMap::from([(ch.clone(), 1), (other.clone(), 1)]);
    eventually_ok(
        Duration::from_secs(5),
        "b drops its broker subscription",
        || async {
            match broker.channel_subscriptions() {
                now if now == expected => Ok(()),
                now => Err(format!("{now:?}")),
            }
        },
    )
    .await;
    assert_eq!(b.metric("herald_broker_subscribed_channels").await, 0.0);
    assert_eq!(c.metric("herald_broker_subscribed_channels").await, 2.0);
}

/// A client that left one node recovers what it missed on another node, then gets live
/// publications with no gap and no duplicate.
pub async fn recovery_across_nodes(broker: &mut dyn BrokerProcess) {
    let n = nodes(broker, &["a", "b", "c"]).await;
    let (a, b, c) = (&n[0], &n[1], &n[2]);
    let ch = unique("recover");
    let mut first = a.subscriber(json!({ &ch: {} })).await;
    let epoch = first.connect_reply["subs"][&ch]["epoch"]
        .as_str()
        .expect("epoch")
        .to_owned();
    for i in 1..=3 {
        b.publish(&ch, json!(i)).await;
    }
    assert_eq!(
        first.offsets(&ch, 3, Duration::from_secs(5)).await,
        vec![1, 2, 3]
    );
    drop(first);

    for i in 4..=8 {
        c.publish(&ch, json!(i)).await;
    }
    let mut back = b
        .subscriber(json!({ &ch: { "since": { "epoch": &epoch, "offset": 3 } } }))
        .await;
    let sub = &back.connect_reply["subs"][&ch];
    assert_eq!(sub["recovered"], json!(true), "{sub}");
    assert_eq!(sub["epoch"], json!(epoch));
    let recovered: Vec<u64> = sub["publications"]
        .as_array()
        .expect("publications")
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(recovered, vec![4, 5, 6, 7, 8]);
    a.publish(&ch, json!(9)).await;
    assert_eq!(back.offsets(&ch, 1, Duration::from_secs(5)).await, vec![9]);
    assert!(
        back.offsets(&ch, 1, Duration::from_millis(300))
            .await
            .is_empty(),
        "no duplicate"
    );
    // History through the API of any node agrees.
    for node in [a, b, c] {
        let (status, h) = node
            .api("/api/history", Some(json!({ "channel": &ch })))
            .await;
        assert_eq!(status, 200, "{h}");
        assert_eq!(h["offset"], json!(9), "{h}");
        assert_eq!(h["publications"].as_array().map(Vec::len), Some(9), "{h}");
    }

    // From a stale epoch: told plainly, never given a partial history.
    let mut stale = c
        .subscriber(json!({ &ch: { "since": { "epoch": "not-the-epoch", "offset": 3 } } }))
        .await;
    let sub = &stale.connect_reply["subs"][&ch];
    assert_eq!(sub["recovered"], json!(false), "{sub}");
    let replayed = sub["publications"].as_array().cloned().unwrap_or_default();
    assert!(replayed.is_empty(), "never partial: {sub}");
    while let Some(m) = stale.next_within(Duration::from_millis(100)).await {
        assert!(
            m.get("pub").is_none(),
            "nothing replayed from a stale position: {m}"
        );
    }
}

/// The broker restarts while a publisher is mid-stream: publishing fails fast (503) during the
/// outage, and once the broker is back every publication the API acknowledged reaches the
/// subscriber on another node, in order, exactly once, without the client reconnecting.
///
/// On Redis `env` must declare the broker's persistence synchronous
/// (`HERALD_REDIS__SYNCHRONOUS_PERSISTENCE`): otherwise every restart starts new epochs and the
/// client is told to recover, by design.
pub async fn broker_restart_mid_stream_loses_nothing(
    broker: &mut dyn BrokerProcess,
    env: &[(&str, &str)],
) {
    let n = nodes_with(broker, &["a", "b"], env).await;
    let ch = unique("restart");
    let mut client = n[1].subscriber(json!({ &ch: {} })).await;
    let total = 60u64;
    let resume_at = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let resumed = std::sync::Arc::new(tokio::sync::Notify::new());
    let publisher = {
        let a_addr = n[0].addr;
        let ch = ch.clone();
        let (resume_at, resumed) = (resume_at.clone(), resumed.clone());
        tokio::spawn(async move {
            let a = Node::attach("a", a_addr);
            let mut refused = 0u32;
            let mut slowest_refusal = Duration::ZERO;
            for i in 1..=total {
                // Stop at the first publication accepted after the outage, until the test has
                // seen it arrive: nothing later may reveal a gap in its place.
                if refused > 0 && i == resume_at.load(std::sync::atomic::Ordering::SeqCst) {
                    resumed.notified().await;
                }
                let key = format!("k{i}");
                // How long each refused try took.
                let tries = std::sync::Mutex::new(Vec::new());
                eventually_ok(
                    Duration::from_secs(30),
                    &format!("publication {i} accepted (the broker back)"),
                    || async {
                        let t = Instant::now();
                        let (status, body) = a.try_publish(&ch, json!(i), Some(&key)).await;
                        if status == 200 {
                            return Ok(());
                        }
                        assert_eq!(
                            status, 503,
                            "only 'unavailable' while the broker is down: {body}"
                        );
                        resume_at.store(i + 1, std::sync::atomic::Ordering::SeqCst);
                        tries.lock().unwrap().push(t.elapsed());
                        Err(format!("{status}: {body}"))
                    },
                )
                .await;
                for took in tries.into_inner().unwrap() {
                    refused += 1;
                    slowest_refusal = slowest_refusal.max(took);
                }
                // Paced (the point): the stream is still going when the broker stops.
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            (refused, slowest_refusal)
        })
    };
    let before = client.offsets(&ch, 15, Duration::from_secs(5)).await;
    assert_eq!(before, (1..=15).collect::<Vec<_>>());
    broker.stop();
    // The outage lasts 700 ms (the scenario: publishing fails fast throughout it, not once), and
    // until the publisher has been refused at least once.
    tokio::time::sleep(Duration::from_millis(700)).await;
    eventually(
        Duration::from_secs(10),
        "the publisher refused (503) while the broker is down",
        || async { resume_at.load(std::sync::atomic::Ordering::SeqCst) > 0 },
    )
    .await;
    broker.start_again();
    // The publisher pauses after its first publication accepted after the outage (offset
    // `resume_at - 1`): everything up to it must arrive with nothing published later.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut middle = Vec::new();
    loop {
        let paused_after = resume_at.load(std::sync::atomic::Ordering::SeqCst);
        let want = paused_after.saturating_sub(1);
        let have = before.len() as u64 + middle.len() as u64;
        if paused_after > 0 && have >= want {
            break;
        }
        assert!(Instant::now() < deadline, "stuck at {have} of {want}");
        middle.extend(client.offsets(&ch, 1, Duration::from_millis(200)).await);
    }
    resumed.notify_one();
    let (refused, slowest) = publisher.await.expect("publisher");
    assert!(refused > 0, "the outage was not seen by the publisher");
    assert!(
        slowest < Duration::from_secs(1),
        "a refusal took {slowest:?}: not fast"
    );

    let rest = client
        .offsets(
            &ch,
            (total as usize) - before.len() - middle.len(),
            Duration::from_secs(10),
        )
        .await;
    let got: Vec<u64> = before
        .iter()
        .chain(middle.iter())
        .chain(rest.iter())
        .copied()
        .collect();
    assert_eq!(
        got,
        (1..=total).collect::<Vec<_>>(),
        "in order, no gap, no duplicate"
    );
    assert!(client
        .offsets(&ch, 1, Duration::from_millis(300))
        .await
        .is_empty());
    assert_eq!(client.close_code, None, "the client never had to reconnect");
}

/// One node loses the broker for a moment while another keeps publishing: when it is back, its
/// subscriber gets every publication it missed (caught up from history), in order, exactly once,
/// without reconnecting.
pub async fn subscriber_node_blip_loses_nothing(broker: &mut dyn BrokerProcess) {
    let proxy = proxy::Proxy::start(broker.addr()).await;
    let a = Node::on_broker("a", &broker.url()).await;
    let b = Node::on_broker("b", &broker.url_via(proxy.addr)).await;
    let ch = unique("blip");
    let mut client = b.subscriber(json!({ &ch: {} })).await;
    for i in 1..=5 {
        a.publish(&ch, json!(i)).await;
    }
    assert_eq!(
        client.offsets(&ch, 5, Duration::from_secs(5)).await,
        vec![1, 2, 3, 4, 5]
    );

    proxy.cut();
    for i in 6..=40 {
        a.publish(&ch, json!(i)).await;
    }
    // b saw its link go down before it may come back: what it missed comes by a reconnect.
    eventually(
        Duration::from_secs(10),
        "b reporting its broker link down (herald_broker_connected 0)",
        || async { b.metric("herald_broker_connected").await == 0.0 },
    )
    .await;
    proxy.restore();
    // Nothing is published after the outage yet: only the reconnect's catch-up can bring these.
    let missed = client.offsets(&ch, 35, Duration::from_secs(10)).await;
    assert_eq!(
        missed,
        (6..=40).collect::<Vec<_>>(),
        "publications made only during the outage, caught up in order"
    );
    for i in 41..=45 {
        a.publish(&ch, json!(i)).await;
        // Paced (the point): live publications, one at a time.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rest = client.offsets(&ch, 5, Duration::from_secs(10)).await;
    assert_eq!(
        rest,
        (41..=45).collect::<Vec<_>>(),
        "then live; no gap, no duplicate"
    );
    assert!(client
        .offsets(&ch, 1, Duration::from_millis(300))
        .await
        .is_empty());
    assert_eq!(
        client.close_code, None,
        "caught up without the client reconnecting"
    );
}

/// Presence and join/leave span nodes.
pub async fn presence_across_nodes(broker: &mut dyn BrokerProcess) {
    let n = nodes(broker, &["a", "b", "c"]).await;
    let ch = unique("who");
    let mut on_a = n[0].subscriber(json!({ &ch: {} })).await;
    let _on_b = n[1].subscriber(json!({ &ch: {} })).await;
    // a hears about b's client joining.
    let mut joined = None;
    while let Some(m) = on_a.next_within(Duration::from_secs(5)).await {
        if m.get("join").is_some() {
            joined = Some(m);
            break;
        }
    }
    let joined = joined.expect("join push on a");
    assert_eq!(joined["join"]["channel"], json!(ch));
    let clients = |v: &Value| -> BTreeSet<String> {
        v["clients"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let (status, body) = n[2]
        .api("/api/presence", Some(json!({ "channel": &ch })))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(clients(&body).len(), 2, "{body}");
}

/// An SSE reader (`EventSource`, `curl -N`) that drops and comes back through another node with
/// `Last-Event-ID` gets what it missed on every channel, published through a third node, in
/// order, exactly once, then live publications.
pub async fn sse_resume_across_nodes(broker: &mut dyn BrokerProcess) {
    let n = nodes(broker, &["a", "b", "c"]).await;
    let (a, b, c) = (&n[0], &n[1], &n[2]);
    let (x, y) = (unique("sse-x"), unique("sse-y"));
    let query = format!("channel={x}&channel={y}");

    let mut first = a.sse(&query, None);
    let (name, _, _) = first.event().await;
    assert_eq!(name, "connected");
    b.publish(&x, json!(1)).await;
    b.publish(&y, json!(1)).await;
    let mut last_id = String::new();
    for _ in 0..2 {
        let (id, p) = first.publication().await;
        assert_eq!(p["offset"], 1, "{p}");
        last_id = id;
    }
    drop(first);

    for i in 2..=4 {
        c.publish(&x, json!(i)).await;
    }
    c.publish(&y, json!(2)).await;
    let mut back = b.sse(&query, Some(&last_id));
    let mut got = Vec::new();
    for _ in 0..4 {
        let (_, p) = back.publication().await;
        got.push((
            p["channel"].as_str().expect("channel").to_owned(),
            p["offset"].as_u64().expect("offset"),
        ));
    }
    let in_x: Vec<u64> = got.iter().filter(|(ch, _)| *ch == x).map(|g| g.1).collect();
    let in_y: Vec<u64> = got.iter().filter(|(ch, _)| *ch == y).map(|g| g.1).collect();
    assert_eq!((in_x, in_y), (vec![2, 3, 4], vec![2]), "{got:?}");

    a.publish(&x, json!(5)).await;
    let (_, p) = back.publication().await;
    assert_eq!((&p["channel"], &p["offset"]), (&json!(x), &json!(5)), "{p}");
}

/// `a` publishes `total` publications to `channel` (each with an idempotency key, retried until
/// acknowledged) while a client on `b` is subscribed; after the first `fail_after`, `failure` runs
/// (a slot migration, a killed broker server…). Every acknowledged publication must reach the
/// client once, in order; being told with `unsub` 4003 and recovering with `since` counts, as a
/// client would.
pub async fn nothing_lost_through(
    a: &Node,
    b: &Node,
    channel: &str,
    total: u64,
    fail_after: usize,
    failure: impl FnOnce(),
) {
    use std::sync::{Arc, Mutex};

    let mut live = b.subscriber(json!({ channel: {} })).await;
    let epoch = live.connect_reply["subs"][channel]["epoch"].clone();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let publisher = {
        let (acked, ch) = (acked.clone(), channel.to_owned());
        let a = Node::attach(&a.name, a.addr);
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            for i in 1..=total {
                let key = format!("k{i}");
                let body = eventually_ok(
                    deadline.saturating_duration_since(Instant::now()),
                    &format!("publication {i} accepted (publishing recovered, 60 s for all)"),
                    || async {
                        match a.try_publish(&ch, json!(i), Some(&key)).await {
                            (200, body) => Ok(body),
                            (status, body) => Err(format!("{status}: {body}")),
                        }
                    },
                )
                .await;
                acked.lock().unwrap().push(body["offset"].as_u64().unwrap());
                // Paced (the point): publications keep coming through the failure.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    eventually_ok(
        Duration::from_secs(30),
        &format!("{fail_after} publications acknowledged before the failure"),
        || async {
            match acked.lock().unwrap().len() {
                n if n >= fail_after => Ok(()),
                n => Err(format!("{n} acknowledged")),
            }
        },
    )
    .await;
    failure();
    publisher.await.expect("publisher");
    let acked = acked.lock().unwrap().clone();
    assert_eq!(
        acked,
        (1..=total).collect::<Vec<_>>(),
        "offsets as acknowledged"
    );

    let mut got: Vec<u64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < total as usize {
        assert!(
            Instant::now() < deadline,
            "missing after the failure: got {got:?}"
        );
        let Some(m) = live.next_within(Duration::from_millis(500)).await else {
            continue;
        };
        if m["pub"]["channel"] == channel {
            got.push(m["pub"]["offset"].as_u64().unwrap());
        } else if m["unsub"]["channel"] == channel {
            assert_eq!(m["unsub"]["code"], 4003, "{m}");
            let since = json!({"epoch": epoch, "offset": got.last().copied().unwrap_or(0)});
            let r = live
                .call("subscribe", json!({"channel": channel, "since": since}))
                .await;
            assert_eq!(r["subscribe"]["recovered"], true, "{r}");
            for p in r["subscribe"]["publications"]
                .as_array()
                .into_iter()
                .flatten()
            {
                got.push(p["offset"].as_u64().unwrap());
            }
        }
    }
    assert_eq!(
        got,
        (1..=total).collect::<Vec<_>>(),
        "every publication once, in order"
    );
}
