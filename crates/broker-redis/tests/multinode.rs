//! Three real `herald` nodes on a real Redis (and on a real three-master Redis Cluster): one
//! server to their clients. Publications reach every hosting node exactly once, clients recover on
//! another node, nodes subscribe only to what they host, and a Redis restart in the middle of a
//! stream loses nothing.

mod support;

use std::time::{Duration, Instant};

use herald_testkit::redis::{RedisCluster, RedisOptions, RedisServer};
use serde_json::{json, Value};
use support::{Follower, Herald};

fn unique(name: &str) -> String {
    format!("{name}{:06x}", rand::random::<u32>() & 0xff_ffff)
}

fn offsets(pubs: &[Value]) -> Vec<u64> {
    pubs.iter().map(|p| p["offset"].as_u64().unwrap()).collect()
}

/// Sum of an integer reply over every Redis server.
fn sum_over(servers: &[&RedisServer], args: &[&str]) -> i64 {
    servers
        .iter()
        .map(|s| {
            s.cli(args)
                .lines()
                .last()
                .and_then(|l| l.trim().parse::<i64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

async fn three_nodes(url: &str) -> (Herald, Herald, Herald) {
    let (a, b, c) = tokio::join!(
        Herald::start(url, "a"),
        Herald::start(url, "b"),
        Herald::start(url, "c")
    );
    (a, b, c)
}

async fn exactly_once_on_hosting_nodes(url: &str, servers: &[&RedisServer], sharded: bool) {
    let (a, b, c) = three_nodes(url).await;
    let room = unique("room");
    let elsewhere = unique("elsewhere");
    let mut b1 = b.client().await;
    let mut b2 = b.client().await;
    let mut c1 = c.client().await;
    let mut a1 = a.client().await;
    for ws in [&mut b1, &mut b2, &mut c1] {
        ws.subscribe(json!({"channel": room})).await;
    }
    a1.subscribe(json!({"channel": elsewhere})).await;

    // Each node is subscribed only to the channels it hosts; never a pattern.
    let numsub = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
    let pubsub = |ch: &str| format!("herald:{{{ch}}}:p");
    assert_eq!(
        sum_over(servers, &["PUBSUB", numsub, &pubsub(&room)]),
        2,
        "B and C"
    );
    assert_eq!(
        sum_over(servers, &["PUBSUB", numsub, &pubsub(&elsewhere)]),
        1,
        "A"
    );
    for node in [&a, &b, &c] {
        assert_eq!(node.metric("herald_broker_subscribed_channels").await, 1.0);
    }

    for i in 1..=30 {
        a.publish(&room, json!({"i": i})).await;
    }
    let all: Vec<u64> = (1..=30).collect();
    for ws in [&mut b1, &mut b2, &mut c1] {
        let got = ws.publications(&room, 30, Duration::from_secs(5)).await;
        assert_eq!(offsets(&got), all, "every publication once, in order");
        assert_eq!(got[0]["data"], json!({"i": 1}));
        // Nothing more (no duplicate) arrives.
        let extra = ws.publications(&room, 1, Duration::from_millis(300)).await;
        assert!(extra.is_empty(), "duplicate: {extra:?}");
    }
    assert!(a1
        .publications(&room, 1, Duration::from_millis(100))
        .await
        .is_empty());

    assert_eq!(
        sum_over(servers, &["PUBSUB", "NUMPAT"]),
        0,
        "never PSUBSCRIBE"
    );
    assert_eq!(
        a.metric("herald_broker_messages_received_total").await,
        0.0,
        "A hosts nobody in the room"
    );
    assert_eq!(
        b.metric("herald_broker_messages_received_total").await,
        30.0,
        "once per node, not per client"
    );
    assert_eq!(
        c.metric("herald_broker_messages_received_total").await,
        30.0
    );
    assert_eq!(
        a.metric("herald_broker_messages_published_total").await,
        30.0
    );
    for node in [&a, &b, &c] {
        assert_eq!(
            node.metric("herald_hub_publications_without_subscriber_total")
                .await,
            0.0,
            "node {} received something it does not host",
            node.name
        );
    }

    // The last subscriber on C leaves: C unsubscribes in Redis.
    drop(c1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while sum_over(servers, &["PUBSUB", numsub, &pubsub(&room)]) != 1 {
        assert!(Instant::now() < deadline, "C did not unsubscribe");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.metric("herald_broker_subscribed_channels").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_publication_on_a_reaches_b_and_c_exactly_once() {
    let redis = RedisServer::start();
    exactly_once_on_hosting_nodes(&redis.url(), &[&redis], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_publication_on_a_reaches_b_and_c_exactly_once() {
    let cluster = RedisCluster::start();
    let servers: Vec<&RedisServer> = cluster.nodes().iter().collect();
    exactly_once_on_hosting_nodes(&cluster.url(), &servers, true).await;
}

async fn recovery_on_another_node(url: &str) {
    let (a, b, c) = three_nodes(url).await;
    let ch = unique("recover");
    let mut on_b = b.client().await;
    let first = on_b.subscribe(json!({"channel": ch})).await;
    for i in 1..=5 {
        c.publish(&ch, json!(i)).await;
    }
    let got = on_b.publications(&ch, 5, Duration::from_secs(5)).await;
    assert_eq!(offsets(&got), vec![1, 2, 3, 4, 5]);
    drop(on_b);
    for i in 6..=10 {
        a.publish(&ch, json!(i)).await;
    }
    // The client comes back on another node and recovers what it missed.
    let mut on_c = c.client().await;
    let since = json!({"epoch": first["epoch"], "offset": 5});
    let r = on_c.subscribe(json!({"channel": ch, "since": since})).await;
    assert_eq!(r["recovered"], true, "{r}");
    assert_eq!(r["epoch"], first["epoch"]);
    let recovered: Vec<u64> = r["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(recovered, vec![6, 7, 8, 9, 10]);
    // And live publications follow without a gap.
    b.publish(&ch, json!(11)).await;
    let live = on_c.publications(&ch, 1, Duration::from_secs(5)).await;
    assert_eq!(offsets(&live), vec![11]);
    // History through the API of any node agrees.
    let (status, h) = a
        .http(
            "POST",
            "/api/history",
            Some(json!({"channel": ch}).to_string()),
        )
        .await;
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["offset"], 11);
    assert_eq!(h["publications"].as_array().unwrap().len(), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_recovery_across_nodes() {
    let redis = RedisServer::start();
    recovery_on_another_node(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_recovery_across_nodes() {
    let cluster = RedisCluster::start();
    recovery_on_another_node(&cluster.url()).await;
}

/// Redis is restarted (kill -9, then start again with its fsynced AOF) while A publishes a stream;
/// subscribers on B and C get every publication that was acknowledged, once, in order. While Redis
/// is down, publishing fails fast with 503 / error 111 and the publisher retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_stream_loses_nothing() {
    let mut redis = RedisServer::start_with(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    });
    let url = redis.url();
    let (a, b, c) = three_nodes(&url).await;
    let ch = unique("stream");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut followers = Vec::new();
    for node in [&b, &b, &c] {
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        followers.push(tokio::spawn(Follower::run(
            node.addr,
            ch.clone(),
            ready_tx,
            stop.clone(),
            Duration::from_secs(3),
        )));
        ready.await.unwrap();
    }

    let mut acked = Vec::new();
    let mut refused = 0;
    let mut restarted = false;
    let started = Instant::now();
    let mut i = 0;
    while acked.len() < 60 {
        i += 1;
        if acked.len() == 20 && !restarted {
            redis.stop();
            restarted = true;
            let down = Instant::now();
            // Publishing fails fast while Redis is gone.
            while down.elapsed() < Duration::from_millis(1500) {
                let t = Instant::now();
                let (status, body) = a.try_publish(&ch, json!({"i": i, "down": true})).await;
                assert_eq!(status, 503, "{body}");
                assert_eq!(body["error"]["code"], 111, "{body}");
                assert!(
                    t.elapsed() < Duration::from_millis(2500),
                    "took {:?}",
                    t.elapsed()
                );
                refused += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            redis.restart();
        }
        let (status, body) = a.try_publish(&ch, json!({"i": i})).await;
        match status {
            200 => acked.push(body["offset"].as_u64().unwrap()),
            503 => {
                refused += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("publish: {other} {body}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "publisher stuck"
        );
    }
    assert!(refused > 0);
    assert_eq!(
        acked,
        (1..=60).collect::<Vec<u64>>(),
        "the stream survived the restart"
    );
    stop_tx.send(true).unwrap();
    for f in followers {
        let f = f.await.unwrap();
        eprintln!(
            "follower: {} offsets, {} client-side recoveries",
            f.offsets.len(),
            f.resubscribes
        );
        assert_eq!(f.losses, 0, "a subscriber could not recover");
        assert_eq!(
            f.offsets, acked,
            "every acknowledged publication, once, in order"
        );
    }
    for node in [&b, &c] {
        assert!(node.metric("herald_broker_reconnects_total").await >= 1.0);
        assert!(node.metric("herald_broker_catchups_total").await >= 1.0);
        assert!(node.metric("herald_broker_resubscriptions_total").await >= 2.0);
    }
    assert!(a.metric("herald_broker_publish_errors_total").await >= refused as f64);
}

/// Presence lives in Redis and join/leave travel between nodes: a client on A is listed by C
/// (which hosts nobody) and B's client sees it join and leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_and_join_leave_across_nodes() {
    let redis = RedisServer::start();
    let (a, b, c) = three_nodes(&redis.url()).await;
    let ch = unique("presence");
    let mut on_b = b.client().await;
    on_b.subscribe(json!({"channel": ch})).await;
    let mut on_a = a.client().await;
    on_a.subscribe(json!({"channel": ch})).await;
    let a_client = on_a.connect["client"].as_str().unwrap().to_owned();

    let joined = presence_push(&mut on_b, &ch, "join", &a_client).await;
    assert_eq!(joined["info"]["client"], a_client.as_str());

    let (status, p) = c
        .http(
            "POST",
            "/api/presence",
            Some(json!({"channel": ch}).to_string()),
        )
        .await;
    assert_eq!(status, 200, "{p}");
    let clients = p["clients"].as_object().expect("clients");
    assert_eq!(clients.len(), 2, "{p}");
    assert!(clients.contains_key(&a_client));

    let r = on_a
        .call("unsubscribe", json!({"channel": ch}))
        .await
        .unwrap();
    assert!(r.get("unsubscribe").is_some(), "{r}");
    let left = presence_push(&mut on_b, &ch, "leave", &a_client).await;
    assert_eq!(left["info"]["client"], a_client.as_str());
    let (_, p) = b
        .http(
            "POST",
            "/api/presence",
            Some(json!({"channel": ch}).to_string()),
        )
        .await;
    assert_eq!(p["clients"].as_object().map(|c| c.len()), Some(1), "{p}");
}

/// The next `join`/`leave` push of `client` on `ch` (other pushes are skipped).
async fn presence_push(ws: &mut support::Ws, ch: &str, kind: &str, client: &str) -> Value {
    loop {
        match ws.next_push(Duration::from_secs(5)).await {
            Ok(Some(p))
                if p.get(kind).is_some()
                    && p[kind]["channel"] == ch
                    && p[kind]["info"]["client"] == client =>
            {
                return p[kind].clone()
            }
            Ok(Some(_)) => continue,
            other => panic!("no {kind} push: {other:?}"),
        }
    }
}
