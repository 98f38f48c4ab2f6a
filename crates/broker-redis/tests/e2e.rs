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
    multinode::broker_restart_mid_stream_loses_nothing(&mut persistent_redis()).await;
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
