//! Pusher apps from the configuration (and from PostgreSQL, [`super::apps_db`]), and how their
//! channels map onto Herald channels.
//!
//! Every Pusher channel `X` of app `ID` is the Herald channel `pusher:ID:X`: apps never see each
//! other's channels, and Herald-protocol clients reach them only through a `pusher` namespace.
//!
//! The apps in force are a [`Registry`]: two sources (the configured apps, from TOML and
//! `HERALD_PUSHER_APP_*`, and the database's rows), each replaceable at run time, merged into one
//! table that is swapped whole. A configured app wins over a database row with its id or key.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herald_core::config::NamespaceConfig;
use herald_core::namespace::Namespaces;
use herald_core::rate::TokenBucket;
use herald_core::Hub;
use serde::{Deserialize, Deserializer};

use super::census::Census;
use super::counting::Counting;
use super::shared::SharedFrames;
use super::webhooks::{WebhookConfig, Webhooks};

/// The Herald namespace that holds every Pusher channel.
pub const NAMESPACE: &str = "pusher";
/// Longest Pusher channel name (Pusher's own limit).
pub const MAX_CHANNEL_LEN: usize = 164;

/// One `[[pusher.apps]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// App id: the `/apps/{id}/…` HTTP API path and the channel mapping.
    #[serde(deserialize_with = "text")]
    pub id: String,
    /// Public key: the WebSocket path `/app/{key}` and `auth_key` of signed requests.
    #[serde(deserialize_with = "text")]
    pub key: String,
    /// Secret that signs channel authorizations and HTTP API requests.
    #[serde(deserialize_with = "text")]
    pub secret: String,
    /// Let clients send `client-*` events on private and presence channels (Soketi's and
    /// Sockudo's `enable_client_messages` is read as this).
    #[serde(default, alias = "enable_client_messages")]
    pub enable_client_events: bool,
    /// Client events one connection may send per second (burst twice as many); default
    /// `pusher.client_events_per_second`; beyond, `pusher:error` 4301.
    #[serde(default, deserialize_with = "limit")]
    pub max_client_events_per_second: Option<u32>,
    /// Connections this app may hold on this node (0, or Soketi's -1: no limit); beyond it 4100.
    #[serde(default, deserialize_with = "no_limit_below_zero")]
    pub max_connections: usize,
    /// Where webhooks go.
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
    /// Pusher's "subscription counting": subscribers of non-presence channels receive
    /// `pusher_internal:subscription_count` when the channel's count changes.
    #[serde(default)]
    pub enable_subscription_count: bool,
    /// Pusher's "watchlist events": a connection signed in with a `watchlist` in its
    /// `user_data` is sent `pusher_internal:watchlist_events` as watched users come online and
    /// go offline (see [`super::watchlist`]).
    #[serde(default)]
    pub enable_watchlist_events: bool,
    // Per-app limits, named as Soketi names them. `None`: the default in each doc.
    /// Longest event name, in characters (default 200, Pusher's); over: HTTP 400, or
    /// `pusher:error` for a client event.
    #[serde(default, deserialize_with = "limit")]
    pub max_event_name_length: Option<usize>,
    /// Largest event `data`, in KiB (default `pusher.max_event_bytes`); over: HTTP 413, or
    /// `pusher:error` for a client event.
    #[serde(default, deserialize_with = "limit")]
    pub max_event_payload_in_kb: Option<u64>,
    /// Channels one `POST /events` may name (default 100); over: HTTP 400.
    #[serde(default, deserialize_with = "limit")]
    pub max_event_channels_at_once: Option<usize>,
    /// Events in one `POST /batch_events` (default 10); over: HTTP 400.
    #[serde(default, deserialize_with = "limit")]
    pub max_event_batch_size: Option<usize>,
    /// Distinct users in one presence channel (default: no limit); a new user over it is
    /// refused with `pusher:subscription_error` `LimitReached`, status 4004.
    #[serde(default, deserialize_with = "limit")]
    pub max_presence_members_per_channel: Option<usize>,
    /// Largest presence `user_info`, in KiB (default 1, Pusher's); over: `LimitReached`/400.
    #[serde(default, deserialize_with = "limit")]
    pub max_presence_member_size_in_kb: Option<u64>,
    /// Events the HTTP API accepts per second on this node (`events` and `batch_events`, one
    /// per event; burst: as many); over: HTTP 429. Default: no limit.
    #[serde(default, deserialize_with = "limit")]
    pub max_backend_events_per_second: Option<u32>,
    /// `GET` requests of the HTTP API per second on this node (burst: as many); over: HTTP
    /// 429. Default: no limit.
    #[serde(default, deserialize_with = "limit")]
    pub max_read_requests_per_second: Option<u32>,
}

/// The `[pusher]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PusherConfig {
    /// The apps.
    pub apps: Vec<AppConfig>,
    /// Seconds of client silence before the server pings (`activity_timeout` in the handshake).
    pub activity_timeout_s: u64,
    /// Client events a connection may send per second (burst: twice as many); beyond, 4301.
    pub client_events_per_second: u32,
    /// Largest event `data`, from the HTTP API or a client, in bytes (413 / 4301 beyond).
    pub max_event_bytes: usize,
    /// How long a cache channel (`cache-`, `private-cache-`, …) keeps its last event, in seconds.
    pub cache_ttl_s: u64,
    /// Browser origins allowed to call the HTTP API `/apps/…` (CORS; `*`: any). Empty: no CORS
    /// headers and no preflight answer (as before), requests with an `Origin` are served.
    pub cors_allowed_origins: Vec<String>,
    /// `[pusher.postgres]`: apps also read from a PostgreSQL table, refreshed periodically.
    pub postgres: Option<super::apps_db::AppsDbConfig>,
}

impl Default for PusherConfig {
    fn default() -> Self {
        PusherConfig {
            apps: Vec::new(),
            activity_timeout_s: 120,
            client_events_per_second: 10,
            max_event_bytes: 10 * 1024,
            cache_ttl_s: 30 * 60,
            cors_allowed_origins: Vec::new(),
            postgres: None,
        }
    }
}

/// An app at run time.
pub struct PusherApp {
    /// Its configuration.
    pub config: AppConfig,
    /// `pusher:ID:`, the prefix of its Herald channels, and the Herald user of its connections
    /// until they sign in (shared by all of them).
    pub prefix: Arc<str>,
    /// Whether new connections and HTTP API requests are served (a database row's `enabled`;
    /// configured apps always are). Refused: close 4003, HTTP 403.
    pub enabled: bool,
    /// Its open connections on this node (shared with the app's next version when the app is
    /// replaced at run time, so the count stays right).
    pub connections: Arc<AtomicUsize>,
    /// `max_backend_events_per_second`, when set.
    pub backend_events: Option<Mutex<TokenBucket>>,
    /// `max_read_requests_per_second`, when set.
    pub reads: Option<Mutex<TokenBucket>>,
}

/// A rate limit of `rate` per second with a burst of as many.
fn bucket(rate: Option<u32>) -> Option<Mutex<TokenBucket>> {
    rate.filter(|r| *r > 0)
        .map(|r| Mutex::new(TokenBucket::new(r, r)))
}

/// Take `n` tokens from an optional bucket; `false` (nothing taken) when there are not enough.
pub fn take(bucket: &Option<Mutex<TokenBucket>>, n: usize) -> bool {
    let Some(bucket) = bucket else {
        return true;
    };
    let mut b = bucket.lock().expect("rate lock");
    let now = Instant::now();
    let mut taken = 0;
    while taken < n && b.try_take(now) {
        taken += 1;
    }
    taken == n
}

impl PusherApp {
    /// The Herald channel of Pusher channel `channel`.
    pub fn internal(&self, channel: &str) -> String {
        format!("{}{channel}", self.prefix)
    }

    /// Built from its configuration.
    pub fn new(config: AppConfig) -> PusherApp {
        PusherApp {
            prefix: format!("{NAMESPACE}:{}:", config.id).into(),
            enabled: true,
            connections: Arc::default(),
            backend_events: bucket(config.max_backend_events_per_second),
            reads: bucket(config.max_read_requests_per_second),
            config,
        }
    }

    /// Longest event name, in characters.
    pub fn max_event_name_chars(&self) -> usize {
        self.config
            .max_event_name_length
            .unwrap_or(super::limits::MAX_EVENT_NAME_CHARS)
    }

    /// Largest event data, in bytes (`shared` is `pusher.max_event_bytes`).
    pub fn max_event_bytes(&self, shared: usize) -> usize {
        self.config
            .max_event_payload_in_kb
            .map_or(shared, |kb| (kb as usize).saturating_mul(1024))
    }

    /// Largest presence `user_info`, in bytes.
    pub fn max_user_info_bytes(&self) -> usize {
        self.config
            .max_presence_member_size_in_kb
            .map_or(super::limits::MAX_USER_INFO_BYTES, |kb| {
                (kb as usize).saturating_mul(1024)
            })
    }

    /// The Pusher channel of a Herald channel of this app.
    pub fn external<'a>(&self, internal: &'a str) -> Option<&'a str> {
        internal.strip_prefix(&*self.prefix)
    }
}

/// A configured app or a database row, checked: its id, key, secret and webhooks.
pub fn check_app(config: &AppConfig) -> anyhow::Result<()> {
    let id_ok = !config.id.is_empty()
        && config.id.len() <= 64
        && config
            .id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if !id_ok {
        bail!("pusher app id {:?}: 1 to 64 of [A-Za-z0-9_.-]", config.id);
    }
    if config.key.is_empty() || config.secret.is_empty() {
        bail!("pusher app {:?} needs a key and a secret", config.id);
    }
    for hook in &config.webhooks {
        hook.check()
            .with_context(|| format!("pusher app {:?} webhook", config.id))?;
    }
    Ok(())
}

/// A database row read as an app: its settings and whether it is enabled.
#[derive(Debug, Clone, PartialEq)]
pub struct DbApp {
    /// The row's settings.
    pub config: AppConfig,
    /// The row's `enabled` (absent or NULL: enabled).
    pub enabled: bool,
}

/// The apps in force, by key and by id; replaced whole.
#[derive(Default)]
struct Table {
    by_key: HashMap<String, Arc<PusherApp>>,
    by_id: HashMap<String, Arc<PusherApp>>,
}

/// The two sources the table is made of.
#[derive(Default)]
struct Sources {
    configured: Vec<AppConfig>,
    database: Vec<DbApp>,
}

/// The apps in force, replaceable at run time (see the module docs). Lookups take a read lock
/// for a map lookup and an `Arc` clone; replacements are rare (a config reload, a changed
/// table), so a std `RwLock` is enough here (no `arc-swap` dependency for it).
#[derive(Default)]
pub struct Registry {
    table: RwLock<Arc<Table>>,
    sources: Mutex<Sources>,
}

impl Registry {
    /// The app with this key (enabled or not).
    pub fn by_key(&self, key: &str) -> Option<Arc<PusherApp>> {
        self.current().by_key.get(key).cloned()
    }

    /// The app with this id (enabled or not).
    pub fn by_id(&self, id: &str) -> Option<Arc<PusherApp>> {
        self.current().by_id.get(id).cloned()
    }

    /// Every app in force.
    pub fn all(&self) -> Vec<Arc<PusherApp>> {
        self.current().by_id.values().cloned().collect()
    }

    fn current(&self) -> Arc<Table> {
        self.table.read().expect("apps lock").clone()
    }

    /// Replace the configured apps (TOML and environment): checked first, all or nothing: an
    /// invalid app or two apps sharing an id or a key leave the apps in force as they were.
    pub fn replace_configured(&self, configured: Vec<AppConfig>) -> anyhow::Result<()> {
        let mut keys = HashMap::new();
        let mut ids = HashMap::new();
        for config in &configured {
            check_app(config)?;
            if keys.insert(config.key.as_str(), ()).is_some() {
                bail!("two pusher apps share the key {:?}", config.key);
            }
            if ids.insert(config.id.as_str(), ()).is_some() {
                bail!("two pusher apps share the id {:?}", config.id);
            }
        }
        let mut sources = self.sources.lock().expect("apps lock");
        sources.configured = configured;
        self.rebuild(&sources);
        Ok(())
    }

    /// Replace the database's apps. Rows that cannot be served are left out, each with a
    /// warning naming its id (never its secret): an invalid row, a row whose key an earlier row
    /// (by id) has, a row whose id or key a configured app has (the configured app wins).
    /// Returns how many rows are in force.
    pub fn replace_database(&self, mut rows: Vec<DbApp>) -> usize {
        rows.sort_by(|a, b| a.config.id.cmp(&b.config.id));
        let mut sources = self.sources.lock().expect("apps lock");
        let mut kept: Vec<DbApp> = Vec::with_capacity(rows.len());
        for row in rows {
            let config = &row.config;
            let clash = if let Err(e) = check_app(config) {
                Some(format!("{e:#}"))
            } else if kept.iter().any(|k| k.config.id == config.id) {
                Some("an earlier row has this id".to_owned())
            } else if kept.iter().any(|k| k.config.key == config.key) {
                Some("an earlier row (by id) has this key".to_owned())
            } else {
                None
            };
            match clash {
                Some(why) => tracing::warn!(app = %config.id, why, "pusher app row left out"),
                None => kept.push(row),
            }
        }
        sources.database = kept;
        self.rebuild(&sources)
    }

    /// Make the table from the sources, keeping each unchanged app as it is (its rate limits
    /// run on) and each changed app's connection count. A database row whose id or key a
    /// configured app has is left out, with a warning. Returns how many rows are in force.
    fn rebuild(&self, sources: &Sources) -> usize {
        let before = self.current();
        let mut table = Table::default();
        let wanted = sources.configured.iter().map(|c| (c, true, false)).chain(
            sources
                .database
                .iter()
                .map(|r| (&r.config, r.enabled, true)),
        );
        let mut rows = 0;
        for (config, enabled, from_database) in wanted {
            if from_database {
                if table.by_id.contains_key(&config.id) || table.by_key.contains_key(&config.key) {
                    tracing::warn!(
                        app = %config.id,
                        "pusher app row left out: a configured app has its id or key; the configured app is served"
                    );
                    continue;
                }
                rows += 1;
            }
            let previous = before.by_id.get(&config.id);
            let app = match previous {
                Some(p) if p.config == *config && p.enabled == enabled => p.clone(),
                _ => {
                    let mut app = PusherApp::new(config.clone());
                    app.enabled = enabled;
                    if let Some(p) = previous {
                        app.connections = p.connections.clone();
                    }
                    Arc::new(app)
                }
            };
            table.by_key.insert(config.key.clone(), app.clone());
            table.by_id.insert(config.id.clone(), app);
        }
        *self.table.write().expect("apps lock") = Arc::new(table);
        rows
    }
}

/// Every app, by key and by id, and the settings they share.
pub struct Apps {
    /// The apps in force.
    pub registry: Arc<Registry>,
    /// Shared settings.
    pub settings: PusherConfig,
    /// Stream options of Pusher channels: the `pusher` namespace when configured (so Herald
    /// clients can reach the channels), else the namespace defaults.
    pub namespace: Arc<NamespaceConfig>,
    /// Stream options of cache channels: the namespace's, with at least one publication kept
    /// for at least `cache_ttl_s`.
    pub cache_namespace: Arc<NamespaceConfig>,
    /// Subscription counts pushed to subscribers, when some app enables them.
    pub counting: Option<Arc<Counting>>,
    /// The webhook sender, once started, when some app has webhooks.
    pub webhooks: Option<Arc<Webhooks>>,
    /// The cluster-wide subscription counts, once started, when some app is configured.
    pub census: Option<Arc<Census>>,
    /// Publications translated for Pusher clients, shared by the connections.
    pub frames: Arc<SharedFrames>,
}

impl PusherConfig {
    /// `[pusher]` (the raw config value) with the app of the `HERALD_PUSHER_APP_*` variables
    /// read through `env` added to `apps` (what a config reload hands to
    /// [`Apps::replace_configured`]).
    pub fn read(
        raw: Option<&serde_json::Value>,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<PusherConfig> {
        let mut settings: PusherConfig = match raw {
            Some(v) => serde_json::from_value(v.clone()).context("invalid [pusher] section")?,
            None => PusherConfig::default(),
        };
        if let Some(id) = env("HERALD_PUSHER_APP_ID") {
            let (Some(key), Some(secret)) = (
                env("HERALD_PUSHER_APP_KEY"),
                env("HERALD_PUSHER_APP_SECRET"),
            ) else {
                bail!(
                    "HERALD_PUSHER_APP_ID needs HERALD_PUSHER_APP_KEY and HERALD_PUSHER_APP_SECRET"
                );
            };
            let flag = env("HERALD_PUSHER_APP_ENABLE_CLIENT_EVENTS").unwrap_or_default();
            let max = env("HERALD_PUSHER_APP_MAX_CONNECTIONS").unwrap_or_default();
            let webhooks = env("HERALD_PUSHER_APP_WEBHOOK_URL")
                .filter(|u| !u.is_empty())
                .map(|url| WebhookConfig {
                    url,
                    ..WebhookConfig::default()
                })
                .into_iter()
                .collect();
            settings.apps.push(AppConfig {
                id,
                key,
                secret,
                enable_client_events: matches!(flag.as_str(), "true" | "1" | "yes"),
                max_connections: if max.is_empty() {
                    0
                } else {
                    max.parse()
                        .context("HERALD_PUSHER_APP_MAX_CONNECTIONS must be a number")?
                },
                webhooks,
                enable_subscription_count: matches!(
                    env("HERALD_PUSHER_APP_ENABLE_SUBSCRIPTION_COUNT").as_deref(),
                    Some("true" | "1" | "yes")
                ),
                enable_watchlist_events: matches!(
                    env("HERALD_PUSHER_APP_ENABLE_WATCHLIST_EVENTS").as_deref(),
                    Some("true" | "1" | "yes")
                ),
                ..AppConfig::default()
            });
        }
        if let Some(db) = &settings.postgres {
            db.check()?;
        }
        Ok(settings)
    }
}

impl Apps {
    /// Build from `[pusher]` (the raw config value) and `HERALD_PUSHER_APP_*` variables read
    /// through `env`.
    pub fn load(
        raw: Option<&serde_json::Value>,
        namespaces: &Namespaces,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Apps> {
        let settings = PusherConfig::read(raw, env)?;
        let registry = Arc::new(Registry::default());
        registry.replace_configured(settings.apps.clone())?;
        if settings.activity_timeout_s == 0 {
            bail!("pusher.activity_timeout_s must be at least 1");
        }
        let namespace = match namespaces.resolve(&format!("{NAMESPACE}:x")) {
            Ok(ns) => ns.clone(),
            Err(_) => Arc::new(NamespaceConfig {
                name: NAMESPACE.into(),
                ..NamespaceConfig::default()
            }),
        };
        let cache_namespace = Arc::new(NamespaceConfig {
            history: true,
            history_size: namespace.history_size.max(1),
            history_ttl_s: namespace.history_ttl_s.max(settings.cache_ttl_s),
            history_meta_ttl_s: namespace
                .history_meta_ttl_s
                .max(settings.cache_ttl_s.saturating_mul(2)),
            ..(*namespace).clone()
        });
        if settings.cache_ttl_s == 0 {
            bail!("pusher.cache_ttl_s must be at least 1");
        }
        Ok(Apps {
            registry,
            settings,
            namespace,
            cache_namespace,
            counting: None,
            webhooks: None,
            census: None,
            frames: Arc::default(),
        })
    }

    /// Replace the configured apps (a config reload): see [`Registry::replace_configured`].
    /// Open connections keep the app as it was when they connected, except that signatures
    /// (`pusher:signin`, private and presence subscriptions) are checked with the current secret.
    /// Webhooks, subscription counting and the census are started at start-up only: an app
    /// that enables them later, on a node that started with none, does not get them (the
    /// database's apps excepted: with `[pusher.postgres]` they are always started).
    pub fn replace_configured(&self, configured: Vec<AppConfig>) -> anyhow::Result<()> {
        self.registry.replace_configured(configured)
    }

    /// Start the node's Pusher tasks: sharing its subscription counts with the cluster, if any
    /// app is configured, and sending webhooks, if any app has some. With apps from a database,
    /// all of them (any row may need them later).
    pub fn start(&mut self, hub: &Hub) {
        let dynamic = self.settings.postgres.is_some();
        let apps = self.registry.all();
        if dynamic || !apps.is_empty() {
            self.census = Some(Census::start(hub.clone(), self.registry.clone()));
        }
        if dynamic || apps.iter().any(|a| !a.config.webhooks.is_empty()) {
            self.webhooks = Some(Webhooks::start(hub.clone(), self.census.clone()));
        }
        if let Some(census) = &self.census {
            if dynamic || apps.iter().any(|a| a.config.enable_subscription_count) {
                self.counting = Some(Counting::start(census.clone()));
            }
        }
    }

    /// Stream options of `channel` (a Pusher channel name): cache channels keep their last
    /// event for `cache_ttl_s`.
    pub fn namespace_for(&self, channel: &str) -> &Arc<NamespaceConfig> {
        match is_cache(channel) {
            true => &self.cache_namespace,
            false => &self.namespace,
        }
    }

    /// Stop sharing this node's subscription counts (at shutdown).
    pub async fn stop(&self) {
        if let Some(census) = &self.census {
            census.withdraw().await;
        }
    }

    /// The app with this key (enabled or not).
    pub fn by_key(&self, key: &str) -> Option<Arc<PusherApp>> {
        self.registry.by_key(key)
    }

    /// The app with this id (enabled or not).
    pub fn by_id(&self, id: &str) -> Option<Arc<PusherApp>> {
        self.registry.by_id(id)
    }

    /// Whether no app is in force and none can come (no database).
    pub fn is_empty(&self) -> bool {
        self.settings.postgres.is_none() && self.registry.all().is_empty()
    }

    /// The app ids, sorted (for the startup log; keys and secrets are never logged).
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .registry
            .all()
            .iter()
            .map(|a| a.config.id.clone())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// How long a client may stay silent before the server pings it.
    pub fn activity_timeout(&self) -> Duration {
        Duration::from_secs(self.settings.activity_timeout_s)
    }
}

/// The channel of events for one signed-in user (`sendToUser`): this prefix and the user id.
pub const USER_CHANNEL_PREFIX: &str = "#server-to-user-";

/// Pusher's channel alphabet `[A-Za-z0-9_\-=@,.;]`, 1 to 164 bytes; or a user's channel.
pub fn valid_channel(name: &str) -> bool {
    let rest = name.strip_prefix(USER_CHANNEL_PREFIX).unwrap_or(name);
    !rest.is_empty()
        && name.len() <= MAX_CHANNEL_LEN
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-=@,.;".contains(&b))
}

/// The prefixes of cache channels: the last event is kept and sent to each new subscriber.
pub const CACHE_PREFIXES: [&str; 4] = [
    "cache-",
    "private-cache-",
    "presence-cache-",
    "private-encrypted-cache-",
];

/// Whether `channel` is a cache channel.
pub fn is_cache(channel: &str) -> bool {
    CACHE_PREFIXES.iter().any(|p| channel.starts_with(p))
}

/// What a channel's name makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    /// Anyone may subscribe.
    Public,
    /// `private-` (and `private-encrypted-`): needs a signed authorization.
    Private,
    /// `presence-`: signed authorization with `channel_data`; members are tracked.
    Presence,
    /// `#server-to-user-ID`: only the connection signed in as user ID.
    User,
}

/// The prefix of end-to-end encrypted channels (a kind of private channel).
pub const ENCRYPTED_PREFIX: &str = "private-encrypted-";

impl ChannelKind {
    /// Whether `channel` is end-to-end encrypted: the server cannot encrypt what a client sends
    /// there, so client events on it are refused (as Pusher refuses them).
    pub fn encrypted(channel: &str) -> bool {
        channel.starts_with(ENCRYPTED_PREFIX)
    }

    /// The kind of `channel`.
    pub fn of(channel: &str) -> ChannelKind {
        if channel.starts_with(USER_CHANNEL_PREFIX) {
            ChannelKind::User
        } else if channel.starts_with("presence-") {
            ChannelKind::Presence
        } else if channel.starts_with("private-") {
            ChannelKind::Private
        } else {
            ChannelKind::Public
        }
    }
}

/// A limit: a number, or Soketi's `-1` (any negative number) for "no limit" (`None`).
fn limit<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    match Option::<i64>::deserialize(d)? {
        None => Ok(None),
        Some(n) if n < 0 => Ok(None),
        Some(n) => T::try_from(n as u64)
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{n} is too large"))),
    }
}

/// `max_connections`: Soketi's `-1` (any negative number) is 0, no limit.
fn no_limit_below_zero<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    Ok(limit::<D, usize>(d)?.unwrap_or(0))
}

/// App ids and keys written as numbers in TOML (`id = 12345`) are read as text.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Str(String),
        Num(serde_json::Number),
    }
    Ok(match Text::deserialize(d)? {
        Text::Str(s) => s,
        Text::Num(n) => n.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::Config;

    fn namespaces() -> Namespaces {
        Namespaces::from_config(&Config::default())
    }

    #[test]
    fn apps_from_config_and_env() {
        let raw = serde_json::json!({"apps": [{"id": 1, "key": "k1", "secret": "s1", "enable_client_events": true}]});
        let env = |k: &str| match k {
            "HERALD_PUSHER_APP_ID" => Some("two".to_owned()),
            "HERALD_PUSHER_APP_KEY" => Some("k2".to_owned()),
            "HERALD_PUSHER_APP_SECRET" => Some("s2".to_owned()),
            _ => None,
        };
        let apps = Apps::load(Some(&raw), &namespaces(), env).unwrap();
        let one = apps.by_key("k1").unwrap();
        assert_eq!(one.config.id, "1");
        assert!(one.config.enable_client_events);
        assert_eq!(one.internal("chat"), "pusher:1:chat");
        assert_eq!(one.external("pusher:1:chat"), Some("chat"));
        assert_eq!(one.external("pusher:10:chat"), None);
        assert_eq!(apps.by_id("two").unwrap().config.secret, "s2");
        assert_eq!(apps.namespace.history_size, 100);
    }

    #[test]
    fn soketi_names_are_read() {
        let raw = serde_json::json!({"apps": [{
            "id": "1", "key": "k", "secret": "s",
            "enable_client_messages": true,
            "max_client_events_per_second": 3,
            "max_event_payload_in_kb": 2,
            "max_presence_member_size_in_kb": 4,
            "max_event_name_length": 50,
        }]});
        let apps = Apps::load(Some(&raw), &namespaces(), |_| None).unwrap();
        let app = apps.by_id("1").unwrap();
        assert!(
            app.config.enable_client_events,
            "Soketi's enable_client_messages"
        );
        assert_eq!(app.config.max_client_events_per_second, Some(3));
        assert_eq!(app.max_event_bytes(10_240), 2048);
        assert_eq!(app.max_user_info_bytes(), 4096);
        assert_eq!(app.max_event_name_chars(), 50);
        assert_eq!(apps.namespace_for("cache-x").history_ttl_s, 1800);
        assert_eq!(apps.namespace_for("x").history_ttl_s, 300);
        let soketi_off = serde_json::json!({"apps": [{"id": "1", "key": "k", "secret": "s",
            "max_connections": -1, "max_backend_events_per_second": -1}]});
        let apps = Apps::load(Some(&soketi_off), &namespaces(), |_| None).unwrap();
        let app = apps.by_id("1").unwrap();
        assert_eq!(app.config.max_connections, 0, "-1: no limit");
        assert_eq!(app.config.max_backend_events_per_second, None);
        assert!(app.backend_events.is_none());
        let unknown =
            serde_json::json!({"apps": [{"id": "1", "key": "k", "secret": "s", "max_nothing": 1}]});
        assert!(Apps::load(Some(&unknown), &namespaces(), |_| None).is_err());
        let reserved = serde_json::json!({"apps": [{"id": "1", "key": "k", "secret": "s",
            "webhooks": [{"url": "http://x", "headers": {"x-pusher-key": "v"}}]}]});
        assert!(Apps::load(Some(&reserved), &namespaces(), |_| None).is_err());
    }

    #[test]
    fn bad_apps_are_refused() {
        let dup = serde_json::json!({"apps": [{"id": "a", "key": "k", "secret": "s"}, {"id": "b", "key": "k", "secret": "s"}]});
        assert!(Apps::load(Some(&dup), &namespaces(), |_| None).is_err());
        let colon = serde_json::json!({"apps": [{"id": "a:b", "key": "k", "secret": "s"}]});
        assert!(Apps::load(Some(&colon), &namespaces(), |_| None).is_err());
        let half = |k: &str| (k == "HERALD_PUSHER_APP_ID").then(|| "x".to_owned());
        assert!(Apps::load(None, &namespaces(), half).is_err());
    }

    fn app(id: &str, key: &str, secret: &str) -> AppConfig {
        AppConfig {
            id: id.into(),
            key: key.into(),
            secret: secret.into(),
            ..AppConfig::default()
        }
    }

    fn row(id: &str, key: &str, secret: &str, enabled: bool) -> DbApp {
        DbApp {
            config: app(id, key, secret),
            enabled,
        }
    }

    #[test]
    fn the_registry_merges_and_replaces_its_sources() {
        let registry = Registry::default();
        registry
            .replace_configured(vec![app("t", "tk", "ts")])
            .unwrap();
        let n = registry.replace_database(vec![
            row("b", "bk", "bs", true),
            row("a", "ak", "as", false),
            row("c", "tk", "cs", true), // the configured app's key: left out
            row("t", "xk", "xs", true), // the configured app's id: left out
            row("d", "bk", "ds", true), // b's key, a later id: left out
            row("e", "", "es", true),   // invalid: left out
        ]);
        assert_eq!(n, 2);
        assert_eq!(registry.by_key("tk").unwrap().config.secret, "ts");
        assert!(!registry.by_key("ak").unwrap().enabled);
        assert_eq!(registry.by_key("bk").unwrap().config.id, "b");
        assert!(registry.by_id("c").is_none() && registry.by_key("xk").is_none());

        // An unchanged app is kept as it is; a changed one keeps its connection count.
        let b = registry.by_id("b").unwrap();
        b.connections
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        registry.replace_database(vec![row("b", "bk", "bs", true)]);
        assert!(Arc::ptr_eq(&b, &registry.by_id("b").unwrap()));
        assert!(registry.by_id("a").is_none(), "a deleted row is gone");
        registry.replace_database(vec![row("b", "bk", "bs2", true)]);
        let b2 = registry.by_id("b").unwrap();
        assert_eq!(b2.config.secret, "bs2");
        assert_eq!(b2.connections.load(std::sync::atomic::Ordering::Relaxed), 3);

        // Configured apps replaced: a bad list changes nothing; a good one frees the key.
        let dup = vec![app("x", "k", "s"), app("y", "k", "s")];
        assert!(registry.replace_configured(dup).is_err());
        assert!(registry.by_id("t").is_some());
        registry.replace_database(vec![row("c", "tk", "cs", true)]);
        assert_eq!(
            registry.by_key("tk").unwrap().config.id,
            "t",
            "configured wins"
        );
        registry.replace_configured(Vec::new()).unwrap();
        assert_eq!(registry.by_key("tk").unwrap().config.id, "c");
    }

    #[test]
    fn channel_names_and_kinds() {
        assert!(valid_channel("private-chat.room;1"));
        assert!(!valid_channel("a b"));
        assert!(!valid_channel(""));
        assert!(!valid_channel(&"x".repeat(165)));
        assert_eq!(ChannelKind::of("presence-x"), ChannelKind::Presence);
        assert_eq!(ChannelKind::of("private-encrypted-x"), ChannelKind::Private);
        assert_eq!(ChannelKind::of("news"), ChannelKind::Public);
        assert!(valid_channel("#server-to-user-42"));
        assert!(!valid_channel("#server-to-user-"));
        assert!(!valid_channel("#other"));
        for cache in [
            "cache-x",
            "private-cache-x",
            "presence-cache-x",
            "private-encrypted-cache-x",
        ] {
            assert!(is_cache(cache), "{cache}");
        }
        assert!(!is_cache("news-cache-x") && !is_cache("private-x"));
        assert_eq!(ChannelKind::of("presence-cache-x"), ChannelKind::Presence);
        assert_eq!(ChannelKind::of("#server-to-user-42"), ChannelKind::User);
    }
}
