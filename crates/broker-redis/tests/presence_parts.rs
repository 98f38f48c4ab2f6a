//! A channel's presence split over several keys (`presence_parts`): counts and pages stay exact,
//! and the parts sit in different Cluster slots and on more than one master.

use herald_broker::conformance;
use herald_broker::SharedBroker;
use herald_broker_redis::RedisConfig;
use herald_protocol::ClientInfo;
use herald_testkit::redis::{RedisCluster, RedisServer};

const PARTS: usize = 4;

async fn broker(url: &str) -> SharedBroker {
    let config = RedisConfig {
        presence_parts: PARTS,
        ..RedisConfig::from_url(url)
    };
    herald_broker_redis::connect_with(config, "parts")
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_parts_count_and_page_exactly() {
    let redis = RedisServer::start();
    conformance::presence_add_list_remove(broker(&redis.url()).await).await;
    conformance::presence_counts_and_pages(broker(&redis.url()).await).await;
    // 40 users' clients land in every part.
    let b = broker(&redis.url()).await;
    let _rec = conformance::started(&b).await;
    for n in 0..40 {
        let who = ClientInfo {
            user: format!("user{n}"),
            client: format!("c{n}"),
            info: None,
        };
        b.add_presence("spread", &who).await.unwrap();
    }
    for part in 0..PARTS {
        let key = format!("herald:{{spread|{part}}}:pr");
        let held: u64 = redis.cli(&["HLEN", &key]).parse().expect("HLEN");
        assert!(held > 0, "part {part} holds nothing");
    }
    assert_eq!(redis.cli(&["EXISTS", "herald:{spread}:pr"]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_parts_spread_over_slots_and_masters() {
    let cluster = RedisCluster::start();
    conformance::presence_counts_and_pages(broker(&cluster.url()).await).await;
    let slots: std::collections::BTreeSet<u16> = (0..PARTS)
        .map(|part| cluster.slot_of(&format!("room|{part}")))
        .collect();
    assert_eq!(slots.len(), PARTS, "each part in its own slot: {slots:?}");
    let owners: std::collections::BTreeSet<usize> =
        slots.iter().map(|s| cluster.owner_of(*s)).collect();
    assert!(owners.len() > 1, "parts of `room` all on one master");
    let b = broker(&cluster.url()).await;
    let _rec = conformance::started(&b).await;
    for n in 0..40 {
        let who = ClientInfo {
            user: format!("user{}", n % 13),
            client: format!("c{n}"),
            info: None,
        };
        b.add_presence("room", &who).await.unwrap();
    }
    let stats = b.presence_stats("room").await.unwrap();
    assert_eq!((stats.num_clients, stats.num_users), (40, 13));
}
