//! # Test kit: real servers on free loopback ports
//!
//! Every integration test that needs Redis, a Redis Cluster or NATS starts its own server here
//! and the server is killed when the handle drops. Nothing assumes a service is already running.
//!
//! # Layout
//! - [`free_port`]: a free TCP port on 127.0.0.1.
//! - [`redis`]: standalone redis-server and a three-master Redis Cluster.
//! - [`nats`]: nats-server with JetStream.
//! - [`multinode`]: the multi-node suite (real `herald` nodes over WebSockets), run against any
//!   broker through [`multinode::BrokerProcess`].

pub mod multinode;
pub mod nats;
pub mod redis;

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}
