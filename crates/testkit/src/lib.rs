//! # Test kit: real servers on free loopback ports
//!
//! Every integration test that needs Redis, a Redis Cluster, NATS, PostgreSQL or Kafka starts its
//! own server here and the server is killed when the handle drops. Nothing assumes a service is
//! already running.
//!
//! # Layout
//! - [`free_port`]: a free TCP port on 127.0.0.1.
//! - [`redis`]: standalone redis-server and a three-master Redis Cluster.
//! - [`nats`]: nats-server with JetStream.
//! - [`postgres`]: a PostgreSQL server made with initdb in a temporary directory.
//! - [`kafka`]: a single-node Apache Kafka 4.x (KRaft) broker, from jars that
//!   `scripts/kafka-jars.sh` fetches from Maven Central.
//! - [`node`]: a real `herald` node (alone or on a shared broker), its HTTP API, SSE streams,
//!   tokens, config files: the one harness of every test that drives the binary.
//! - [`client`]: the protocol client over a real WebSocket.
//! - [`fuzz`]: proptest strategies for fuzzing the running binary.
//! - [`multinode`]: the multi-node suite (real `herald` nodes over WebSockets), run against any
//!   broker through [`multinode::BrokerProcess`].

pub mod client;
pub mod fuzz;
pub mod kafka;
pub mod multinode;
pub mod nats;
pub mod node;
pub mod postgres;
pub mod redis;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// A TCP port on 127.0.0.1 that was free a moment ago, and never handed out before by this
/// process (the kernel may give the same ephemeral port to two binds in a row, and a server
/// started later would then find its port taken).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind 127.0.0.1:0");
        if GIVEN.lock().expect("ports").insert(port) {
            return port;
        }
    }
}

/// Wait for a spawned task's result, at most `limit`, failing with `what` it was doing: a task
/// that never ends fails the test instead of hanging the suite.
pub async fn joined<T>(
    task: tokio::task::JoinHandle<T>,
    limit: std::time::Duration,
    what: &str,
) -> T {
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what}: the task failed: {e}"),
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}
