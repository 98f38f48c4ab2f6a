//! `NatsConfig`: the `[nats]` table of the server's TOML configuration.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Where JetStream keeps the history stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// On disk: history survives a NATS restart (the default).
    #[default]
    File,
    /// In memory: faster, lost when NATS restarts (epochs then change and clients are told
    /// `recovered: false`).
    Memory,
}

/// How to reach NATS and how to lay out Herald's data in it. Every key is optional; see
/// `docs/multi-node-nats.md` for the meaning of each and its default.
///
/// ```
/// let config: herald_broker_nats::NatsConfig =
///     serde_json::from_str(r#"{"urls": ["nats://10.0.0.1:4222"], "presence_ttl_s": 30}"#).unwrap();
/// assert_eq!(config.stream, "HERALD");
/// ```
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URLs (`nats://host:port`, `tls://host:port`; `user:pass@` allowed). Empty: the
    /// URL given to [`connect`](crate::connect), else `nats://127.0.0.1:4222`.
    pub urls: Vec<String>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password (with `user`).
    pub password: Option<String>,
    /// Authentication token.
    pub token: Option<String>,
    /// A `.creds` file (JWT + nkey seed), as issued by `nsc`.
    pub creds_file: Option<PathBuf>,
    /// An nkey seed (`SU…`).
    pub nkey_seed: Option<String>,
    /// Refuse to talk to a server without TLS.
    pub tls_required: bool,
    /// Extra root certificate (PEM) to trust.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), with `tls_key_file`, for mutual TLS.
    pub tls_cert_file: Option<PathBuf>,
    /// Client key (PEM).
    pub tls_key_file: Option<PathBuf>,
    /// JetStream domain, when the account's JetStream lives in another domain (leaf nodes).
    pub jetstream_domain: Option<String>,
    /// First token of every subject Herald uses; two deployments on one NATS need two prefixes.
    pub subject_prefix: String,
    /// Name of the history stream; the live and presence streams are `<stream>_LIVE` and
    /// `<stream>_PRESENCE`. Two deployments on one NATS need two names.
    pub stream: String,
    /// Storage of the history and live streams (`file` or `memory`). The presence stream is
    /// always in memory: nodes store their records again after a reconnect.
    pub storage: Storage,
    /// JetStream replicas of each stream (1, or 3 on a NATS cluster).
    pub replicas: usize,
    /// Publications kept per channel in the history stream. Grows by itself to the largest
    /// `history_size` of any namespace that publishes.
    pub max_msgs_per_channel: i64,
    /// Age after which JetStream drops a publication, in seconds. It also bounds how long a
    /// channel's epoch and offset outlive its last publication, so it grows by itself to the
    /// largest namespace `meta_ttl`. A namespace's shorter `history_ttl` is applied when reading.
    pub max_age_s: u64,
    /// Upper bound on the history stream's size in bytes (-1: none). When reached, the oldest
    /// publications of any channel go first, which can cost a quiet channel its epoch.
    pub max_bytes: i64,
    /// How long an API publish's idempotency key is remembered, in seconds.
    pub duplicate_window_s: u64,
    /// A crashed node's presence records disappear after this many seconds; a live node
    /// refreshes its own every third of it.
    pub presence_ttl_s: u64,
    /// Bound on every request to NATS (publish ack, history read), in milliseconds.
    pub request_timeout_ms: u64,
    /// JetStream requests (reads, stores) one node keeps in flight at most; more wait in the
    /// node for their turn, before their `request_timeout_ms` starts. Without a bound, a storm of
    /// first subscribes queues thousands of requests at the server and those at the back time
    /// out. Raise it with many NATS servers or a slow link; lower it with many nodes.
    pub max_requests_in_flight: usize,
    /// Bound on establishing the first connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Longest pause between reconnect attempts, in milliseconds.
    pub reconnect_max_delay_ms: u64,
    /// Seconds between client pings; a connection that misses two is declared lost (so a silent
    /// network partition is noticed within about twice this).
    pub ping_interval_s: u64,
    /// Read tails and history with direct gets, which any replica may answer. Faster on a NATS
    /// cluster, but a lagging replica can make a catch-up look impossible; off by default (reads
    /// go to the stream leader). No effect on a single server.
    pub direct_reads: bool,
    /// The operator declares that NATS never loses an acknowledged write: R3 (or R5) streams
    /// whose servers never all restart together, no store restored from an older copy. Off (the
    /// default), every stored message is stamped with the boot id kept in a memory stream (see
    /// the `boot` module), which every restart of the server(s) holding it empties, so every
    /// channel starts a new epoch after such a restart (clients are told `recovered: false`) and
    /// a rollback can never be continued in the old epoch. On, epochs survive restarts, and only
    /// the nodes' watermarks catch a rollback (not one no running node witnessed). See
    /// `docs/reliability.md`.
    pub synchronous_persistence: bool,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            urls: Vec::new(),
            user: None,
            password: None,
            token: None,
            creds_file: None,
            nkey_seed: None,
            tls_required: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            jetstream_domain: None,
            subject_prefix: "herald".to_owned(),
            stream: "HERALD".to_owned(),
            storage: Storage::File,
            replicas: 1,
            max_msgs_per_channel: 100,
            max_age_s: 24 * 3600,
            max_bytes: -1,
            duplicate_window_s: 300,
            presence_ttl_s: 60,
            request_timeout_ms: 3000,
            max_requests_in_flight: 256,
            connect_timeout_ms: 5000,
            reconnect_max_delay_ms: 2000,
            ping_interval_s: 10,
            direct_reads: false,
            synchronous_persistence: false,
        }
    }
}

impl NatsConfig {
    /// The default configuration with one server URL (what `HERALD_BROKER_URL` gives).
    pub fn with_url(url: &str) -> Self {
        NatsConfig {
            urls: vec![url.to_owned()],
            ..NatsConfig::default()
        }
    }

    /// Use `url` (comma-separated for several servers) when no `urls` are configured: how the
    /// server combines `broker_url` with the `[nats]` table.
    ///
    /// ```
    /// use herald_broker_nats::NatsConfig;
    /// let config = NatsConfig::default().or_url("nats://a:4222,nats://b:4222");
    /// assert_eq!(config.urls, ["nats://a:4222", "nats://b:4222"]);
    /// ```
    pub fn or_url(mut self, url: &str) -> Self {
        if self.urls.is_empty() {
            self.urls = url
                .split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect();
        }
        self
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.max(1))
    }

    /// How long a JetStream request may wait for one of the node's slots (`max_requests_in_flight`)
    /// before it is sent: ten request timeouts (30 s by default). A server that answers nothing
    /// frees a slot per request timeout, so without a bound the end of a long queue would wait
    /// far longer than a client does.
    pub(crate) fn queue_timeout(&self) -> Duration {
        self.request_timeout() * 10
    }

    pub(crate) fn presence_ttl(&self) -> Duration {
        Duration::from_secs(self.presence_ttl_s.max(1))
    }
}

/// Secrets are never printed.
impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "<hidden>");
        let urls: Vec<String> = self.urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("NatsConfig")
            .field("urls", &urls)
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("creds_file", &self.creds_file)
            .field("nkey_seed", &hidden(&self.nkey_seed))
            .field("tls_required", &self.tls_required)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("jetstream_domain", &self.jetstream_domain)
            .field("subject_prefix", &self.subject_prefix)
            .field("stream", &self.stream)
            .field("storage", &self.storage)
            .field("replicas", &self.replicas)
            .field("max_msgs_per_channel", &self.max_msgs_per_channel)
            .field("max_age_s", &self.max_age_s)
            .field("max_bytes", &self.max_bytes)
            .field("duplicate_window_s", &self.duplicate_window_s)
            .field("presence_ttl_s", &self.presence_ttl_s)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("max_requests_in_flight", &self.max_requests_in_flight)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("reconnect_max_delay_ms", &self.reconnect_max_delay_ms)
            .field("ping_interval_s", &self.ping_interval_s)
            .field("direct_reads", &self.direct_reads)
            .field("synchronous_persistence", &self.synchronous_persistence)
            .finish()
    }
}

/// `nats://user:secret@host` → `nats://user:***@host` (for logs and Debug): the one rule all
/// of Herald applies, [`herald_broker::redact_url`].
pub(crate) use herald_broker::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_secrets() {
        let config = NatsConfig {
            urls: vec!["nats://bob:s3cret@h:4222".into()],
            password: Some("pw-secret".into()),
            token: Some("tok-secret".into()),
            ..NatsConfig::default()
        };
        let text = format!("{config:?}");
        assert!(
            !text.contains("s3cret") && !text.contains("pw-secret") && !text.contains("tok-secret")
        );
        assert!(text.contains("nats://bob:***@h:4222"));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = serde_json::from_str::<NatsConfig>(r#"{"url": "x"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"));
    }
}
