//! Configuration reload without a restart: `SIGHUP` or `POST /admin/api/reload`.
//!
//! A reload loads the whole configuration again with the start-up code ([`settings::load`]: the
//! file, `HERALD_*`, the same flags) and the same checks, then compares it key by key with the
//! configuration in force. Keys the running node can take are applied at once, together:
//! namespaces (`Namespaces::replace`), token keys and JWKS settings (`TokenVerifier::replace`),
//! hook URLs (a new [`HttpProxy`] behind the same [`ProxySlot`]), limits and the other settings
//! connections read from `ctx.config` (`LiveConfig::replace`). Keys that are
//! fixed once the node runs (the listening address, the broker, TLS files, …) keep their old
//! value and are named in the answer and the log line. A configuration that does not load or
//! check is refused as a whole: the old one stays in force.
//!
//! Connections stay open. What each setting changes for them is in docs/config.md
//! ("Reloading").

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use herald_core::auth::TokenVerifier;
use herald_core::config::Config;
use herald_core::proxy::{Proxy, ProxyError, Target};
use herald_core::NodeContext;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::jwks::Jwks;
use crate::proxy::HttpProxy;
use crate::settings::{self, Overrides};

/// Keys a running node cannot take, with why: a reload keeps their old value.
const FIXED: &[(&str, &str)] = &[
    ("bind", "the listening socket is bound at start-up"),
    ("port", "the listening socket is bound at start-up"),
    (
        "node_name",
        "the node's name in the cluster is set at start-up",
    ),
    ("dev", "development mode is decided at start-up"),
    ("demo", "the demo page is decided at start-up"),
    ("api_key", "the HTTP API key is read at start-up"),
    ("broker_url", "the broker is connected at start-up"),
    ("redis", "the broker is connected at start-up"),
    ("nats", "the broker is connected at start-up"),
    ("tls_cert", "the TLS acceptor is built at start-up"),
    ("tls_key", "the TLS acceptor is built at start-up"),
    ("log_format", "logging is set up at start-up"),
    ("log_level", "logging is set up at start-up (RUST_LOG too)"),
    (
        "limits.max_connections_per_ip",
        "the per-IP counters are built at start-up",
    ),
    (
        "limits.handshakes_per_ip_per_s",
        "the per-IP handshake rate is built at start-up",
    ),
    (
        "limits.handshake_burst_per_ip",
        "the per-IP handshake rate is built at start-up",
    ),
    (
        "limits.accept_queues",
        "the listening sockets are bound at start-up",
    ),
    (
        "limits.handshake_timeout_ms",
        "the accept loops take it at start-up",
    ),
    (
        "consumers",
        "consumers are started at start-up: restart the node",
    ),
    (
        "pusher",
        "Pusher settings other than `apps` are read at start-up: restart the node",
    ),
    ("admin", "the admin UI's settings are read at start-up"),
    ("tracing", "the trace exporter is started at start-up"),
    (
        "lifecycle",
        "the lifecycle stream is started at start-up: restart the node",
    ),
];

/// Sections compared key by key (a change names `section.key`); others as a whole.
const BY_KEY: &[&str] = &["limits", "proxy", "pusher"];

/// Why turning every hook on or off waits for a restart.
const PROXY_SWITCH: &str =
    "hooks can be changed but not turned on or off (all URLs empty or not) without a restart";

/// The loaded configuration's version, shown by the admin UI.
#[derive(Debug, Clone, Serialize)]
pub struct Version {
    /// 1 at start-up, one more for each applied reload.
    pub number: u64,
    /// The first 12 hex digits of the config file's SHA-256 (as `sha256sum` prints it); `None`
    /// without a file.
    pub file_sha256: Option<String>,
    /// When it was loaded, ms since the UNIX epoch.
    pub loaded_at_ms: u64,
}

/// A changed key left at its old value.
#[derive(Debug, Clone, Serialize)]
pub struct NotApplied {
    /// The key (`bind`, `limits.accept_queues`, …).
    pub key: String,
    /// Why.
    pub reason: &'static str,
}

/// What a reload did.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Changed keys now in force.
    pub applied: Vec<String>,
    /// Changed keys that keep their old value until a restart.
    pub not_applied: Vec<NotApplied>,
    /// The version now loaded.
    pub version: Version,
}

/// A reload that was refused: the old configuration stays in force.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// A check of the whole new configuration beyond [`settings::load`] (the consumers' and Pusher
/// sections), the same one start-up runs.
pub type Check = Box<dyn Fn(&Config) -> anyhow::Result<()> + Send + Sync>;

/// Replaces the configured Pusher apps with those of a new configuration (all or nothing); the
/// node hands one in when it serves the Pusher protocol.
pub type ApplyPusherApps = Box<dyn Fn(&Config) -> anyhow::Result<()> + Send + Sync>;

/// The hook client behind `ctx.proxy`, replaced by a reload that changes `[proxy]`.
pub struct ProxySlot(ArcSwap<HttpProxy>);

impl ProxySlot {
    /// The slot, holding `proxy`.
    pub fn new(proxy: HttpProxy) -> Self {
        ProxySlot(ArcSwap::from_pointee(proxy))
    }
}

#[async_trait::async_trait]
impl Proxy for ProxySlot {
    async fn call(&self, target: &Target<'_>, body: Vec<u8>) -> Result<Vec<u8>, ProxyError> {
        // A call in flight finishes with the client it started with.
        let proxy = self.0.load_full();
        proxy.call(target, body).await
    }
}

/// `herald_config_reloads_total{result="ok"|"refused"}`.
#[derive(Clone, Default)]
pub struct ReloadMetrics(Family<[(&'static str, &'static str); 1], Counter>);

impl ReloadMetrics {
    /// Register the counter.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ReloadMetrics::default();
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP or the admin call), by result.",
            m.0.clone(),
        );
        m
    }

    fn count(&self, result: &'static str) {
        self.0.get_or_create(&[("result", result)]).inc();
    }
}

/// The JWKS cache in use and the settings it was built with: an unchanged `token_jwks_*` keeps
/// the cache (and its keys) across a reload.
type JwksInUse = Option<((String, u64, u64), Arc<Jwks>)>;

/// What a reload replaces, and how to load the configuration again.
pub struct Reloader {
    flags: Overrides,
    ctx: Arc<NodeContext>,
    proxy: Option<Arc<ProxySlot>>,
    check: Check,
    pusher_apps: Option<ApplyPusherApps>,
    metrics: ReloadMetrics,
    /// The API key was generated for this run: a file without one does not change it.
    api_key_generated: bool,
    /// Held for the whole of a reload, so two never interleave.
    state: Mutex<State>,
}

struct State {
    version: Version,
    jwks: JwksInUse,
}

/// The JWKS cache for `config`, when it names a URL.
pub fn jwks_for(config: &Config) -> Result<Option<Arc<Jwks>>, String> {
    let Some(url) = config.token_jwks_url.as_ref().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    Jwks::new(
        url.clone(),
        Duration::from_secs(config.token_jwks_max_age_s),
        Duration::from_millis(config.token_jwks_min_refresh_ms),
    )
    .map(|j| Some(Arc::new(j)))
    .map_err(|e| e.to_string())
}

/// The token verifier for `config`, with `jwks` for keys named by `kid`.
pub fn verifier_for(config: &Config, jwks: Option<&Arc<Jwks>>) -> Result<TokenVerifier, String> {
    let verifier = TokenVerifier::from_config(config).map_err(|e| e.to_string())?;
    Ok(match jwks {
        Some(j) => verifier.with_key_set(j.clone()),
        None => verifier,
    })
}

fn jwks_settings(config: &Config) -> (String, u64, u64) {
    (
        config.token_jwks_url.clone().unwrap_or_default(),
        config.token_jwks_max_age_s,
        config.token_jwks_min_refresh_ms,
    )
}

/// Options of [`Reloader::new`] beyond the node's context.
pub struct Options {
    /// The flags the node was started with (read again on each reload).
    pub flags: Overrides,
    /// The hook client's slot, when hooks are on.
    pub proxy: Option<Arc<ProxySlot>>,
    /// The JWKS cache the node's verifier uses.
    pub jwks: Option<Arc<Jwks>>,
    /// Start-up's checks of the sections loaded elsewhere.
    pub check: Check,
    /// How `pusher.apps` is applied (none: kept until a restart).
    pub pusher_apps: Option<ApplyPusherApps>,
    /// The reload counter.
    pub metrics: ReloadMetrics,
    /// Whether the API key was generated for this run.
    pub api_key_generated: bool,
}

impl Reloader {
    /// A reloader for the node of `ctx`.
    pub fn new(ctx: Arc<NodeContext>, o: Options) -> Self {
        let jwks = o.jwks.map(|j| (jwks_settings(&ctx.config), j));
        let version = Version {
            number: 1,
            file_sha256: file_sha256(&o.flags),
            loaded_at_ms: now_ms(),
        };
        Reloader {
            flags: o.flags,
            ctx,
            proxy: o.proxy,
            check: o.check,
            pusher_apps: o.pusher_apps,
            metrics: o.metrics,
            api_key_generated: o.api_key_generated,
            state: Mutex::new(State { version, jwks }),
        }
    }

    /// The version in force.
    pub fn version(&self) -> Version {
        self.state.lock().expect("reload state").version.clone()
    }

    /// Load the configuration again and apply what changed; `trigger` says who asked (for the
    /// log line). Refused: the old configuration stays in force, and an `error` line says why.
    pub fn reload(&self, trigger: &'static str) -> Result<Outcome, Refused> {
        let mut state = self.state.lock().expect("reload state");
        match self.apply(&mut state) {
            Ok(outcome) => {
                self.metrics.count("ok");
                let not_applied: Vec<String> = outcome
                    .not_applied
                    .iter()
                    .map(|n| format!("{} ({})", n.key, n.reason))
                    .collect();
                tracing::info!(
                    trigger,
                    version = outcome.version.number,
                    file_sha256 = outcome.version.file_sha256.as_deref().unwrap_or("-"),
                    applied = ?outcome.applied,
                    not_applied = ?not_applied,
                    "configuration reloaded"
                );
                if !not_applied.is_empty() {
                    tracing::warn!(
                        trigger,
                        not_applied = ?not_applied,
                        "configuration reload: changed keys that need a restart keep their old value"
                    );
                }
                Ok(outcome)
            }
            Err(Refused(why)) => {
                self.metrics.count("refused");
                // Start-up's errors, with URL passwords hidden as at start-up.
                let why = herald_broker::redact_url(&why);
                tracing::error!(
                    trigger,
                    version = state.version.number,
                    cause = %why,
                    "configuration reload refused: the old configuration stays in force"
                );
                Err(Refused(why))
            }
        }
    }

    fn apply(&self, state: &mut State) -> Result<Outcome, Refused> {
        let old = self.ctx.config.get();
        let mut new = settings::load_keeping_name(&self.flags, &old.node_name)
            .map_err(|e| Refused(format!("{e:#}")))?;
        if self.api_key_generated && new.api_key.as_deref().unwrap_or("").is_empty() {
            new.api_key = old.api_key.clone();
        }
        (self.check)(&new).map_err(|e| Refused(format!("{e:#}")))?;

        let changed = changed_keys(old, &new);
        let hooks_switched = old.proxy.enabled() != new.proxy.enabled();
        let mut applied = Vec::new();
        let mut not_applied = Vec::new();
        for key in changed {
            let reason = if key == "pusher.apps" && self.pusher_apps.is_some() {
                None
            } else if hooks_switched && key.starts_with("proxy.") {
                Some(PROXY_SWITCH)
            } else {
                fixed_reason(&key)
            };
            match reason {
                Some(reason) => not_applied.push(NotApplied { key, reason }),
                None => applied.push(key),
            }
        }
        let effective = keep_old(old, new, &not_applied)?;
        effective.validate().map_err(|e| Refused(e.to_string()))?;

        // Everything is built before anything is replaced: a failure here changes nothing.
        let jwks = match &state.jwks {
            Some((settings, j)) if *settings == jwks_settings(&effective) => Some(j.clone()),
            _ => jwks_for(&effective).map_err(Refused)?,
        };
        let verifier = verifier_for(&effective, jwks.as_ref()).map_err(Refused)?;
        let proxy = match &self.proxy {
            Some(_) if applied.iter().any(|k| k.starts_with("proxy.")) => {
                Some(HttpProxy::new(&effective.proxy).map_err(|e| Refused(e.to_string()))?)
            }
            _ => None,
        };

        // The one replacement that can still fail goes first: refused, nothing has changed.
        if let Some(apply) = &self.pusher_apps {
            if applied.iter().any(|k| k == "pusher.apps") {
                apply(&effective).map_err(|e| Refused(format!("{e:#}")))?;
            }
        }
        self.ctx.namespaces.replace(&effective);
        self.ctx.verifier.replace(&verifier);
        if let (Some(slot), Some(proxy)) = (&self.proxy, proxy) {
            slot.0.store(Arc::new(proxy));
        }
        state.jwks = jwks.map(|j| (jwks_settings(&effective), j));
        self.ctx.config.replace(effective);
        state.version = Version {
            number: state.version.number + 1,
            file_sha256: file_sha256(&self.flags),
            loaded_at_ms: now_ms(),
        };
        Ok(Outcome {
            applied,
            not_applied,
            version: state.version.clone(),
        })
    }
}

/// Why `key` cannot change while the node runs, or `None` when it can.
fn fixed_reason(key: &str) -> Option<&'static str> {
    FIXED
        .iter()
        .find(|(k, _)| *k == key || key.strip_prefix(k).is_some_and(|r| r.starts_with('.')))
        .map(|(_, why)| *why)
}

/// The keys whose values differ: `section.key` inside [`BY_KEY`] sections, the top-level key
/// elsewhere. Values are compared, never shown (some are secrets).
fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    let (old, new) = (as_object(old), as_object(new));
    let mut changed = Vec::new();
    for (key, value) in &new {
        let before = old.get(key).unwrap_or(&Value::Null);
        if before == value {
            continue;
        }
        match (BY_KEY.contains(&key.as_str()), before, value) {
            (true, Value::Object(a), Value::Object(b)) => {
                for (sub, v) in b {
                    if a.get(sub) != Some(v) {
                        changed.push(format!("{key}.{sub}"));
                    }
                }
                // A key the new section no longer has (`[pusher]` is kept as written).
                for sub in a.keys().filter(|sub| !b.contains_key(*sub)) {
                    changed.push(format!("{key}.{sub}"));
                }
            }
            _ => changed.push(key.clone()),
        }
    }
    changed
}

fn as_object(config: &Config) -> Map<String, Value> {
    match serde_json::to_value(config) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// `new` with the keys of `keep` set back to their value in `old`.
fn keep_old(old: &Config, new: Config, keep: &[NotApplied]) -> Result<Config, Refused> {
    if keep.is_empty() {
        return Ok(new);
    }
    let old = as_object(old);
    let mut merged = as_object(&new);
    for NotApplied { key, .. } in keep {
        let (top, sub) = match key.split_once('.') {
            Some((t, s)) => (t, Some(s)),
            None => (key.as_str(), None),
        };
        let before = old.get(top).cloned().unwrap_or(Value::Null);
        match (sub, merged.get_mut(top), &before) {
            (Some(sub), Some(Value::Object(section)), Value::Object(b)) => match b.get(sub) {
                Some(v) => {
                    section.insert(sub.to_owned(), v.clone());
                }
                // Absent before (a `[pusher]` key written for the first time): absent again.
                None => {
                    section.remove(sub);
                }
            },
            _ => {
                merged.insert(top.to_owned(), before);
            }
        }
    }
    serde_json::from_value(Value::Object(merged))
        .map_err(|e| Refused(format!("merging the kept keys: {e}")))
}

/// The first 12 hex digits of the config file's SHA-256.
fn file_sha256(flags: &Overrides) -> Option<String> {
    let bytes = std::fs::read(flags.config.as_ref()?).ok()?;
    Some(hex::encode(Sha256::digest(bytes))[..12].to_owned())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_named_by_key_and_fixed_ones_kept() {
        let old = Config::default();
        let mut new = Config {
            port: 9999,
            token_hmac_secret: Some("new secret".into()),
            ..Config::default()
        };
        new.limits.max_frame_bytes = 77;
        new.limits.accept_queues = 3;
        new.namespaces.push(herald_core::config::NamespaceConfig {
            name: "room".into(),
            ..Default::default()
        });
        let mut changed = changed_keys(&old, &new);
        changed.sort();
        assert_eq!(
            changed,
            [
                "limits.accept_queues",
                "limits.max_frame_bytes",
                "namespaces",
                "port",
                "token_hmac_secret",
            ]
        );
        let keep: Vec<NotApplied> = changed
            .iter()
            .filter_map(|k| {
                fixed_reason(k).map(|reason| NotApplied {
                    key: k.clone(),
                    reason,
                })
            })
            .collect();
        let kept: Vec<&str> = keep.iter().map(|n| n.key.as_str()).collect();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept.contains(&"port") && kept.contains(&"limits.accept_queues"));
        let merged = keep_old(&old, new, &keep).expect("merges");
        assert_eq!(merged.port, old.port);
        assert_eq!(merged.limits.accept_queues, old.limits.accept_queues);
        assert_eq!(merged.limits.max_frame_bytes, 77);
        assert_eq!(merged.token_hmac_secret.as_deref(), Some("new secret"));
        assert_eq!(merged.namespaces.len(), 1);
    }

    #[test]
    fn a_fixed_section_covers_its_keys_only() {
        assert!(fixed_reason("consumers").is_some());
        assert!(fixed_reason("consumers.outbox").is_some());
        assert!(fixed_reason("limits.max_frame_bytes").is_none());
        assert!(
            fixed_reason("portal").is_none(),
            "a prefix is not a section"
        );
    }
}
