//! The configuration model: every key, its default, and what it is for. Loading (TOML file,
//! `HERALD_*` environment, flags) is the server's job; `docs/config.md` lists the same keys.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use herald_broker::StreamOptions;

/// The whole node configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on. `--dev` refuses anything but loopback.
    pub bind: String,
    /// Port to listen on (0: any free port, printed at start).
    pub port: u16,
    /// This node's name in `/api/info` and in `connect` replies (default: `herald-<random>`).
    #[serde(deserialize_with = "lenient::string")]
    pub node_name: String,
    /// Development mode: anonymous connect, subscribe, client publish, history and presence in the
    /// default namespace; the demo page; an open HTTP API when no `api_key` is set. Loopback only.
    pub dev: bool,
    /// Serve the demo page at `/` (also on in `dev`).
    pub demo: bool,
    /// HTTP API key (`Authorization: Bearer …`). Generated when absent outside `dev` (shown once
    /// on a terminal, never logged).
    #[serde(deserialize_with = "lenient::opt_string")]
    pub api_key: Option<String>,
    /// `memory`, `redis://…`, `rediss://…`, `redis+cluster://…` or `nats://…`.
    pub broker_url: String,
    /// TLS certificate chain (PEM); with `tls_key`, the node serves `https://` and `wss://`.
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Allow connections without a token (user "").
    pub allow_anonymous: bool,
    /// HS256 secret for connection and subscription tokens.
    #[serde(deserialize_with = "lenient::opt_string")]
    pub token_hmac_secret: Option<String>,
    /// RS256 public key, PEM text.
    pub token_rsa_public_key: Option<String>,
    /// RS256 public key, PEM file.
    pub token_rsa_public_key_file: Option<PathBuf>,
    /// ES256 public key, PEM text.
    pub token_ecdsa_public_key: Option<String>,
    /// ES256 public key, PEM file.
    pub token_ecdsa_public_key_file: Option<PathBuf>,
    /// Refuse tokens without an `exp` claim (otherwise such a token never expires).
    pub token_require_exp: bool,
    /// When set, tokens must carry this `aud` (a string, or an array containing it).
    #[serde(deserialize_with = "lenient::opt_string")]
    pub token_audience: Option<String>,
    /// When set, tokens must carry this `iss`.
    #[serde(deserialize_with = "lenient::opt_string")]
    pub token_issuer: Option<String>,
    /// URL of a JSON Web Key Set: RS256/ES256 tokens with a `kid` are verified with its keys,
    /// fetched when a token names an unknown `kid` and refreshed as they age.
    pub token_jwks_url: Option<String>,
    /// The key set is fetched again when older than this (a removed key stops working then).
    pub token_jwks_max_age_s: u64,
    /// Least time between two fetches of the key set, however many unknown `kid`s arrive.
    pub token_jwks_min_refresh_ms: u64,
    /// Each authenticated connection's personal channel, subscribed by the server at connect:
    /// `{user}` is replaced by the user id (e.g. `user:{user}`, or `user:#{user}` to also limit it
    /// to that user). Empty: none.
    pub personal_channel: String,
    /// Browser origins allowed to open a WebSocket (`https://app.example`, or `*`); empty: any.
    /// Upgrades without an `Origin` header (non-browser clients) are always allowed.
    pub allowed_origins: Vec<String>,
    /// Browser origins allowed to call the HTTP API (CORS); empty: none, so an API request that
    /// carries an `Origin` header is refused with 403.
    pub api_allowed_origins: Vec<String>,
    /// Seconds between server pings (`{}`).
    pub ping_interval_s: u64,
    /// Extra seconds a client may stay silent after a ping before it is closed with 4002.
    pub pong_timeout_s: u64,
    /// Drain window on shutdown: clients are told to come back after a random delay within it.
    pub drain_ms: u64,
    /// `text` or `json` logs.
    pub log_format: String,
    /// Log filter (`info`, `herald=debug`, …); `RUST_LOG` wins when set.
    pub log_level: String,
    /// Connection and input limits.
    pub limits: Limits,
    /// The namespace of channels without `:`.
    pub default_namespace: NamespaceConfig,
    /// Named namespaces (`name:rest` channels).
    pub namespaces: Vec<NamespaceConfig>,
    /// Redis broker settings (see docs/multi-node.md), passed to the Redis broker as they are.
    pub redis: Option<serde_json::Value>,
    /// NATS broker settings (see docs/multi-node-nats.md), passed to the NATS broker as they are.
    pub nats: Option<serde_json::Value>,
    /// Proxy hooks: the application's backend decides connects, subscriptions, publications and
    /// answers `rpc` over HTTP (see docs/proxy.md).
    pub proxy: ProxyConfig,
    /// Pusher Channels compatibility (`[pusher]`, `[[pusher.apps]]`; see docs/pusher.md), read by
    /// the server as it is.
    pub pusher: Option<serde_json::Value>,
    /// Consumers that take publish and broadcast commands from outside sources (`[consumers]`:
    /// a PostgreSQL outbox, docs/consumers.md; Kafka topics, docs/consumers-kafka.md), read by
    /// the server as it is.
    pub consumers: Option<serde_json::Value>,
    /// The admin web UI (`[admin]`; see docs/admin.md), read by the server as it is.
    pub admin: Option<serde_json::Value>,
    /// OpenTelemetry tracing of publications (`[tracing]`; see docs/deploy.md), read by the
    /// server as it is. Absent: off.
    pub tracing: Option<serde_json::Value>,
    /// The lifecycle event stream (`[lifecycle]`; see docs/lifecycle.md), read by the server as
    /// it is.
    pub lifecycle: Option<serde_json::Value>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: "127.0.0.1".into(),
            port: 8000,
            node_name: String::new(),
            dev: false,
            demo: false,
            api_key: None,
            broker_url: "memory".into(),
            tls_cert: None,
            tls_key: None,
            allow_anonymous: false,
            token_hmac_secret: None,
            token_rsa_public_key: None,
            token_rsa_public_key_file: None,
            token_ecdsa_public_key: None,
            token_ecdsa_public_key_file: None,
            token_require_exp: false,
            token_audience: None,
            token_issuer: None,
            token_jwks_url: None,
            token_jwks_max_age_s: 300,
            token_jwks_min_refresh_ms: 10_000,
            personal_channel: String::new(),
            allowed_origins: Vec::new(),
            api_allowed_origins: Vec::new(),
            ping_interval_s: 25,
            pong_timeout_s: 10,
            drain_ms: 5000,
            log_format: "text".into(),
            log_level: "info".into(),
            limits: Limits::default(),
            default_namespace: NamespaceConfig::default(),
            namespaces: Vec::new(),
            redis: None,
            nats: None,
            proxy: ProxyConfig::default(),
            pusher: None,
            consumers: None,
            admin: None,
            tracing: None,
            lifecycle: None,
        }
    }
}

impl Config {
    /// What `dev` mode changes, as defaults under the file and the environment: anonymous
    /// clients may connect, subscribe, publish and read history and presence in the default
    /// namespace, and the demo page is served.
    pub fn dev_defaults() -> serde_json::Value {
        serde_json::json!({
            "allow_anonymous": true,
            "demo": true,
            "default_namespace": {
                "subscribe": "anonymous",
                "publish": true,
                "history": true,
                "history_size": 1000,
                "presence": true,
                "join_leave": true,
            },
        })
    }

    /// Check values that serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ping_interval_s == 0 {
            return Err(ConfigError::TooSmall {
                key: "ping_interval_s",
                min: 1,
            });
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::TlsPair);
        }
        for ns in &self.namespaces {
            if ns.name.is_empty()
                || !ns.name.bytes().all(crate::namespace::is_name_byte)
                || ns.name.contains(':')
            {
                return Err(ConfigError::NamespaceName(ns.name.clone()));
            }
        }
        self.proxy.validate()?;
        self.proxy.validate_namespaces(&self.namespaces)?;
        for ns in std::iter::once(&self.default_namespace).chain(&self.namespaces) {
            if ns.subscribe_proxy
                && self
                    .proxy
                    .hook_url(crate::proxy::Hook::Subscribe, &ns.name)
                    .is_empty()
            {
                return Err(ConfigError::NoProxyUrl {
                    namespace: ns.name.clone(),
                    flag: "subscribe_proxy",
                    key: "proxy.subscribe_url",
                });
            }
            if ns.join_leave_batch_ms > MAX_JOIN_LEAVE_BATCH_MS {
                return Err(ConfigError::JoinLeaveBatch {
                    namespace: ns.name.clone(),
                });
            }
            if ns.join_leave_counts && !(ns.presence && ns.join_leave && ns.join_leave_batch_ms > 0)
            {
                return Err(ConfigError::JoinLeaveCounts {
                    namespace: ns.name.clone(),
                });
            }
            if ns.publish_proxy
                && self
                    .proxy
                    .hook_url(crate::proxy::Hook::Publish, &ns.name)
                    .is_empty()
            {
                return Err(ConfigError::NoProxyUrl {
                    namespace: ns.name.clone(),
                    flag: "publish_proxy",
                    key: "proxy.publish_url",
                });
            }
        }
        let l = &self.limits;
        if l.max_frame_bytes < 128 || l.outbound_queue_bytes < l.max_frame_bytes {
            return Err(ConfigError::FrameLimits);
        }
        Ok(())
    }
}

/// Limits that protect the node from bad or greedy clients. Each has a sane default.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest WebSocket message a client may send; larger closes with 4503.
    pub max_frame_bytes: usize,
    /// Channels one connection may be subscribed to (error 106 beyond).
    pub max_channels_per_connection: usize,
    /// Sustained commands per second per connection (error 110 beyond).
    pub commands_per_second: u32,
    /// Burst of commands allowed above the sustained rate.
    pub command_burst: u32,
    /// Time from TCP accept to a successful `connect` command; closes with 4500 after it.
    pub handshake_timeout_ms: u64,
    /// Connections on this node that completed `connect` (4504 beyond); 0 means no limit.
    pub max_connections: usize,
    /// Bytes queued for one connection before it is closed as a slow consumer (4001).
    pub outbound_queue_bytes: usize,
    /// A write to a client that takes longer than this closes the connection.
    pub write_timeout_ms: u64,
    /// Largest HTTP API request body (413 beyond).
    pub max_api_body_bytes: usize,
    /// Channels in one `/api/broadcast` (or one consumer's broadcast); more is error 106.
    pub max_broadcast_channels: usize,
    /// Largest `/api/broadcast` request body (413 beyond): room for `max_broadcast_channels`
    /// channel names besides the data.
    pub max_broadcast_body_bytes: usize,
    /// Publications of one broadcast in flight at once.
    pub broadcast_concurrency: usize,
    /// Open TCP connections per client IP (WebSocket and HTTP alike); 0 means no limit. Beyond
    /// it a new connection is closed at once.
    pub max_connections_per_ip: usize,
    /// WebSocket handshakes (upgrade requests) per second per client IP; 0 means no limit. Beyond
    /// it the upgrade is answered 429 with `Retry-After`.
    pub handshakes_per_ip_per_s: u32,
    /// Burst of handshakes per client IP allowed above `handshakes_per_ip_per_s`.
    pub handshake_burst_per_ip: u32,
    /// Bytes of recovered publications one `connect` (all its channels) or `subscribe` reply may
    /// carry; channels past it answer `recovered: false`, so one reply cannot grow unbounded.
    pub max_recovery_bytes: usize,
    /// WebSocket compression (permessage-deflate, no context takeover) for clients that offer
    /// it, on `/ws` and Pusher's `/app/{key}`. Off by default: it costs CPU per message.
    pub compression: bool,
    /// Listening sockets the node binds on its port (`SO_REUSEPORT`), each with its own accept
    /// queue of up to `net.core.somaxconn`: the kernel spreads new connections over them, so a
    /// reconnect storm larger than one queue is not dropped and retransmitted (1 s later). 1
    /// binds one plain socket.
    pub accept_queues: usize,
    /// Commands in one batch (`/api/batch`, Centrifugo's `batch`, a consumer's `batch` row or
    /// record); more is error 106, nothing run.
    pub max_batch_commands: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 64 * 1024,
            max_channels_per_connection: 128,
            commands_per_second: 100,
            command_burst: 200,
            handshake_timeout_ms: 10_000,
            max_connections: 0,
            outbound_queue_bytes: 1024 * 1024,
            write_timeout_ms: 10_000,
            max_api_body_bytes: 1024 * 1024,
            max_broadcast_channels: 100_000,
            max_broadcast_body_bytes: 8 * 1024 * 1024,
            broadcast_concurrency: 256,
            max_recovery_bytes: 4 * 1024 * 1024,
            max_connections_per_ip: 0,
            handshakes_per_ip_per_s: 0,
            handshake_burst_per_ip: 20,
            compression: false,
            accept_queues: 8,
            max_batch_commands: 1000,
        }
    }
}

/// Who may subscribe to a namespace's channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscribePolicy {
    /// Anyone connected, anonymous included.
    Anonymous,
    /// Connections with a user (a token with `sub`).
    Authenticated,
    /// Only with a subscription token for the channel (or the connection token's `channels`).
    Token,
}

/// Per-namespace rules: permissions, history and presence.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Channel prefix before `:` (ignored for the default namespace).
    pub name: String,
    /// Who may subscribe.
    pub subscribe: SubscribePolicy,
    /// Clients allowed to subscribe may also publish.
    pub publish: bool,
    /// Clients allowed to subscribe may read history.
    pub history: bool,
    /// Publications kept per channel (0: no history, no recovery).
    pub history_size: usize,
    /// Seconds a publication stays in history.
    pub history_ttl_s: u64,
    /// Seconds a channel's epoch and offset outlive its last publication.
    pub history_meta_ttl_s: u64,
    /// Seconds a channel that was read or subscribed but never published to keeps its epoch
    /// after the last read (a fresh epoch afterwards: a client holding the old one at offset 0
    /// is told `recovered: false`).
    pub history_empty_ttl_s: u64,
    /// Track who is subscribed; clients allowed to subscribe may ask.
    pub presence: bool,
    /// Push `join`/`leave` to subscribers (needs `presence`).
    pub join_leave: bool,
    /// Ask the backend (`proxy.subscribe_url`) about each client subscription; it replaces the
    /// `subscribe` policy (user-limited channels are still checked).
    pub subscribe_proxy: bool,
    /// Send each client publication to the backend (`proxy.publish_url`), which allows, rewrites
    /// or refuses it; clients may publish here even with `publish = false`.
    pub publish_proxy: bool,
    /// What happens to a subscriber that reads slower than this namespace's publications come,
    /// once its queue reaches `limits.outbound_queue_bytes`.
    pub backpressure: Backpressure,
    /// Milliseconds over which a node collects a channel's joins and leaves before pushing them
    /// to its subscribers as one `presence_batch` push (0: one `join`/`leave` push each).
    pub join_leave_batch_ms: u64,
    /// With `join_leave_batch_ms`: instead of the members who joined and left, each batch pushes
    /// the channel's presence counts (`presence_count`), so that a channel of 100,000 members
    /// costs each subscriber one small push per interval, not one entry per member.
    pub join_leave_counts: bool,
    /// Clients may ask for delta compression of a subscription's publications
    /// (`subscribe` with `delta: "fossil"`); the node then keeps each channel's last
    /// publication and computes one delta per publication.
    pub allow_delta: bool,
    /// Clients may subscribe with a tag filter (`subscribe` with `tf`): the node then delivers
    /// them only the publications whose tags match it.
    pub allow_tags_filter: bool,
}

/// A namespace's answer to a subscriber that falls behind (its connection's queue is full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backpressure {
    /// Close the connection as a slow consumer (4001); the client reconnects and recovers.
    #[default]
    Disconnect,
    /// Keep only the newest queued publication of each of the namespace's channels: the client
    /// gets the latest state after a `skip` push naming what it did not get (tickers, cursors).
    Conflate,
    /// Leave out the oldest queued publications of the namespace's channels until the queue is
    /// half empty, each run announced by a `skip` push (the client knows exactly what it missed).
    DropOldest,
}

impl Default for NamespaceConfig {
    fn default() -> Self {
        NamespaceConfig {
            name: String::new(),
            subscribe: SubscribePolicy::Authenticated,
            publish: false,
            history: true,
            history_size: 100,
            history_ttl_s: 300,
            history_meta_ttl_s: 24 * 3600,
            history_empty_ttl_s: 600,
            presence: false,
            join_leave: false,
            subscribe_proxy: false,
            publish_proxy: false,
            backpressure: Backpressure::Disconnect,
            join_leave_batch_ms: 0,
            join_leave_counts: false,
            allow_delta: false,
            allow_tags_filter: false,
        }
    }
}

impl NamespaceConfig {
    /// How the broker keeps this namespace's streams.
    pub fn stream_options(&self) -> StreamOptions {
        StreamOptions {
            history_size: self.history_size,
            history_ttl: Duration::from_secs(self.history_ttl_s),
            meta_ttl: Duration::from_secs(self.history_meta_ttl_s.max(self.history_ttl_s)),
            empty_ttl: Duration::from_secs(self.history_empty_ttl_s.max(1)),
        }
    }
}

/// The proxy hooks: URLs of the application's backend and what is forwarded to it. A hook whose
/// URL is empty is off.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Called by `connect` without a token (or every `connect` with `connect_always`).
    pub connect_url: String,
    /// Also call the connect proxy when the client brings a token (the token is then ignored).
    pub connect_always: bool,
    /// Called when a proxy-authenticated connection reaches its expiry, to extend it.
    pub refresh_url: String,
    /// Called for subscriptions in namespaces with `subscribe_proxy = true`.
    pub subscribe_url: String,
    /// Called when a subscription the subscribe hook granted with an `expire_at` reaches it.
    pub sub_refresh_url: String,
    /// Called for publications in namespaces with `publish_proxy = true`.
    pub publish_url: String,
    /// Called by the `rpc` command; without it clients get error 108.
    pub rpc_url: String,
    /// Longest wait for one backend answer; past it the client gets error 112.
    pub timeout_ms: u64,
    /// Headers of the client's HTTP request (the WebSocket upgrade, the SSE or stream request)
    /// forwarded to the backend, by name (case-insensitive). Others are never sent.
    pub headers: Vec<String>,
    /// Cookies of the client's HTTP request forwarded to the backend, by name. Others are never
    /// sent.
    pub cookies: Vec<String>,
    /// Largest backend answer read; a larger one is refused (internal error to the client).
    pub max_response_bytes: usize,
    /// Most backend calls in flight at once from this node, and so most connections it holds
    /// to the backend; a call past it waits for a free one within `timeout_ms`, then fails as
    /// unavailable (error 112).
    pub max_connections: usize,
    /// Also send the allow-listed `headers` as HTTP headers of Herald's own hook request (as
    /// Centrifugo does), not only in the body.
    pub http_headers: bool,
    /// Hooks of one namespace's channels at their own URLs and timeout (`[[proxy.namespaces]]`).
    pub namespaces: Vec<NamespaceHooks>,
    /// PEM file of CA certificates trusted for `https://` hook URLs, besides the built-in roots.
    pub tls_ca_file: String,
    /// PEM certificate chain Herald presents to the backend (mutual TLS), with `tls_key_file`.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Centrifugo's `binary_encoding`: hook requests carry the client's data as `b64data`
    /// (standard base64 of its bytes) instead of `data`, and answers may give theirs as
    /// `b64data` (exactly one of the two).
    pub binary_encoding: bool,
}

/// One namespace's own subscribe, sub_refresh and publish hooks (`[[proxy.namespaces]]`): each
/// URL set here replaces `proxy.<hook>_url` for that namespace's channels.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceHooks {
    /// The namespace (one of `[[namespaces]]`).
    pub name: String,
    /// Its subscribe hook (needs `subscribe_proxy` on the namespace).
    pub subscribe_url: String,
    /// Its sub_refresh hook (needs `subscribe_proxy` on the namespace).
    pub sub_refresh_url: String,
    /// Its publish hook (needs `publish_proxy` on the namespace).
    pub publish_url: String,
    /// The longest one of its calls may take; absent: `proxy.timeout_ms`.
    pub timeout_ms: Option<u64>,
    /// `binary_encoding` for its calls; absent: `proxy.binary_encoding`.
    pub binary_encoding: Option<bool>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_url: String::new(),
            connect_always: false,
            refresh_url: String::new(),
            subscribe_url: String::new(),
            sub_refresh_url: String::new(),
            publish_url: String::new(),
            rpc_url: String::new(),
            timeout_ms: 3000,
            headers: Vec::new(),
            cookies: Vec::new(),
            max_response_bytes: 64 * 1024,
            // Enough for a backend answering in 10 ms to take thousands of connects a second,
            // few enough for a small app server's worker pool and its file descriptors.
            max_connections: 64,
            http_headers: true,
            namespaces: Vec::new(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            binary_encoding: false,
        }
    }
}

impl ProxyConfig {
    /// The hooks' URLs with their keys, empty (off) ones included.
    fn urls(&self) -> [(&'static str, &str); 6] {
        [
            ("proxy.connect_url", &self.connect_url),
            ("proxy.refresh_url", &self.refresh_url),
            ("proxy.subscribe_url", &self.subscribe_url),
            ("proxy.sub_refresh_url", &self.sub_refresh_url),
            ("proxy.publish_url", &self.publish_url),
            ("proxy.rpc_url", &self.rpc_url),
        ]
    }

    /// Whether any hook is configured.
    pub fn enabled(&self) -> bool {
        self.urls().iter().any(|(_, u)| !u.is_empty())
            || self.namespaces.iter().any(|n| {
                !(n.subscribe_url.is_empty()
                    && n.sub_refresh_url.is_empty()
                    && n.publish_url.is_empty())
            })
    }

    /// The URL of `hook` for a channel of `namespace` ("" for connection-wide hooks and the
    /// default namespace): the namespace's own when it has one, else `[proxy]`'s; "" is off.
    pub fn hook_url(&self, hook: crate::proxy::Hook, namespace: &str) -> &str {
        use crate::proxy::Hook;
        let own = self.namespace_hooks(namespace).map(|n| match hook {
            Hook::Subscribe => n.subscribe_url.as_str(),
            Hook::SubRefresh => n.sub_refresh_url.as_str(),
            Hook::Publish => n.publish_url.as_str(),
            Hook::Connect | Hook::Refresh | Hook::Rpc => "",
        });
        match own {
            Some(url) if !url.is_empty() => url,
            _ => match hook {
                Hook::Connect => &self.connect_url,
                Hook::Refresh => &self.refresh_url,
                Hook::Subscribe => &self.subscribe_url,
                Hook::SubRefresh => &self.sub_refresh_url,
                Hook::Publish => &self.publish_url,
                Hook::Rpc => &self.rpc_url,
            },
        }
    }

    /// The longest a call for a channel of `namespace` may take, in milliseconds.
    pub fn hook_timeout_ms(&self, namespace: &str) -> u64 {
        self.namespace_hooks(namespace)
            .and_then(|n| n.timeout_ms)
            .unwrap_or(self.timeout_ms)
    }

    /// Whether calls for a channel of `namespace` use `b64data` (`binary_encoding`).
    pub fn hook_binary(&self, namespace: &str) -> bool {
        self.namespace_hooks(namespace)
            .and_then(|n| n.binary_encoding)
            .unwrap_or(self.binary_encoding)
    }

    fn namespace_hooks(&self, namespace: &str) -> Option<&NamespaceHooks> {
        match namespace {
            "" => None,
            name => self.namespaces.iter().find(|n| n.name == name),
        }
    }

    /// `[[proxy.namespaces]]`: each names a configured namespace once, with valid URLs for
    /// hooks that namespace uses, and a timeout of at least 1 ms.
    fn validate_namespaces(&self, namespaces: &[NamespaceConfig]) -> Result<(), ConfigError> {
        for (i, hooks) in self.namespaces.iter().enumerate() {
            let bad = |source: ConfigError| ConfigError::NamespaceHooks {
                namespace: hooks.name.clone(),
                source: Box::new(source),
            };
            let Some(ns) = namespaces.iter().find(|n| n.name == hooks.name) else {
                return Err(bad(ConfigError::UnknownNamespace));
            };
            if self.namespaces[..i].iter().any(|n| n.name == hooks.name) {
                return Err(bad(ConfigError::DuplicateNamespace));
            }
            if hooks.timeout_ms == Some(0) {
                return Err(bad(ConfigError::TooSmall {
                    key: "timeout_ms",
                    min: 1,
                }));
            }
            for (key, url, flag, on) in [
                (
                    "subscribe_url",
                    &hooks.subscribe_url,
                    "subscribe_proxy",
                    ns.subscribe_proxy,
                ),
                (
                    "sub_refresh_url",
                    &hooks.sub_refresh_url,
                    "subscribe_proxy",
                    ns.subscribe_proxy,
                ),
                (
                    "publish_url",
                    &hooks.publish_url,
                    "publish_proxy",
                    ns.publish_proxy,
                ),
            ] {
                if url.is_empty() {
                    continue;
                }
                hook_url(key, url).map_err(bad)?;
                if !on {
                    return Err(bad(ConfigError::UnusedHook { key, flag }));
                }
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let too_small = |key, min| Err(ConfigError::TooSmall { key, min });
        if self.timeout_ms == 0 {
            return too_small("proxy.timeout_ms", 1);
        }
        if self.max_response_bytes < 64 {
            return too_small("proxy.max_response_bytes", 64);
        }
        if self.max_connections == 0 {
            return too_small("proxy.max_connections", 1);
        }
        if self.tls_cert_file.is_empty() != self.tls_key_file.is_empty() {
            return Err(ConfigError::ProxyTlsPair);
        }
        for (key, url) in self.urls() {
            if !url.is_empty() {
                hook_url(key, url)?;
            }
        }
        Ok(())
    }
}

/// A hook URL must be an absolute `http://` or `https://` URL with a host: anything else would
/// fail every call at run time (as error 112, retried forever by clients). The error names the
/// key and never repeats the URL, which may carry credentials.
fn hook_url(key: &'static str, value: &str) -> Result<(), ConfigError> {
    let parsed = url::Url::parse(value).map_err(|source| ConfigError::HookUrl { key, source })?;
    // Centrifugo's configs may carry `grpc://` proxy endpoints: say plainly that Herald has no
    // gRPC proxy (it would need tonic/prost), rather than only "not http".
    if matches!(parsed.scheme(), "grpc" | "grpcs") {
        return Err(ConfigError::HookGrpc { key });
    }
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ConfigError::HookScheme {
            key,
            scheme: parsed.scheme().to_owned(),
        });
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::HookHost { key });
    }
    Ok(())
}

/// A value [`Config::validate`] refuses; the message names the key (never a secret or a URL,
/// which may carry credentials).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A number below its least useful value.
    #[error("{key} must be at least {min}")]
    TooSmall {
        /// The key.
        key: &'static str,
        /// Its least value.
        min: usize,
    },
    /// One of `tls_cert` and `tls_key` without the other.
    #[error("tls_cert and tls_key go together")]
    TlsPair,
    /// A namespace name that is empty or has characters names may not have.
    #[error("bad namespace name {0:?}")]
    NamespaceName(String),
    /// A namespace asks for a proxy hook that is not configured.
    #[error("namespace {namespace:?} has {flag} but {key} is empty")]
    NoProxyUrl {
        /// The namespace.
        namespace: String,
        /// Its flag (`subscribe_proxy`, `publish_proxy`).
        flag: &'static str,
        /// The hook's key.
        key: &'static str,
    },
    /// The frame and queue limits do not fit together.
    #[error("limits: max_frame_bytes ≥ 128 and outbound_queue_bytes ≥ max_frame_bytes")]
    FrameLimits,
    /// A hook URL that does not parse.
    #[error("{key} is not a valid URL ({source}); write it as http://host:port/path")]
    HookUrl {
        /// The hook's key.
        key: &'static str,
        /// Why it does not parse.
        source: url::ParseError,
    },
    /// A hook URL that is not http or https.
    #[error("{key} must be an http:// or https:// URL, not {scheme}://")]
    HookScheme {
        /// The hook's key.
        key: &'static str,
        /// The scheme it has.
        scheme: String,
    },
    /// A `grpc://` hook URL (Centrifugo's gRPC proxy).
    #[error(
        "{key}: gRPC proxy endpoints are not supported; use an http:// or https:// URL (docs/proxy.md)"
    )]
    HookGrpc {
        /// The hook's key.
        key: &'static str,
    },
    /// A hook URL without a host.
    #[error("{key} has no host")]
    HookHost {
        /// The hook's key.
        key: &'static str,
    },
    /// A join/leave batching interval too long to read as live.
    #[error("namespace {namespace:?}: join_leave_batch_ms must be at most 10000")]
    JoinLeaveBatch {
        /// The namespace.
        namespace: String,
    },
    /// Counts pushed per batch without the batches they count.
    #[error(
        "namespace {namespace:?}: join_leave_counts needs presence = true, join_leave = true and join_leave_batch_ms > 0"
    )]
    JoinLeaveCounts {
        /// The namespace.
        namespace: String,
    },
    /// A `[[proxy.namespaces]]` entry that cannot be used.
    #[error("[[proxy.namespaces]] {namespace:?}: {source}")]
    NamespaceHooks {
        /// Its `name`.
        namespace: String,
        /// What is wrong with it.
        source: Box<ConfigError>,
    },
    /// One of `proxy.tls_cert_file` and `proxy.tls_key_file` without the other.
    #[error("proxy.tls_cert_file and proxy.tls_key_file go together")]
    ProxyTlsPair,
    /// A name that is not one of `[[namespaces]]`.
    #[error("no such namespace in [[namespaces]]")]
    UnknownNamespace,
    /// A second entry for the same namespace.
    #[error("the namespace has another entry")]
    DuplicateNamespace,
    /// A hook URL whose namespace does not use the hook.
    #[error("{key} is set but the namespace does not have {flag}")]
    UnusedHook {
        /// The hook's key.
        key: &'static str,
        /// The namespace flag that turns the hook on.
        flag: &'static str,
    },
}

/// The longest `join_leave_batch_ms`: longer, and members would see each other join too late.
pub const MAX_JOIN_LEAVE_BATCH_MS: u64 = 10_000;

/// Secrets and names set from the environment may look like numbers (`HERALD_API_KEY=12345`);
/// read them back as the text they were. For `#[serde(deserialize_with = …)]` here and in other
/// sections the server reads (the consumers').
pub mod lenient {
    use serde::{Deserialize, Deserializer};

    /// A TOML or environment value taken as text: figment reads "123" as a number.
    #[derive(Deserialize)]
    #[serde(untagged)]
    pub enum Text {
        /// Text as written.
        Str(String),
        /// A whole number.
        Unsigned(u64),
        /// A negative whole number.
        Signed(i64),
        /// A number with a fraction.
        Float(f64),
        /// `true` or `false`.
        Bool(bool),
    }

    impl From<Text> for String {
        fn from(t: Text) -> String {
            match t {
                Text::Str(s) => s,
                Text::Unsigned(n) => n.to_string(),
                Text::Signed(n) => n.to_string(),
                Text::Float(n) => n.to_string(),
                Text::Bool(b) => b.to_string(),
            }
        }
    }

    /// A value as text.
    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Text::deserialize(d).map(String::from)
    }

    /// An optional value as text.
    pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Option::<Text>::deserialize(d).map(|t| t.map(String::from))
    }

    /// A list, or one comma-separated string (`HERALD_…__TOPICS=a,b`), as texts.
    pub fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum List {
            Many(Vec<Text>),
            One(Text),
        }
        Ok(match List::deserialize(d)? {
            List::Many(v) => v.into_iter().map(String::from).collect(),
            List::One(t) => String::from(t)
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_flags_need_their_hook() {
        let mut c = Config::default();
        c.namespaces.push(NamespaceConfig {
            name: "room".into(),
            subscribe_proxy: true,
            ..NamespaceConfig::default()
        });
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("subscribe_url"));
        c.proxy.subscribe_url = "http://127.0.0.1:1/subscribe".into();
        assert!(c.validate().is_ok());
        c.default_namespace.publish_proxy = true;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("publish_url"));
        c.proxy.publish_url = "http://127.0.0.1:1/publish".into();
        c.proxy.timeout_ms = 0;
        assert!(c.validate().unwrap_err().to_string().contains("timeout_ms"));
    }

    #[test]
    fn join_leave_batch_is_bounded() {
        let mut c = Config::default();
        c.namespaces.push(NamespaceConfig {
            name: "crowd".into(),
            join_leave_batch_ms: MAX_JOIN_LEAVE_BATCH_MS,
            ..NamespaceConfig::default()
        });
        assert!(c.validate().is_ok());
        c.namespaces[0].join_leave_batch_ms = MAX_JOIN_LEAVE_BATCH_MS + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("\"crowd\"") && e.contains("at most 10000"),
            "{e}"
        );
    }

    #[test]
    fn join_leave_counts_need_the_batches_they_count() {
        let mut c = Config::default();
        c.namespaces.push(NamespaceConfig {
            name: "crowd".into(),
            join_leave_counts: true,
            presence: true,
            join_leave: true,
            ..NamespaceConfig::default()
        });
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("join_leave_batch_ms > 0"), "{e}");
        c.namespaces[0].join_leave_batch_ms = 100;
        assert!(c.validate().is_ok());
        c.namespaces[0].join_leave = false;
        assert!(c.validate().is_err());
    }

    #[test]
    fn namespace_hooks_override_the_proxy_section_and_are_checked() {
        use crate::proxy::Hook;
        let mut c = Config::default();
        c.namespaces.push(NamespaceConfig {
            name: "room".into(),
            subscribe_proxy: true,
            ..NamespaceConfig::default()
        });
        c.proxy.namespaces.push(NamespaceHooks {
            name: "room".into(),
            subscribe_url: "http://127.0.0.1:1/room".into(),
            timeout_ms: Some(50),
            ..NamespaceHooks::default()
        });
        // The namespace's own URL is enough for its subscribe_proxy.
        assert!(c.validate().is_ok());
        assert_eq!(
            c.proxy.hook_url(Hook::Subscribe, "room"),
            "http://127.0.0.1:1/room"
        );
        assert_eq!(c.proxy.hook_url(Hook::Subscribe, ""), "");
        assert_eq!(c.proxy.hook_timeout_ms("room"), 50);
        assert_eq!(c.proxy.hook_timeout_ms("other"), 3000);
        c.proxy.sub_refresh_url = "http://127.0.0.1:1/sub_refresh".into();
        assert_eq!(
            c.proxy.hook_url(Hook::SubRefresh, "room"),
            "http://127.0.0.1:1/sub_refresh"
        );
        for (edit, why) in [
            (
                (|h: &mut NamespaceHooks| h.name = "lobby".into()) as fn(&mut NamespaceHooks),
                "no such namespace",
            ),
            (|h| h.timeout_ms = Some(0), "timeout_ms"),
            (|h| h.subscribe_url = "ftp://x/y".into(), "subscribe_url"),
            (
                |h| h.publish_url = "http://127.0.0.1:1/p".into(),
                "does not have publish_proxy",
            ),
        ] {
            let mut bad = c.clone();
            edit(&mut bad.proxy.namespaces[0]);
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            assert!(!e.contains("ftp://x"), "{e}");
        }
        let mut twice = c.clone();
        twice.proxy.namespaces.push(c.proxy.namespaces[0].clone());
        let e = twice.validate().unwrap_err().to_string();
        assert!(e.contains("another entry"), "{e}");
    }

    #[test]
    fn grpc_hook_urls_are_refused_as_unsupported() {
        for bad in ["grpc://user:s3cret@app:10000", "grpcs://app:10000"] {
            let mut c = Config::default();
            c.proxy.connect_url = bad.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.starts_with("proxy.connect_url: gRPC proxy endpoints are not supported"),
                "{bad}: {e}"
            );
            assert!(!e.contains("s3cret") && !e.contains("10000"), "{bad}: {e}");
        }
    }

    #[test]
    fn hook_urls_are_checked_at_start_up_without_repeating_them() {
        for (bad, why) in [
            ("127.0.0.1:8080/connect", "not a valid URL"),
            ("localhost:8080/connect", "not localhost://"),
            ("ftp://user:s3cret@app/connect", "not ftp://"),
            ("/herald/connect", "not a valid URL"),
            ("http://", "not a valid URL"),
            ("unix:/run/app.sock", "not unix://"),
        ] {
            let mut c = Config::default();
            c.proxy.rpc_url = bad.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.starts_with("proxy.rpc_url "), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains("s3cret") && !e.contains("8080"), "{bad}: {e}");
        }
        let mut c = Config::default();
        c.proxy.connect_url = "https://user:pw@app.internal/herald/connect".into();
        c.proxy.rpc_url = "http://[::1]:9/rpc".into();
        assert!(c.validate().is_ok());
        c.proxy.max_connections = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_connections"));
    }
}
