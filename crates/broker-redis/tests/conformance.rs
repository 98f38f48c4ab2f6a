//! The shared broker conformance suite against a real standalone Redis and a real three-master
//! Redis Cluster, both started here.

use herald_broker::SharedBroker;
use herald_testkit::redis::{RedisCluster, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_conforms() {
    let redis = RedisServer::start();
    let url = redis.url();
    herald_broker::conformance::run(|| {
        let url = url.clone();
        async move {
            herald_broker_redis::connect(&url, "conformance")
                .await
                .expect("connect") as SharedBroker
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_conforms() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    herald_broker::conformance::run(|| {
        let url = url.clone();
        async move {
            herald_broker_redis::connect(&url, "conformance")
                .await
                .expect("connect") as SharedBroker
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_multi_node_conforms() {
    let redis = RedisServer::start();
    multi_node(redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_multi_node_conforms() {
    let cluster = RedisCluster::start();
    multi_node(cluster.url()).await;
}

/// The multi-node scenarios, each node connecting under its own name.
async fn multi_node(url: String) {
    let n = std::sync::atomic::AtomicUsize::new(0);
    herald_broker::conformance::run_multi_node(|| {
        let url = url.clone();
        let name = format!(
            "node-{}",
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        async move {
            herald_broker_redis::connect(&url, &name)
                .await
                .expect("connect") as SharedBroker
        }
    })
    .await;
}
