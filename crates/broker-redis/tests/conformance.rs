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
