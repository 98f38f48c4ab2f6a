//! The `[redis]` configuration table and the `HERALD_BROKER_URL` forms, resolved into a [`Topology`].

use std::path::PathBuf;
use std::time::Duration;

use herald_broker::BrokerError;
use serde::Deserialize;

/// How a node reaches Redis. Embedded in the server's TOML config as the `[redis]` table; every
/// key has a default, so `HERALD_BROKER_URL=redis://host:port` alone is a complete configuration.
///
/// Exactly one of `url`, `shards`, `cluster` or `sentinel` names the servers.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// One URL: `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis+cluster://host1:port1,host2:port2` (a Cluster's seed nodes; `rediss+cluster://` for
    /// TLS), `redis+sentinel://host1:port1,host2:port2/master_name`, or
    /// `redis+shards://host1:port1,host2:port2` (standalone shards).
    pub url: Option<String>,
    /// Standalone Redis servers (URLs) that share the channels by consistent hash: a channel, its
    /// history and its pub/sub live on one shard. Adding a shard moves about 1/N of the channels,
    /// whose history then starts over (clients are told `recovered: false`).
    pub shards: Vec<String>,
    /// Seed nodes of a Redis Cluster (`host:port` or URLs). Uses sharded pub/sub.
    pub cluster: Vec<String>,
    /// A Sentinel-managed master.
    pub sentinel: Option<SentinelConfig>,
    /// ACL user name (overrides one in the URLs).
    pub username: Option<String>,
    /// Password (overrides one in the URLs).
    pub password: Option<String>,
    /// Use TLS even for `redis://` URLs (as if they were `rediss://`).
    pub tls: bool,
    /// Accept any server certificate and host name (testing only).
    pub tls_insecure: bool,
    /// PEM file with the CA that signed the server certificate (default: the system's roots).
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that require client authentication.
    pub tls_client_cert_file: Option<PathBuf>,
    /// Key of `tls_client_cert_file`.
    pub tls_client_key_file: Option<PathBuf>,
    /// Prefix of every key and pub/sub channel, so that several deployments can share a Redis.
    /// Must not contain `{` or `}` (hash tags are taken from the channel name).
    pub key_prefix: String,
    /// TCP (and TLS) connect timeout, in milliseconds.
    pub connect_timeout_ms: u64,
    /// How long a command may take before it fails with "unavailable", in milliseconds. Publishing
    /// while Redis is unreachable fails within this time, never hangs.
    pub command_timeout_ms: u64,
    /// First reconnect delay, in milliseconds; doubles on each failure up to `reconnect_max_ms`,
    /// with ±25 % jitter.
    pub reconnect_min_ms: u64,
    /// Longest reconnect delay, in milliseconds.
    pub reconnect_max_ms: u64,
    /// How often the subscription connection is pinged to detect a silently dead link, in
    /// milliseconds.
    pub health_check_ms: u64,
    /// A presence entry expires this long after its node last refreshed it, in seconds: a crashed
    /// node's clients disappear from presence within this time. Nodes refresh every third of it.
    pub presence_ttl_s: u64,
    /// Parts each channel's presence is split into (1 to 64), by a hash of the user, each under
    /// its own hash tag: on a Cluster or standalone shards, a crowded channel's members spread
    /// over several slots and servers instead of one key. Counts and pages read every part (one
    /// script call each, concurrently). 1 (the default) keeps one set of keys per channel.
    /// Every node must use the same value: changing it strands the old parts' entries until
    /// they expire (`presence_ttl_s`).
    pub presence_parts: usize,
    /// At most this many channels in one `SUBSCRIBE` (concurrent subscribes are batched).
    pub subscribe_batch: usize,
    /// The operator declares that Redis never loses an acknowledged write: `appendfsync always`,
    /// no restore from older backups, no failover to a replica that may lag. Off (the default), a
    /// stream's epoch is bound to the `run_id` of the Redis process that created it, so every
    /// stream starts a new epoch after any Redis restart or failover (clients are told
    /// `recovered: false`) and a rollback can never be continued in the old epoch. On, epochs
    /// survive restarts, and only the nodes' watermarks catch a rollback (not one no running
    /// node witnessed). See `docs/reliability.md`.
    pub synchronous_persistence: bool,
}

/// The most parts a channel's presence may be split into.
pub const MAX_PRESENCE_PARTS: usize = 64;

/// A master found through Redis Sentinel.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SentinelConfig {
    /// The master's name as configured in Sentinel.
    pub master: String,
    /// Sentinel addresses (`host:port` or `redis://host:port`).
    pub nodes: Vec<String>,
    /// Password of the Sentinels themselves, when they require one.
    pub sentinel_password: Option<String>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: None,
            shards: Vec::new(),
            cluster: Vec::new(),
            sentinel: None,
            username: None,
            password: None,
            tls: false,
            tls_insecure: false,
            tls_ca_file: None,
            tls_client_cert_file: None,
            tls_client_key_file: None,
            key_prefix: "herald".into(),
            connect_timeout_ms: 2_000,
            command_timeout_ms: 2_000,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2_000,
            health_check_ms: 2_000,
            presence_ttl_s: 60,
            presence_parts: 1,
            subscribe_batch: 500,
            synchronous_persistence: false,
        }
    }
}

/// Where the servers are, resolved from a [`RedisConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server, or several standalone shards (consistent hash), each a URL.
    Standalone(Vec<String>),
    /// Cluster seed URLs.
    Cluster(Vec<String>),
    /// Sentinel URLs and the master name.
    Sentinel { nodes: Vec<String>, master: String },
}

fn bad(msg: impl Into<String>) -> BrokerError {
    BrokerError::internal(format!("redis config: {}", msg.into()))
}

impl RedisConfig {
    /// A configuration with only `url` set.
    pub fn from_url(url: &str) -> Self {
        RedisConfig {
            url: Some(url.to_owned()),
            ..RedisConfig::default()
        }
    }

    /// Whether one of `url`, `shards`, `cluster` or `sentinel` is set.
    pub fn names_servers(&self) -> bool {
        self.url.is_some()
            || !self.shards.is_empty()
            || !self.cluster.is_empty()
            || self.sentinel.is_some()
    }

    /// Use `url` (the server's `broker_url`) when the table names no servers itself.
    ///
    /// ```
    /// let cfg = herald_broker_redis::RedisConfig::default().or_url("redis://127.0.0.1:6379");
    /// assert_eq!(cfg.url.as_deref(), Some("redis://127.0.0.1:6379"));
    /// ```
    pub fn or_url(mut self, url: &str) -> Self {
        if !self.names_servers() {
            self.url = Some(url.to_owned());
        }
        self
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.max(1))
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        Duration::from_millis(self.command_timeout_ms.max(1))
    }

    /// Check the settings and say where the servers are.
    pub(crate) fn topology(&self) -> Result<Topology, BrokerError> {
        if self.key_prefix.contains(['{', '}']) {
            return Err(bad("key_prefix must not contain `{` or `}`"));
        }
        if !(1..=MAX_PRESENCE_PARTS).contains(&self.presence_parts) {
            return Err(bad(format!(
                "presence_parts must be 1 to {MAX_PRESENCE_PARTS}, not {}",
                self.presence_parts
            )));
        }
        let named = [
            self.url.is_some(),
            !self.shards.is_empty(),
            !self.cluster.is_empty(),
            self.sentinel.is_some(),
        ];
        match named.iter().filter(|n| **n).count() {
            0 => return Err(bad("set one of url, shards, cluster or sentinel")),
            1 => {}
            _ => return Err(bad("set only one of url, shards, cluster or sentinel")),
        }
        if let Some(url) = &self.url {
            return parse_url(url);
        }
        if !self.shards.is_empty() {
            let urls = self.shards.iter().map(|s| normalize(s, false)).collect();
            return Ok(Topology::Standalone(urls));
        }
        if !self.cluster.is_empty() {
            let urls = self.cluster.iter().map(|s| normalize(s, false)).collect();
            return Ok(Topology::Cluster(urls));
        }
        let s = self.sentinel.as_ref().expect("counted above");
        if s.master.is_empty() || s.nodes.is_empty() {
            return Err(bad("sentinel needs `master` and `nodes`"));
        }
        Ok(Topology::Sentinel {
            nodes: s.nodes.iter().map(|n| normalize(n, false)).collect(),
            master: s.master.clone(),
        })
    }
}

/// `host:port` → `redis://host:port` (`rediss://` with `tls`); URLs stay as they are.
fn normalize(addr: &str, tls: bool) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else if tls {
        format!("rediss://{addr}")
    } else {
        format!("redis://{addr}")
    }
}

/// Parse the one-URL forms. Credentials before the host list (`redis+cluster://u:p@h1,h2`) apply
/// to every host.
fn parse_url(url: &str) -> Result<Topology, BrokerError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(format!("not a URL: {url}")))?;
    let multi = |tls: bool| -> Result<(Vec<String>, Option<String>), BrokerError> {
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, rest),
        };
        let (hosts, path) = match hosts.split_once('/') {
            Some((h, p)) => (h, Some(p.to_owned())),
            None => (hosts, None),
        };
        let base = if tls { "rediss" } else { "redis" };
        let urls: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| match auth {
                Some(a) => format!("{base}://{a}@{h}"),
                None => format!("{base}://{h}"),
            })
            .collect();
        if urls.is_empty() {
            return Err(bad(format!("no hosts in {url}")));
        }
        Ok((urls, path))
    };
    match scheme {
        "redis" | "rediss" | "unix" | "redis+unix" => {
            Ok(Topology::Standalone(vec![url.to_owned()]))
        }
        "redis+cluster" | "rediss+cluster" => {
            Ok(Topology::Cluster(multi(scheme == "rediss+cluster")?.0))
        }
        "redis+shards" | "rediss+shards" => {
            Ok(Topology::Standalone(multi(scheme == "rediss+shards")?.0))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (nodes, path) = multi(scheme == "rediss+sentinel")?;
            let master = path
                .filter(|p| !p.is_empty())
                .ok_or_else(|| bad("redis+sentinel://hosts/master_name needs the master name"))?;
            Ok(Topology::Sentinel { nodes, master })
        }
        _ => Err(bad(format!("unknown scheme {scheme}:// in {url}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let t = |u: &str| RedisConfig::from_url(u).topology().unwrap();
        assert_eq!(
            t("redis://127.0.0.1:6379"),
            Topology::Standalone(vec!["redis://127.0.0.1:6379".into()])
        );
        assert_eq!(
            t("redis+cluster://a:1,b:2"),
            Topology::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert_eq!(
            t("rediss+cluster://u:p@a:1,b:2"),
            Topology::Cluster(vec!["rediss://u:p@a:1".into(), "rediss://u:p@b:2".into()])
        );
        assert_eq!(
            t("redis+sentinel://s1:26379,s2:26379/mymaster"),
            Topology::Sentinel {
                nodes: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                master: "mymaster".into()
            }
        );
        assert!(RedisConfig::from_url("http://x").topology().is_err());
        assert!(RedisConfig::from_url("redis+sentinel://s1:1")
            .topology()
            .is_err());
    }

    #[test]
    fn exactly_one_source() {
        assert!(RedisConfig::default().topology().is_err());
        let both = RedisConfig {
            shards: vec!["a:1".into()],
            ..RedisConfig::from_url("redis://x:1")
        };
        assert!(both.topology().is_err());
        let shards = RedisConfig {
            shards: vec!["a:1".into(), "redis://b:2".into()],
            ..RedisConfig::default()
        };
        assert_eq!(
            shards.topology().unwrap(),
            Topology::Standalone(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        let bad_prefix = RedisConfig {
            key_prefix: "a{b".into(),
            ..RedisConfig::from_url("redis://x:1")
        };
        assert!(bad_prefix.topology().is_err());
    }
}
