//! Several brokers (one per simulated node) on one real Redis or Redis Cluster: targeted delivery,
//! recovery across nodes, batching, presence expiry, and losing Redis without losing publications.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_broker::conformance::{self, eventually, opts, unique, Recorder};
use herald_broker::{BrokerError, ControlMessage, HistoryQuery, PublishTarget, SharedBroker};
use herald_broker_redis::RedisConfig;
use herald_protocol::{ClientInfo, StreamPosition};
use herald_testkit::redis::{RedisCluster, RedisOptions, RedisServer};

async fn node(cfg: &RedisConfig, name: &str) -> (SharedBroker, Arc<Recorder>) {
    let broker = herald_broker_redis::connect_with(cfg.clone(), name)
        .await
        .expect("connect");
    let rec = Arc::new(Recorder::default());
    broker.start(rec.clone()).await.expect("start");
    (broker, rec)
}

fn metric(broker: &SharedBroker, name: &str) -> f64 {
    let text = broker.metrics_text();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// Sum of an integer reply over every server (a Cluster's `PUBSUB SHARDNUMSUB` answers per node).
fn sum_over(servers: &[&RedisServer], args: &[&str]) -> i64 {
    servers
        .iter()
        .map(|s| {
            let out = s.cli(args);
            out.lines()
                .last()
                .and_then(|l| l.trim().parse::<i64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

async fn targeted_fanout(cfg: RedisConfig, servers: &[&RedisServer], cluster: bool) {
    let (a, ra) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let (c, rc) = node(&cfg, "c").await;
    let ch = unique("room");
    b.subscribe(&ch).await.unwrap();
    c.subscribe(&ch).await.unwrap();
    let numsub = if cluster { "SHARDNUMSUB" } else { "NUMSUB" };
    let pubsub = format!("herald:{{{ch}}}:p");
    assert_eq!(
        sum_over(servers, &["PUBSUB", numsub, &pubsub]),
        2,
        "B and C only"
    );

    for i in 0..100 {
        a.publish(&ch, Bytes::from(i.to_string()), None, &opts(200))
            .await
            .unwrap();
    }
    eventually("B and C got 100", || {
        rb.offsets(&ch).len() >= 100 && rc.offsets(&ch).len() >= 100
    })
    .await;
    // A moment for a duplicate or a stray delivery to show up: nothing more may arrive.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let all: Vec<u64> = (1..=100).collect();
    assert_eq!(rb.offsets(&ch), all, "exactly once, in order, on B");
    assert_eq!(rc.offsets(&ch), all, "exactly once, in order, on C");
    assert!(
        ra.offsets(&ch).is_empty(),
        "A hosts nobody: it receives nothing"
    );
    assert_eq!(metric(&a, "herald_broker_messages_received_total"), 0.0);
    assert_eq!(metric(&b, "herald_broker_messages_received_total"), 100.0);
    assert_eq!(metric(&a, "herald_broker_messages_published_total"), 100.0);
    assert_eq!(metric(&b, "herald_broker_subscribed_channels"), 1.0);
    assert_eq!(
        sum_over(servers, &["PUBSUB", "NUMPAT"]),
        0,
        "never a pattern subscription"
    );

    // The epoch travels with every publication.
    let epoch = rb.publications.lock().unwrap()[0].1.clone();
    let h = b
        .history(&ch, &HistoryQuery::default(), &opts(200).stream)
        .await
        .unwrap();
    assert_eq!(h.position.epoch, epoch);

    // C's last subscriber leaves: C stops receiving.
    c.unsubscribe(&ch).await.unwrap();
    assert_eq!(sum_over(servers, &["PUBSUB", numsub, &pubsub]), 1);
    a.publish(&ch, Bytes::from_static(b"101"), None, &opts(200))
        .await
        .unwrap();
    eventually("B got 101", || rb.offsets(&ch).len() == 101).await;
    // A moment for a stray delivery to C to show up: none may.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rc.offsets(&ch).len(), 100);
    assert_eq!(metric(&c, "herald_broker_subscribed_channels"), 0.0);

    // Presence changes reach the nodes hosting the channel; control messages reach every node.
    let who = ClientInfo {
        user: "alice".into(),
        client: "c1".into(),
        info: None,
    };
    a.publish_presence_change(&ch, true, &who).await.unwrap();
    eventually("join on B", || {
        rb.presence_changes.lock().unwrap().len() == 1
    })
    .await;
    assert_eq!(
        rb.presence_changes.lock().unwrap()[0],
        (ch.clone(), true, who)
    );
    let msg = ControlMessage::Unsubscribe {
        user: "bob".into(),
        channel: ch.clone(),
    };
    b.publish_control(&msg).await.unwrap();
    for rec in [&ra, &rb, &rc] {
        eventually("control everywhere", || {
            rec.controls.lock().unwrap().contains(&msg)
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_delivers_only_to_hosting_nodes_exactly_once() {
    let redis = RedisServer::start();
    targeted_fanout(RedisConfig::from_url(&redis.url()), &[&redis], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_delivers_only_to_hosting_nodes_exactly_once() {
    let cluster = RedisCluster::start();
    let servers: Vec<&RedisServer> = cluster.nodes().iter().collect();
    targeted_fanout(RedisConfig::from_url(&cluster.url()), &servers, true).await;
    // Sharded pub/sub only: no node-wide channel subscriptions besides none at all.
    assert_eq!(sum_over(&servers, &["PUBSUB", "NUMPAT"]), 0);
}

/// Reading a channel nobody published to creates its epoch, kept only `empty_ttl` after the last
/// read (not the day-long meta TTL), so that clients reading fresh names cannot make Redis hold
/// a day of state each; the first publish keeps it the meta TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_only_read_keeps_its_epoch_for_the_empty_ttl() {
    let redis = RedisServer::start();
    let (a, _) = node(&RedisConfig::from_url(&redis.url()), "a").await;
    let ch = unique("fresh");
    let mut o = opts(10);
    o.stream.empty_ttl = Duration::from_secs(5);
    let top = HistoryQuery {
        since: None,
        limit: Some(0),
    };
    let read = a.history(&ch, &top, &o.stream).await.unwrap().position;
    assert_eq!(read.offset, 0);
    let meta = redis
        .cli(&["KEYS", &format!("*{{{ch}}}:m")])
        .trim()
        .to_owned();
    assert!(!meta.is_empty(), "the read created the epoch");
    let pttl = |r: &RedisServer| -> i64 { r.cli(&["PTTL", &meta]).trim().parse().unwrap() };
    let ttl = pttl(&redis);
    assert!(ttl > 0 && ttl <= 5_000, "empty stream TTL {ttl} ms");
    // A second read extends it and keeps the epoch. Time passes (the TTL runs down) first, so
    // that the extension shows.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let again = a.history(&ch, &top, &o.stream).await.unwrap().position;
    assert_eq!(again, read);
    assert!(pttl(&redis) > ttl - 1_000, "the read extended the TTL");
    // The first publish continues the epoch and keeps it the meta TTL.
    let p = a
        .publish(&ch, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    assert_eq!(p.epoch, read.epoch);
    assert!(
        pttl(&redis) > 5_000,
        "a published stream keeps the meta TTL"
    );
}

/// Entries older than the history TTL leave Redis's memory, not only the reads: the publish
/// script trims them by age every 16th offset (crate::scripts::PUBLISH). The stream itself lives
/// the TTL after its last publication, so a publication in between keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_older_than_its_ttl_is_trimmed_from_redis() {
    let redis = RedisServer::start();
    let (a, _) = node(&RedisConfig::from_url(&redis.url()), "a").await;
    let ch = unique("aged");
    let mut o = opts(100);
    o.stream.history_ttl = Duration::from_secs(2);
    let xlen = |r: &RedisServer| -> i64 {
        r.cli(&["XLEN", &format!("herald:{{{ch}}}:h")])
            .trim()
            .parse()
            .unwrap()
    };
    let publish = |n: u64| {
        let (a, ch, o) = (a.clone(), ch.clone(), o.clone());
        async move {
            let p = a
                .publish(&ch, Bytes::from(n.to_string()), None, &o)
                .await
                .unwrap();
            assert_eq!(p.offset, n);
        }
    };
    // Offsets 1-5 at 0 s, 6 at 1.2 s (the stream would expire at 2 s), 7-16 at 2.4 s, when 1-5
    // are past the 2 s TTL and 6 is not.
    for n in 1..=5 {
        publish(n).await;
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    publish(6).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for n in 7..=16 {
        publish(n).await;
    }
    assert_eq!(
        xlen(&redis),
        11,
        "offsets 1-5, older than the 2 s TTL, are trimmed on offset 16"
    );
    let kept = a
        .history(
            &ch,
            &HistoryQuery {
                since: None,
                limit: None,
            },
            &o.stream,
        )
        .await
        .unwrap();
    let offsets: Vec<u64> = kept.publications.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, (6..=16).collect::<Vec<_>>());
}

/// The hub's tail check reads positions in bulk: streams that are plainly current come from one
/// `HMGET` pipeline (per shard, or per master of a Cluster), with no script call each; a stream
/// never published and one bound to another Redis process take the history script, which starts
/// the latter over. Every answer is the one `history` with `limit: 0` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_read_current_streams_without_a_script_each() {
    let redis = RedisServer::start();
    positions_in_bulk(&RedisConfig::from_url(&redis.url()), &[&redis], |_| 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_positions_read_current_streams_without_a_script_each() {
    let cluster = RedisCluster::start();
    let servers: Vec<&RedisServer> = cluster.nodes().iter().collect();
    positions_in_bulk(&RedisConfig::from_url(&cluster.url()), &servers, |key| {
        cluster.owner_of(cluster.slot_of(key))
    })
    .await;
}

/// `owner`: the index in `servers` of the server that holds a channel's keys.
async fn positions_in_bulk(
    cfg: &RedisConfig,
    servers: &[&RedisServer],
    owner: impl Fn(&str) -> usize,
) {
    let (a, _) = node(cfg, "a").await;
    let o = opts(10);
    let top = HistoryQuery {
        since: None,
        limit: Some(0),
    };
    let published: Vec<String> = (0..20).map(|i| unique(&format!("pos{i}"))).collect();
    for (i, ch) in published.iter().enumerate() {
        for _ in 0..=i {
            a.publish(ch, Bytes::from_static(b"x"), None, &o)
                .await
                .unwrap();
        }
    }
    let fresh = unique("posfresh");
    let rebound = unique("posrebound");
    for _ in 0..3 {
        a.publish(&rebound, Bytes::from_static(b"x"), None, &o)
            .await
            .unwrap();
    }
    let old_epoch = a.history(&rebound, &top, &o.stream).await.unwrap().position;
    assert_eq!(old_epoch.offset, 3);
    servers[owner(&rebound)].cli(&[
        "HSET",
        &format!("herald:{{{rebound}}}:m"),
        "r",
        "another-run-id",
    ]);
    // The script reads among the plain ones, so that each answer must land in its own place.
    let channels: Vec<(Arc<str>, herald_broker::StreamOptions)> = published[..10]
        .iter()
        .chain([&fresh])
        .chain(&published[10..])
        .chain([&rebound])
        .map(|c| (Arc::from(c.as_str()), o.stream.clone()))
        .collect();

    for ch in &published {
        // Loads the history script on every server (a first call to one is not counted below).
        a.history(ch, &top, &o.stream).await.unwrap();
    }
    for server in servers {
        server.cli(&["CONFIG", "RESETSTAT"]);
    }
    let got = a.positions(&channels).await;
    let stats: String = servers
        .iter()
        .map(|s| s.cli(&["INFO", "commandstats"]))
        .collect();
    let calls = |cmd: &str| -> u64 {
        stats
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .filter_map(|rest| rest.split(',').next())
            .map(|n| n.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(
        (calls("evalsha") + calls("eval"), calls("hmget")),
        (2, 22 + 2),
        "a script for the fresh and the rebound stream only (each also runs an HMGET)\n{stats}"
    );

    for ((channel, opts), got) in channels.iter().zip(got) {
        let got = got.unwrap();
        let read = a.history(channel, &top, opts).await.unwrap().position;
        assert_eq!(got, read, "{channel}: positions and history agree");
        if let Some(i) = published.iter().position(|p| **p == **channel) {
            assert_eq!(got.offset, i as u64 + 1, "{channel}");
        } else if **channel == *fresh {
            assert_eq!(got.offset, 0, "{channel}");
        }
    }
    let last = channels.len() - 1;
    let started_over = a
        .history(&channels[last].0, &top, &o.stream)
        .await
        .unwrap()
        .position;
    assert_ne!(
        started_over.epoch, old_epoch.epoch,
        "a stream of another Redis starts over"
    );
    assert_eq!(started_over.offset, 0);
}

/// The streams a bulk read cannot take from its `HMGET` pipeline (here 100 never read or
/// published) go through the history script together, not one round trip after another: Redis
/// reads them in a few socket reads (one by one it made at least one read each, and the quiet
/// sweep cost it more in I/O than in the script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_send_the_script_reads_together() {
    let redis = RedisServer::start();
    let (a, _) = node(&RedisConfig::from_url(&redis.url()), "a").await;
    let o = opts(10);
    let channels: Vec<(Arc<str>, herald_broker::StreamOptions)> = (0..100)
        .map(|i| {
            (
                Arc::from(unique(&format!("together{i}")).as_str()),
                o.stream.clone(),
            )
        })
        .collect();
    // Load the script first, so that the reads below are the only traffic counted.
    a.positions(&channels[..1]).await[0].as_ref().unwrap();
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let got = a.positions(&channels[1..]).await;
    assert!(got.iter().all(|p| p.as_ref().is_ok_and(|p| p.offset == 0)));
    let stats = redis.cli(&["INFO", "stats"]);
    let reads: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_reads_processed in INFO stats");
    let commands = redis.cli(&["INFO", "commandstats"]);
    assert!(
        commands.contains("cmdstat_evalsha:calls=99,"),
        "one script read per stream\n{commands}"
    );
    assert!(
        reads < 60,
        "Redis made {reads} socket reads for 99 script reads and one pipeline: they went one by one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_subscribes_are_batched() {
    let redis = RedisServer::start();
    let (a, _) = node(&RedisConfig::from_url(&redis.url()), "a").await;
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let channels: Vec<String> = (0..300).map(|i| unique(&format!("batch{i}"))).collect();
    let results = futures_util::future::join_all(channels.iter().map(|c| a.subscribe(c))).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(metric(&a, "herald_broker_subscribed_channels"), 300.0);
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_subscribe:calls="))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("cmdstat_subscribe");
    eprintln!("300 subscribes took {calls} SUBSCRIBE commands");
    assert!(calls < 50, "300 subscribes took {calls} SUBSCRIBE commands");
    assert_eq!(
        redis
            .cli(&["PUBSUB", "NUMSUB", &format!("herald:{{{}}}:p", channels[0])])
            .lines()
            .last(),
        Some("1")
    );
    // Unsubscribing all of them leaves only the control channel.
    let results = futures_util::future::join_all(channels.iter().map(|c| a.unsubscribe(c))).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(redis.cli(&["PUBSUB", "CHANNELS"]), "herald:control");
}

/// Redis kills the subscription connection (as on a network blip); publications go on from
/// another node meanwhile. The node reconnects, subscribes again, asks the hub to catch up, and
/// every publication is in history for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_blip_resubscribes_and_asks_for_catch_up() {
    let redis = RedisServer::start();
    let cfg = RedisConfig::from_url(&redis.url());
    let (a, ra) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let ch = unique("blip");
    a.subscribe(&ch).await.unwrap();
    for i in 1..=10 {
        b.publish(&ch, Bytes::from(i.to_string()), None, &opts(100))
            .await
            .unwrap();
    }
    eventually("first 10", || ra.offsets(&ch).len() == 10).await;
    let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed.parse::<u32>().unwrap() >= 2, "killed {killed}");
    for i in 11..=20 {
        b.publish(&ch, Bytes::from(i.to_string()), None, &opts(100))
            .await
            .unwrap();
    }
    eventually("on_reconnected", || *ra.reconnects.lock().unwrap() >= 1).await;
    assert!(
        metric(&a, "herald_broker_resubscriptions_total") >= 2.0,
        "channel + control"
    );
    assert!(metric(&a, "herald_broker_catchups_total") >= 1.0);
    for i in 21..=25 {
        b.publish(&ch, Bytes::from(i.to_string()), None, &opts(100))
            .await
            .unwrap();
    }
    eventually("live again", || ra.offsets(&ch).contains(&25)).await;
    // What the hub would read to fill the gap.
    let last_seen = ra
        .offsets(&ch)
        .into_iter()
        .take_while(|o| *o <= 10)
        .max()
        .unwrap();
    let epoch = ra.publications.lock().unwrap()[0].1.clone();
    let q = HistoryQuery {
        since: Some(StreamPosition {
            epoch,
            offset: last_seen,
        }),
        limit: None,
    };
    let gap = a.history(&ch, &q, &opts(100).stream).await.unwrap();
    assert!(gap.continuous);
    assert_eq!(gap.publications.first().map(|p| p.offset), Some(11));
    assert_eq!(gap.publications.last().map(|p| p.offset), Some(25));
    // Still exactly one subscription per node and channel.
    assert_eq!(
        redis
            .cli(&["PUBSUB", "NUMSUB", &format!("herald:{{{ch}}}:p")])
            .lines()
            .last(),
        Some("1")
    );
}

/// Publish through `broker` until Redis is back (at most 5 s).
async fn publish_when_back(broker: &SharedBroker, ch: &str) -> StreamPosition {
    herald_testkit::eventually_some(
        Duration::from_secs(5),
        "a publish accepted once Redis is back",
        || async {
            broker
                .publish(ch, Bytes::from_static(b"x"), None, &opts(100))
                .await
                .ok()
        },
    )
    .await
}

/// By default a stream's epoch is bound to the Redis process (`run_id`): after a restart, even
/// one that kept every write (fsynced AOF), the next publish or read by any node, here one that
/// connected only after the restart, starts a new epoch, and an old position is not
/// continuous. With `synchronous_persistence` the epoch survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_starts_new_epochs_unless_persistence_is_declared_synchronous() {
    let mut redis = RedisServer::start_with(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    });
    let strict = RedisConfig::from_url(&redis.url());
    let mut durable = strict.clone();
    durable.synchronous_persistence = true;
    let (a, _) = node(&strict, "a").await;
    let (d, _) = node(&durable, "d").await;
    let (bound, kept) = (unique("bound"), unique("kept"));
    let mut before = Vec::new();
    for (broker, ch) in [(&a, &bound), (&d, &kept)] {
        broker
            .publish(ch, Bytes::from_static(b"1"), None, &opts(100))
            .await
            .unwrap();
        before.push(
            broker
                .publish(ch, Bytes::from_static(b"2"), None, &opts(100))
                .await
                .unwrap(),
        );
    }
    redis.restart();
    let (fresh, _) = node(&strict, "fresh").await;
    let since = HistoryQuery {
        since: Some(before[0].clone()),
        limit: None,
    };
    let h = fresh
        .history(&bound, &since, &opts(100).stream)
        .await
        .unwrap();
    assert!(!h.continuous, "{h:?}");
    assert_ne!(h.position.epoch, before[0].epoch, "{h:?}");
    let next = publish_when_back(&a, &bound).await;
    assert_eq!((&next.epoch, next.offset), (&h.position.epoch, 1));
    let next = publish_when_back(&d, &kept).await;
    assert_eq!(
        (&next.epoch, next.offset),
        (&before[1].epoch, 3),
        "declared durable"
    );
}

/// Redis goes away: publishing and subscribing fail fast with "unavailable"; when Redis is back
/// (with its data, here from an fsynced AOF, declared with `synchronous_persistence`) the stream
/// continues in the same epoch and subscribers are restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_fails_fast_then_recovers() {
    let mut redis = RedisServer::start_with(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    });
    let mut cfg = RedisConfig::from_url(&redis.url());
    cfg.synchronous_persistence = true;
    cfg.command_timeout_ms = 1000;
    cfg.health_check_ms = 300;
    let (a, ra) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let ch = unique("restart");
    a.subscribe(&ch).await.unwrap();
    let first = b
        .publish(&ch, Bytes::from_static(b"1"), None, &opts(100))
        .await
        .unwrap();
    eventually("first", || ra.offsets(&ch) == vec![1]).await;

    redis.stop();
    for _ in 0..3 {
        let t = Instant::now();
        let err = b
            .publish(&ch, Bytes::from_static(b"2"), None, &opts(100))
            .await
            .unwrap_err();
        assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "fails fast, took {:?}",
            t.elapsed()
        );
    }
    let t = Instant::now();
    let other = unique("other");
    assert!(matches!(
        a.subscribe(&other).await,
        Err(BrokerError::Unavailable { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(
        metric(&a, "herald_broker_connected{mode=\"standalone\"}"),
        0.0
    );

    redis.restart();
    eventually("on_reconnected", || *ra.reconnects.lock().unwrap() >= 1).await;
    // The command connection comes back on its own, too.
    let next = herald_testkit::eventually_some(
        Duration::from_secs(10),
        "a publish accepted once the command connection is back",
        || async {
            b.publish(&ch, Bytes::from_static(b"2"), None, &opts(100))
                .await
                .ok()
        },
    )
    .await;
    assert_eq!(next.epoch, first.epoch, "the stream survived the restart");
    assert_eq!(next.offset, 2);
    eventually("second", || ra.offsets(&ch) == vec![1, 2]).await;
    assert_eq!(
        metric(&a, "herald_broker_connected{mode=\"standalone\"}"),
        1.0
    );
    assert!(metric(&b, "herald_broker_publish_errors_total") >= 3.0);
}

/// Redis busy for a moment (a long command, a starved process) is not a lost link: a health
/// check or a subscribe answered late does not tear the subscription connection down, which would
/// subscribe every channel again and catch each up from history. Three unanswered checks in a row
/// still do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_redis_stall_keeps_the_subscription_connection() {
    let redis = redis_with_debug_command();
    let mut cfg = RedisConfig::from_url(&redis.url());
    cfg.health_check_ms = 200;
    cfg.command_timeout_ms = 300;
    let (a, ra) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let ch = unique("stall");
    a.subscribe(&ch).await.unwrap();
    b.publish(&ch, Bytes::from_static(b"1"), None, &opts(100))
        .await
        .unwrap();
    eventually("first", || ra.offsets(&ch) == vec![1]).await;

    // Redis answers nothing for 0.5 s: a health check every 200 ms, each given 200 ms, so at
    // least one goes unanswered (`cli` blocks this thread, not the runtime's workers).
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "0.5"]).trim(), "OK");
    // A subscribe sent into a stall times out (300 ms) without costing the connection.
    let other = unique("other");
    let stalled = {
        let a = a.clone();
        let other = other.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.subscribe(&other).await
        })
    };
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "0.5"]).trim(), "OK");
    let late = tokio::time::timeout(Duration::from_secs(5), stalled)
        .await
        .expect("the stalled subscribe answers")
        .unwrap();
    assert!(
        matches!(late, Err(BrokerError::Unavailable { .. })),
        "{late:?}"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        *ra.reconnects.lock().unwrap(),
        0,
        "a stall of 0.5 s made the node drop its subscription connection"
    );
    assert_eq!(metric(&a, "herald_broker_reconnects_total"), 0.0);
    b.publish(&ch, Bytes::from_static(b"2"), None, &opts(100))
        .await
        .unwrap();
    eventually("second", || ra.offsets(&ch) == vec![1, 2]).await;
    a.subscribe(&other).await.unwrap();
    b.publish(&other, Bytes::from_static(b"x"), None, &opts(100))
        .await
        .unwrap();
    eventually("the channel subscribed after the stall", || {
        ra.offsets(&other) == vec![1]
    })
    .await;

    // A link that stays silent past three checks is still dropped and restored.
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "1.5"]).trim(), "OK");
    eventually("on_reconnected after a long stall", || {
        *ra.reconnects.lock().unwrap() >= 1
    })
    .await;
    b.publish(&ch, Bytes::from_static(b"3"), None, &opts(100))
        .await
        .unwrap();
    eventually("third", || ra.offsets(&ch) == vec![1, 2, 3]).await;
}

/// A Redis that takes `DEBUG SLEEP` (Redis 7 refuses `DEBUG` unless enabled): a stall on demand.
fn redis_with_debug_command() -> RedisServer {
    RedisServer::start_with(RedisOptions {
        extra_args: vec!["--enable-debug-command".into(), "yes".into()],
        ..RedisOptions::default()
    })
}

/// The ids of the clients connected to `redis`, besides the one asking.
fn client_ids(redis: &RedisServer) -> Vec<String> {
    let mut ids: Vec<String> = redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_prefix("id=")
                .map(str::to_owned)
        })
        .collect();
    ids.sort();
    ids
}

/// A command that times out in a short stall costs that command only: the node keeps its command
/// connection (before: it dropped it at the first timeout, and every command failed with 111
/// until a new one was open). A link silent for three command timeouts is still replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_redis_stall_keeps_the_command_connection() {
    let redis = redis_with_debug_command();
    let mut cfg = RedisConfig::from_url(&redis.url());
    cfg.command_timeout_ms = 200;
    cfg.reconnect_min_ms = 10;
    let (a, _) = node(&cfg, "a").await;
    let ch = unique("stall");
    a.publish(&ch, Bytes::from_static(b"1"), None, &opts(100))
        .await
        .unwrap();
    let before = client_ids(&redis);

    // Redis answers nothing for 0.5 s; the first publish sent into it times out (200 ms).
    // (Publishing until one fails: those sent before `redis-cli` got the stall going succeed.)
    let stalled = {
        let a = a.clone();
        let ch = ch.clone();
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                let r = a
                    .publish(&ch, Bytes::from_static(b"x"), None, &opts(100))
                    .await;
                if r.is_err() || Instant::now() > until {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "0.5"]).trim(), "OK");
    let late = tokio::time::timeout(Duration::from_secs(5), stalled)
        .await
        .expect("the stalled publish answers")
        .unwrap();
    assert!(
        matches!(late, Err(BrokerError::Unavailable { .. })),
        "a publish into the stall: {late:?}"
    );
    // Right after the stall, commands work on the same connection.
    let next = a
        .publish(&ch, Bytes::from_static(b"2"), None, &opts(100))
        .await;
    assert!(next.is_ok(), "the publish after a 0.5 s stall: {next:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        client_ids(&redis),
        before,
        "a stall of 0.5 s made the node replace a connection"
    );

    // Commands keep timing out through a 1.5 s stall: the link is replaced, and works after.
    let during = {
        let a = a.clone();
        let ch = ch.clone();
        tokio::spawn(async move {
            for _ in 0..12 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = a
                    .publish(&ch, Bytes::from_static(b"y"), None, &opts(100))
                    .await;
            }
        })
    };
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "1.5"]).trim(), "OK");
    tokio::time::timeout(Duration::from_secs(10), during)
        .await
        .expect("the publishes during the stall end")
        .unwrap();
    eventually("the command connection replaced", || {
        let ids = client_ids(&redis);
        ids.len() == before.len() && ids != before
    })
    .await;
    let after = tokio::time::timeout(
        Duration::from_secs(5),
        a.publish(&ch, Bytes::from_static(b"3"), None, &opts(100)),
    )
    .await
    .expect("a publish answers");
    assert!(
        after.is_ok(),
        "the publish after the link was replaced: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_spans_nodes_and_expires_with_a_crashed_node() {
    let redis = RedisServer::start();
    let mut cfg = RedisConfig::from_url(&redis.url());
    cfg.presence_ttl_s = 1;
    let (a, _) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let (c, _) = node(&cfg, "c").await;
    conformance::presence_spans_nodes_and_expires_with_a_crashed_node(
        a,
        b,
        c,
        Duration::from_secs(1),
    )
    .await;
}

/// Channels spread over standalone shards by consistent hash, each with its history and pub/sub
/// on its own shard, also when one publication goes to all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_shards_spread_channels() {
    let r1 = RedisServer::start();
    let r2 = RedisServer::start();
    let cfg = RedisConfig {
        shards: vec![r1.addr(), r2.url()],
        ..RedisConfig::default()
    };
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let channels: Vec<String> = (0..20).map(|i| unique(&format!("s{i}"))).collect();
    for ch in &channels {
        b.subscribe(ch).await.unwrap();
        a.publish(ch, Bytes::from_static(b"{}"), None, &opts(5))
            .await
            .unwrap();
    }
    // One publication to all of them: each shard's channels in that shard's own call.
    let targets: Vec<PublishTarget> = channels
        .iter()
        .map(|ch| PublishTarget {
            channel: ch.clone(),
            opts: opts(5),
        })
        .collect();
    for result in a
        .publish_many(&targets, Bytes::from_static(b"{}"), None)
        .await
    {
        assert_eq!(result.unwrap().offset, 2);
    }
    eventually("all delivered", || {
        rb.publications.lock().unwrap().len() == 40
    })
    .await;
    for ch in &channels {
        assert_eq!(rb.offsets(ch), vec![1, 2], "{ch}");
    }
    let keys = |r: &RedisServer| r.cli(&["DBSIZE"]).parse::<u32>().unwrap();
    assert!(keys(&r1) > 0 && keys(&r2) > 0, "both shards used");
    // Control goes through shard 0 and reaches everyone.
    let msg = ControlMessage::Subscribe {
        user: "u".into(),
        channel: "x".into(),
    };
    a.publish_control(&msg).await.unwrap();
    eventually("control", || rb.controls.lock().unwrap().contains(&msg)).await;
    assert_eq!(rb.reconnects.lock().unwrap().to_owned(), 0);
    let _ = Ordering::Relaxed;
}

/// A broadcast on a Cluster goes to each master as one pipeline (a round trip per master, not
/// one per slot), and still stores and delivers each channel once, in offset order, with epochs
/// bound to the master's `run_id` as a single publish binds them (it continues them). A slot that
/// moved to another master after the node read the slot map is refused there (`MOVED`, nothing
/// run) and sent again through the cluster connection: stored once (in a new epoch: the stream
/// was bound to the master it left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_broadcast_is_one_pipeline_per_master() {
    let cluster = RedisCluster::start();
    let cfg = RedisConfig::from_url(&cluster.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let channels: Vec<String> = (0..300).map(|i| unique(&format!("bc{i}"))).collect();
    for ch in &channels {
        b.subscribe(ch).await.unwrap();
    }
    let targets: Vec<PublishTarget> = channels
        .iter()
        .map(|ch| PublishTarget {
            channel: ch.clone(),
            opts: opts(5),
        })
        .collect();
    let data = Bytes::from_static(b"{}");
    let round_trips = |n: &SharedBroker| metric(n, "herald_broker_redis_rtt_seconds_count");
    let before = round_trips(&a);
    let first: Vec<StreamPosition> = a
        .publish_many(&targets, data.clone(), None)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    // Three pipelines and one CLUSTER SLOTS; one by one, about 300 script calls.
    let trips = round_trips(&a) - before;
    assert!(
        trips <= 6.0,
        "{trips} round trips for 300 channels on 3 masters"
    );
    assert!(first.iter().all(|p| p.offset == 1));
    // A single publish (the cluster connection's path) continues the broadcast's epoch.
    let next = a.publish(&channels[1], data.clone(), None, &opts(5)).await;
    assert_eq!(
        next.unwrap(),
        StreamPosition {
            offset: 2,
            ..first[1].clone()
        }
    );

    // Move the first channel's slot to another master: the node's slot map is stale now.
    let slot = cluster.slot_of(&channels[0]);
    let to = (cluster.owner_of(slot) + 1) % 3;
    cluster.migrate_slot(slot, to);
    let second = a.publish_many(&targets, data.clone(), None).await;
    for (i, (ch, result)) in channels.iter().zip(second).enumerate() {
        let position = result.unwrap();
        match i {
            0 => assert!(
                position.offset == 1 && position.epoch != first[0].epoch,
                "{ch}"
            ),
            1 => assert_eq!(position.offset, 3, "{ch}"),
            _ => assert_eq!(
                position,
                StreamPosition {
                    offset: 2,
                    ..first[i].clone()
                },
                "{ch}"
            ),
        }
    }
    // The moved channel holds its new epoch's one publication. (Its delivery is not checked:
    // the slot's move ends the subscription, which the hub's catch-up covers, not this test.)
    let all = HistoryQuery {
        since: None,
        limit: None,
    };
    let moved = a
        .history(&channels[0], &all, &opts(5).stream)
        .await
        .unwrap();
    assert_ne!(moved.position.epoch, first[0].epoch);
    let offsets: Vec<u64> = moved.publications.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, vec![1], "stored once");
    let others = || {
        let p = rb.publications.lock().unwrap();
        p.iter().filter(|(c, _, _)| *c != channels[0]).count()
    };
    eventually("every other publication delivered", || others() == 599).await;
    assert_eq!(rb.offsets(&channels[1]), vec![1, 2, 3]);
    for ch in &channels[2..] {
        assert_eq!(rb.offsets(ch), vec![1, 2], "{ch}");
    }
    // The next broadcast reads the slot map afresh and pipelines again.
    let before = round_trips(&a);
    for result in a.publish_many(&targets, data, None).await {
        assert!(result.is_ok());
    }
    let trips = round_trips(&a) - before;
    assert!(
        trips <= 6.0,
        "{trips} round trips after the slot map was read again"
    );
}

/// Broker load is real work: with rooms hosted on 1 to 4 of 4 nodes, each node receives exactly
/// the publications of the rooms it hosts (a pattern subscription would deliver all of them to
/// every node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_load_is_the_nodes_hosting_each_room() {
    let redis = RedisServer::start();
    let cfg = RedisConfig::from_url(&redis.url());
    let mut nodes = Vec::new();
    for i in 0..4 {
        nodes.push(node(&cfg, &format!("n{i}")).await);
    }
    let per_room = 10;
    let mut hosted = [0u64; 4];
    let mut total_hosting = 0;
    let rooms: Vec<String> = (0..8).map(|r| unique(&format!("room{r}"))).collect();
    for (r, room) in rooms.iter().enumerate() {
        // Room r is hosted on 1 + r % 4 nodes, starting at node r % 4.
        for k in 0..=(r % 4) {
            let n = (r + k) % 4;
            nodes[n].0.subscribe(room).await.unwrap();
            hosted[n] += per_room;
            total_hosting += 1;
        }
    }
    for (r, room) in rooms.iter().enumerate() {
        for i in 0..per_room {
            let publisher = &nodes[(r + 1) % 4].0;
            publisher
                .publish(room, Bytes::from(i.to_string()), None, &opts(0))
                .await
                .unwrap();
        }
    }
    let expected: u64 = hosted.iter().sum();
    eventually("all delivered", || {
        nodes
            .iter()
            .map(|(_, rec)| rec.publications.lock().unwrap().len() as u64)
            .sum::<u64>()
            >= expected
    })
    .await;
    // A moment for a stray delivery to a node that hosts no room to show up: none may.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let publications = rooms.len() as u64 * per_room;
    let mut received = 0.0;
    for (i, (broker, _)) in nodes.iter().enumerate() {
        let got = metric(broker, "herald_broker_messages_received_total");
        assert_eq!(
            got, hosted[i] as f64,
            "node {i} receives only rooms it hosts"
        );
        received += got;
    }
    let per_publication = received / publications as f64;
    let ideal = total_hosting as f64 / rooms.len() as f64;
    eprintln!("broker messages per publication: {per_publication:.2} (ideal {ideal:.2}, pattern design 4)");
    assert!((per_publication - ideal).abs() < 1e-9);
    assert_eq!(redis.cli(&["PUBSUB", "NUMPAT"]), "0");
}

/// On a Cluster, the shard that holds a channel drops the node's subscription connection; the node
/// subscribes again on that shard and asks for a catch-up, and delivery goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subscription_blip_resubscribes() {
    let cluster = RedisCluster::start();
    let mut cfg = RedisConfig::from_url(&cluster.url());
    cfg.health_check_ms = 300;
    let (a, ra) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let ch = unique("cblip");
    a.subscribe(&ch).await.unwrap();
    b.publish(&ch, Bytes::from_static(b"1"), None, &opts(100))
        .await
        .unwrap();
    eventually("first", || ra.offsets(&ch) == vec![1]).await;
    for n in cluster.nodes() {
        n.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    }
    b.publish(&ch, Bytes::from_static(b"2"), None, &opts(100))
        .await
        .unwrap();
    eventually("on_reconnected", || *ra.reconnects.lock().unwrap() >= 1).await;
    b.publish(&ch, Bytes::from_static(b"3"), None, &opts(100))
        .await
        .unwrap();
    eventually("live again", || ra.offsets(&ch).contains(&3)).await;
    let servers: Vec<&RedisServer> = cluster.nodes().iter().collect();
    let pubsub = format!("herald:{{{ch}}}:p");
    assert_eq!(sum_over(&servers, &["PUBSUB", "SHARDNUMSUB", &pubsub]), 1);
    assert!(metric(&a, "herald_broker_resubscriptions_total") >= 1.0);
}

/// Every page of `history_channels` from the first, `limit` names a page: the set of names (a
/// name may repeat across pages) and the page count. Fails past 1000 pages.
async fn list_history_channels(
    broker: &SharedBroker,
    limit: usize,
) -> (std::collections::BTreeSet<String>, usize) {
    let mut names = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    for pages in 1..=1000 {
        let page = broker
            .history_channels(cursor.as_deref(), limit)
            .await
            .expect("a page")
            .expect("this broker lists channels with history");
        names.extend(page.channels);
        match page.cursor {
            None => return (names, pages),
            next => cursor = next,
        }
    }
    panic!("the listing did not end within 1000 pages");
}

/// On a Cluster the channels with history are listed master by master (a `SCAN` reaches one
/// node): every page together gives exactly the channels whose history holds publications,
/// across pages and masters, without subscribers; a removed history is not listed (its stream
/// is deleted); a cursor no page gave is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lists_history_channels_on_every_master() {
    let cluster = RedisCluster::start();
    let cfg = RedisConfig::from_url(&cluster.url());
    let (a, _) = node(&cfg, "a").await;
    let channels: Vec<String> = (0..60).map(|i| unique(&format!("hl{i}"))).collect();
    let data = Bytes::from_static(b"{}");
    for ch in &channels {
        a.publish(ch, data.clone(), None, &opts(5)).await.unwrap();
    }
    // No history kept: not listed.
    let live = unique("live");
    a.publish(&live, data.clone(), None, &opts(0))
        .await
        .unwrap();
    assert!(a.remove_history(&channels[0]).await.unwrap());
    let owners: std::collections::BTreeSet<usize> = channels
        .iter()
        .map(|ch| cluster.owner_of(cluster.slot_of(ch)))
        .collect();
    assert_eq!(owners.len(), 3, "the channels live on every master");

    let (listed, pages) = list_history_channels(&a, 5).await;
    let expected: std::collections::BTreeSet<String> = channels[1..].iter().cloned().collect();
    assert_eq!(listed, expected, "exactly the channels with history");
    assert!(pages >= 3, "{pages} pages: one per master at least");

    for bad in ["3:0", "x", "1", "0:x", "-1:0"] {
        let err = a.history_channels(Some(bad), 5).await.unwrap_err();
        assert!(
            err.to_string().contains("not a history listing cursor"),
            "{bad}: {err}"
        );
    }
}
