//! The multi-node suite (`herald_testkit::multinode`, shared with every broker) with real herald
//! nodes on a real standalone Redis and on a real three-master Redis Cluster. Needs the `herald`
//! binary: `HERALD_BIN`, or `<target>/debug/herald` (built if missing).

use herald_testkit::multinode;
use herald_testkit::redis::{RedisCluster, RedisOptions, RedisServer};

/// Standalone Redis with a fsynced AOF, so a restart keeps what was acknowledged.
fn persistent_redis() -> RedisServer {
    RedisServer::start_with(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_cross_node_delivery_exactly_once() {
    multinode::cross_node_delivery_exactly_once(&mut RedisServer::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_recovery_across_nodes() {
    multinode::recovery_across_nodes(&mut RedisServer::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis_restart_mid_stream_loses_nothing() {
    multinode::broker_restart_mid_stream_loses_nothing(
        &mut persistent_redis(),
        &[("HERALD_REDIS__SYNCHRONOUS_PERSISTENCE", "true")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_presence_across_nodes() {
    multinode::presence_across_nodes(&mut RedisServer::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_subscriber_node_blip_loses_nothing() {
    multinode::subscriber_node_blip_loses_nothing(&mut RedisServer::start()).await;
}

// A cluster has no single address to stop or proxy: the restart and blip cases run standalone.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cross_node_delivery_exactly_once() {
    multinode::cross_node_delivery_exactly_once(&mut RedisCluster::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_recovery_across_nodes() {
    multinode::recovery_across_nodes(&mut RedisCluster::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_presence_across_nodes() {
    multinode::presence_across_nodes(&mut RedisCluster::start()).await;
}

/// Redis comes back *behind*: restarted from an RDB snapshot older than what nodes delivered
/// (`kill -9` after `SAVE` and more publications). Its offsets would restart below what clients
/// hold, in the same epoch. Every node must start the stream over with a new epoch instead, so no
/// subscriber and no recovering client misses anything without being told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restored_from_an_older_snapshot_starts_a_new_epoch() {
    use herald_testkit::node::Node;
    use serde_json::json;
    use std::time::{Duration, Instant};

    // No AOF, no automatic snapshots: only the explicit SAVE below survives the kill.
    let mut redis = RedisServer::start();
    let a = Node::on_broker("a", &redis.url()).await;
    let b = Node::on_broker("b", &redis.url()).await;
    let ch = format!("rollback-{:08x}", rand::random::<u32>());
    let mut live = b.subscriber(json!({ &ch: {} })).await;
    let epoch = live.connect_reply["subs"][&ch]["epoch"].clone();
    for i in 1..=3 {
        a.publish(&ch, json!(i)).await;
    }
    assert_eq!(redis.cli(&["SAVE"]), "OK");
    for i in 4..=6 {
        a.publish(&ch, json!(i)).await;
    }
    assert_eq!(
        live.offsets(&ch, 6, Duration::from_secs(5)).await,
        (1..=6).collect::<Vec<_>>()
    );

    redis.restart(); // kill -9, then start from the snapshot: the stream's top is 3 again
    let mut after = Vec::new();
    for i in 7..=10 {
        let body = herald_testkit::eventually_some(
            Duration::from_secs(20),
            &format!("publication {i} accepted once Redis is back"),
            || async {
                let (status, body) = a.try_publish(&ch, json!(i), None).await;
                (status == 200).then_some(body)
            },
        )
        .await;
        after.push(body);
    }
    for body in &after {
        assert_ne!(
            body["epoch"], epoch,
            "offsets reused in the old epoch: {after:?}"
        );
    }
    assert_eq!(after[0]["offset"], 1, "{after:?}");

    // The live subscriber is told (unsub 4003, or a close it reconnects from), never fed a
    // reused offset in silence.
    let deadline = Instant::now() + Duration::from_secs(10);
    let told = loop {
        let Some(m) = live.next_within(Duration::from_millis(200)).await else {
            if live.close_code.is_some() {
                break format!("close {:?}", live.close_code);
            }
            assert!(Instant::now() < deadline, "the subscriber was never told");
            continue;
        };
        assert!(
            m.get("pub").is_none(),
            "a publication after the rollback: {m}"
        );
        if m["unsub"]["channel"] == ch.as_str() {
            assert_eq!(m["unsub"]["code"], 4003, "{m}");
            break "unsub 4003".into();
        }
    };
    assert!(!told.is_empty());

    // A client that held offset 6 recovers on either node: it must learn it cannot.
    // A node whose subscription link is still reconnecting answers 111 (retryable); a real
    // client retries, so the test does too.
    for node in [&a, &b] {
        let c = herald_testkit::eventually_some(
            Duration::from_secs(10),
            &format!(
                "a recovery on {} answered other than 111 (its link back)",
                node.name
            ),
            || async {
                let c = node
                    .subscriber(json!({ &ch: {"since": {"epoch": epoch, "offset": 6}} }))
                    .await;
                (c.connect_reply["subs"][&ch]["error"]["code"] != 111).then_some(c)
            },
        )
        .await;
        let sub = &c.connect_reply["subs"][&ch];
        assert_eq!(sub["recovered"], false, "{sub}");
        assert_eq!(sub["epoch"], after[0]["epoch"], "{sub}");
        assert_eq!(sub["offset"], 4, "{sub}");
    }
}

/// Issue 29 item 5: Redis restored from an older snapshot while node A's link is down, and node
/// B, which never saw the channel, publishes first: B must not number on in the old epoch, A's
/// subscriber is told, and a client at (E, 10) gets `recovered: false`. Redis keeps an AOF
/// (`appendfsync always`) here, as a careful operator would; it does not help against a restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_seen_by_no_node_still_starts_a_new_epoch() {
    multinode::rollback::rollback_with_a_second_node_is_never_continued_in_the_old_epoch(
        &mut persistent_redis(),
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_sse_resume_across_nodes() {
    multinode::sse_resume_across_nodes(&mut RedisServer::start()).await;
}

/// A channel's slot moves to another master (IMPORTING/MIGRATING, `MIGRATE`, `SETSLOT NODE`)
/// while a node publishes to it and another node's client is subscribed. Redis drops the shard
/// channel subscription when its slot leaves; the subscriber node must subscribe again on the new
/// owner and catch up, so the client gets every acknowledged publication once, in order (told
/// with unsub 4003 and recovering with `since` also counts, as a client would).
///
/// The nodes declare synchronous persistence: by default a stream's epoch is bound to the
/// `run_id` of the master that holds it, so a slot that moves to another master starts new epochs
/// for its channels (subscribers are told, 4003 and `recovered: false`; docs/reliability.md).
/// This test is about the subscription following the slot, with epochs kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slot_migration_while_publishing_loses_nothing() {
    use herald_testkit::node::Node;

    let cluster = RedisCluster::start();
    let keep = [("HERALD_REDIS__SYNCHRONOUS_PERSISTENCE", "true")];
    let a = Node::on_broker_with("a", &cluster.url(), &keep).await;
    let b = Node::on_broker_with("b", &cluster.url(), &keep).await;
    let ch = format!("moving-{:08x}", rand::random::<u32>());
    let slot = cluster.slot_of(&ch);
    let to = (cluster.owner_of(slot) + 1) % 3;
    multinode::nothing_lost_through(&a, &b, &ch, 200, 50, || {
        cluster.migrate_slot(slot, to);
        assert_eq!(cluster.owner_of(slot), to);
    })
    .await;
}

/// The chaos soak, briefly (`scripts/chaos-soak.sh` runs it for minutes): kills, link cuts and
/// Redis restarts under load; 0 lost without being told, 0 duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_chaos_soak() {
    use std::time::Duration;
    let duration = multinode::chaos::soak_duration(Duration::from_secs(15));
    let report = multinode::chaos::chaos_soak(&mut persistent_redis(), duration).await;
    eprintln!("chaos soak on Redis: {report:#?}");
    assert!(
        report.delivered > 0 && report.acknowledged > 0,
        "{report:?}"
    );
}
