//! [`BrokerProcess`] for Redis: a standalone [`RedisServer`] (start it `persistent` for the
//! restart case) and a [`RedisCluster`] (no stop/start or proxy: the cases that need those run on
//! the standalone server only).
//!
//! Herald's Redis broker subscribes to `herald:{<channel>}:p` (sharded pub/sub on a
//! cluster); that is what these checks read.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::BrokerProcess;
use crate::redis::{RedisCluster, RedisServer};

/// The last line of a reply as an integer (0 when it is not one).
fn last_int(reply: &str) -> usize {
    reply
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

/// Herald channels subscribed on these servers (`PUBSUB CHANNELS`, or `SHARDCHANNELS` on a
/// cluster) with their subscriber counts (`NUMSUB` / `SHARDNUMSUB`).
fn channel_subscriptions(servers: &[&RedisServer], sharded: bool) -> BTreeMap<String, usize> {
    let (list, count) = if sharded {
        ("SHARDCHANNELS", "SHARDNUMSUB")
    } else {
        ("CHANNELS", "NUMSUB")
    };
    let mut out = BTreeMap::new();
    for server in servers {
        for name in server.cli(&["PUBSUB", list, "herald:*"]).lines() {
            let Some(channel) = name
                .strip_prefix("herald:{")
                .and_then(|n| n.strip_suffix("}:p"))
            else {
                continue;
            };
            let n = last_int(&server.cli(&["PUBSUB", count, name]));
            *out.entry(channel.to_owned()).or_default() += n;
        }
    }
    out
}

fn assert_no_patterns(servers: &[&RedisServer]) {
    let patterns: usize = servers
        .iter()
        .map(|s| last_int(&s.cli(&["PUBSUB", "NUMPAT"])))
        .sum();
    assert_eq!(patterns, 0, "never PSUBSCRIBE");
}

impl BrokerProcess for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }

    fn stop(&mut self) {
        RedisServer::stop(self);
    }

    fn start_again(&mut self) {
        self.restart();
    }

    fn channel_subscriptions(&self) -> BTreeMap<String, usize> {
        channel_subscriptions(&[self], false)
    }

    fn assert_no_patterns(&self) {
        assert_no_patterns(&[self]);
    }

    fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port()).into()
    }

    fn snapshot(&mut self) -> bool {
        RedisServer::snapshot(self);
        true
    }

    fn restart_from_snapshot(&mut self) {
        RedisServer::restart_from_snapshot(self);
    }

    fn url_via(&self, addr: SocketAddr) -> String {
        let own = format!("127.0.0.1:{}", self.port());
        let url = RedisServer::url(self);
        assert!(url.contains(&own), "{url} does not name {own}");
        url.replacen(&own, &addr.to_string(), 1)
    }
}

impl BrokerProcess for RedisCluster {
    fn url(&self) -> String {
        RedisCluster::url(self)
    }

    fn stop(&mut self) {
        unimplemented!("the restart case runs on a standalone Redis")
    }

    fn start_again(&mut self) {
        unimplemented!("the restart case runs on a standalone Redis")
    }

    fn channel_subscriptions(&self) -> BTreeMap<String, usize> {
        channel_subscriptions(&self.nodes().iter().collect::<Vec<_>>(), true)
    }

    fn assert_no_patterns(&self) {
        assert_no_patterns(&self.nodes().iter().collect::<Vec<_>>());
    }

    fn addr(&self) -> SocketAddr {
        unimplemented!("a cluster has no single address: the proxy case runs on a standalone Redis")
    }

    fn url_via(&self, _addr: SocketAddr) -> String {
        unimplemented!("a cluster has no single address: the proxy case runs on a standalone Redis")
    }
}
