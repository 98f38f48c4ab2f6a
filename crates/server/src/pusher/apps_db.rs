//! Pusher apps read from a PostgreSQL table (`[pusher.postgres]`), as Soketi's and Sockudo's
//! PostgreSQL app managers read theirs, so that a hosting team adds, changes, disables or
//! removes an app without restarting a node.
//!
//! - The table is Soketi's: one row per app, its columns named as `[[pusher.apps]]` keys
//!   (`id`, `key`, `secret`, `enable_client_messages`, `max_connections`, `webhooks` as JSON, the
//!   `max_*` limits; NULL: the default), plus `enabled` (NULL or absent: enabled). Each row is
//!   read whole with `row_to_json`, so any column types that convert to JSON do (text or
//!   numbers for ids, integers or whole floats for limits, `json`/`jsonb` or JSON text for
//!   `webhooks`). Columns Herald does not read are named in one warning whenever the set
//!   changes, and left alone.
//! - Polled, not notified: the whole table is read every `refresh_ms` (one small `SELECT`; a
//!   node serves from memory, never from the database). Polling needs nothing but `SELECT` on
//!   the table (no trigger to install in a Soketi-shaped schema), and the same loop recovers
//!   from an outage. A change is in force on each node within `refresh_ms` plus the query.
//! - When the rows are unchanged nothing happens; when they changed, the database's apps are
//!   replaced whole ([`Registry::replace_database`]): unchanged apps stay as they are.
//! - The database down, at start-up or later: the apps last read stay in force (at start-up:
//!   none from the database; the configured apps are served), an error is logged (once, then
//!   once a minute while it lasts, and a line when reading works again), and the metrics say
//!   so (`herald_pusher_apps_db_up`, `herald_pusher_apps_db_failures_total`). The URL is never
//!   logged (it may hold a password), nor any secret.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry as MetricsRegistry;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, NoTls};

use super::apps::{AppConfig, DbApp, Registry};
use crate::consumers::postgres::tls;

/// Shortest refresh interval.
const MIN_REFRESH: Duration = Duration::from_millis(100);
/// Longest wait for a connection and one read of the table.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A failure that lasts is logged again this often.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The columns Herald reads: the `[[pusher.apps]]` keys, Soketi's `enable_client_messages`,
/// and `enabled`.
const COLUMNS: [&str; 19] = [
    "id",
    "key",
    "secret",
    "enabled",
    "enable_client_events",
    "enable_client_messages",
    "enable_subscription_count",
    "enable_watchlist_events",
    "max_connections",
    "max_client_events_per_second",
    "max_backend_events_per_second",
    "max_read_requests_per_second",
    "max_event_name_length",
    "max_event_payload_in_kb",
    "max_event_channels_at_once",
    "max_event_batch_size",
    "max_presence_members_per_channel",
    "max_presence_member_size_in_kb",
    "webhooks",
];

/// `[pusher.postgres]`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppsDbConfig {
    /// Connection string: `postgres://user:pass@host/db` or `host=… user=… dbname=…`;
    /// `sslmode=require` for TLS. Never logged.
    pub url: String,
    /// The apps table, optionally schema-qualified (`hosting.apps`); lower-case identifiers.
    #[serde(default = "default_table")]
    pub table: String,
    /// How often the table is read, in milliseconds (at least 100).
    #[serde(default = "default_refresh_ms")]
    pub refresh_ms: u64,
    /// PEM file of the CA certificates that verify the server (TLS); default: the Mozilla roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

fn default_table() -> String {
    "apps".into()
}

fn default_refresh_ms() -> u64 {
    5000
}

/// Without the URL: it may hold a password.
impl fmt::Debug for AppsDbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppsDbConfig")
            .field("url", &"<redacted>")
            .field("table", &self.table)
            .field("refresh_ms", &self.refresh_ms)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl PartialEq for AppsDbConfig {
    fn eq(&self, other: &Self) -> bool {
        (&self.url, &self.table, self.refresh_ms, &self.ca_file)
            == (&other.url, &other.table, other.refresh_ms, &other.ca_file)
    }
}

impl AppsDbConfig {
    /// Refuse what cannot work, at start-up.
    pub fn check(&self) -> anyhow::Result<()> {
        // tokio-postgres's parse errors name the option, never its value.
        tokio_postgres::Config::from_str(&self.url)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("pusher.postgres.url is not a PostgreSQL connection string")?;
        quoted_table(&self.table)?;
        if self.refresh_ms < MIN_REFRESH.as_millis() as u64 || self.refresh_ms > 3_600_000 {
            bail!("pusher.postgres.refresh_ms must be 100 to 3600000");
        }
        Ok(())
    }
}

/// `table` or `schema.table` (lower-case identifiers), double-quoted for the query.
fn quoted_table(table: &str) -> anyhow::Result<String> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|p| ident(p)) {
        bail!("pusher.postgres.table {table:?}: a lower-case identifier, optionally schema.table");
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// The metrics of the apps table (`herald_pusher_apps_db_*`).
#[derive(Clone, Default)]
pub struct DbMetrics {
    /// 1 while the last read of the table worked, else 0.
    pub up: Gauge,
    /// Reads of the table that failed.
    pub failures: Counter,
    /// Apps from the table in force.
    pub apps: Gauge,
}

impl DbMetrics {
    /// Registered under `pusher_apps_db`.
    pub fn register(registry: &mut MetricsRegistry) -> DbMetrics {
        let m = DbMetrics::default();
        let r = registry.sub_registry_with_prefix("pusher_apps_db");
        r.register(
            "up",
            "1 while the last read of the Pusher apps table worked, else 0",
            m.up.clone(),
        );
        r.register(
            "failures",
            "Reads of the Pusher apps table that failed (the apps last read stay in force)",
            m.failures.clone(),
        );
        r.register(
            "apps",
            "Pusher apps from the apps table in force on this node",
            m.apps.clone(),
        );
        m
    }
}

/// Reads the table and replaces the database's apps when the rows changed.
pub struct Poller {
    registry: Arc<Registry>,
    pg: tokio_postgres::Config,
    tls: Option<tls::MakeRustls>,
    query: String,
    refresh: Duration,
    metrics: DbMetrics,
    client: Option<(Client, JoinHandle<()>)>,
    /// The rows last read, as JSON text, sorted.
    last: Option<Vec<String>>,
    /// The columns not read, as last warned about.
    unread: BTreeSet<String>,
    /// Since when reading fails, and when that was last logged.
    failing: Option<Instant>,
    logged: Option<Instant>,
}

impl Poller {
    /// Set up from a checked config.
    pub fn new(
        registry: Arc<Registry>,
        config: &AppsDbConfig,
        metrics: DbMetrics,
        node_name: &str,
    ) -> anyhow::Result<Poller> {
        let mut pg = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("pusher.postgres.url")?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        if pg.get_application_name().is_none() {
            pg.application_name(format!("herald {node_name} pusher apps"));
        }
        pg.keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        let tls = match pg.get_ssl_mode() {
            SslMode::Require => Some(tls::MakeRustls(
                tls::client_config(config.ca_file.as_deref()).context("pusher.postgres TLS")?,
            )),
            _ => None,
        };
        Ok(Poller {
            registry,
            pg,
            tls,
            query: format!(
                "SELECT row_to_json(t)::text FROM {} AS t",
                quoted_table(&config.table)?
            ),
            refresh: Duration::from_millis(config.refresh_ms),
            metrics,
            client: None,
            last: None,
            unread: BTreeSet::new(),
            failing: None,
            logged: None,
        })
    }

    /// Read the table every `refresh_ms`, forever.
    pub fn spawn(mut self) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(self.refresh).await;
                self.refresh().await;
            }
        })
    }

    /// One read: replace the database's apps if the rows changed; on failure keep them.
    pub async fn refresh(&mut self) {
        match tokio::time::timeout(READ_TIMEOUT, self.read()).await {
            Ok(Ok(mut rows)) => {
                self.metrics.up.set(1);
                if let Some(since) = self.failing.take() {
                    tracing::info!(
                        after_s = since.elapsed().as_secs(),
                        "pusher apps table read again"
                    );
                    self.logged = None;
                }
                rows.sort_unstable();
                if self.last.as_ref() != Some(&rows) {
                    let apps = self.parse(&rows);
                    let n = self.registry.replace_database(apps);
                    self.metrics.apps.set(n as i64);
                    tracing::info!(apps = n, rows = rows.len(), "pusher apps from PostgreSQL");
                    self.last = Some(rows);
                }
            }
            failed => {
                let cause = match failed {
                    Ok(Err(e)) => describe(&e),
                    _ => format!("no answer within {} s", READ_TIMEOUT.as_secs()),
                };
                self.client = None;
                self.metrics.up.set(0);
                self.metrics.failures.inc();
                let now = Instant::now();
                self.failing.get_or_insert(now);
                if self
                    .logged
                    .is_none_or(|t| now.duration_since(t) >= FAILURE_LOG_EVERY)
                {
                    self.logged = Some(now);
                    tracing::error!(
                        cause,
                        in_force = self.last.as_ref().map_or(0, Vec::len),
                        "pusher apps table not read: the apps last read stay in force (tried again every refresh_ms)"
                    );
                }
            }
        }
    }

    async fn read(&mut self) -> Result<Vec<String>, tokio_postgres::Error> {
        if self.client.is_none() {
            self.client = Some(self.connect().await?);
        }
        let (client, _) = self.client.as_ref().expect("connected");
        let rows = client.query(self.query.as_str(), &[]).await?;
        rows.iter().map(|r| r.try_get::<_, String>(0)).collect()
    }

    async fn connect(&self) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        // The connection's task ends with the connection, or is aborted with the client.
        Ok(match &self.tls {
            None => {
                let (client, conn) = self.pg.connect(NoTls).await?;
                (client, tokio::spawn(async move { drop(conn.await) }))
            }
            Some(tls) => {
                let (client, conn) = self.pg.connect(tls.clone()).await?;
                (client, tokio::spawn(async move { drop(conn.await) }))
            }
        })
    }

    /// The rows as apps; a row that is not an app is left out with a warning naming its id.
    fn parse(&mut self, rows: &[String]) -> Vec<DbApp> {
        let mut unread = BTreeSet::new();
        let mut apps = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            match row_app(row, &mut unread) {
                Ok(app) => apps.push(app),
                Err((id, why)) => {
                    tracing::warn!(
                        app = id.as_deref().unwrap_or("?"),
                        row = i,
                        why,
                        "pusher app row left out"
                    )
                }
            }
        }
        if !unread.is_empty() && unread != self.unread {
            tracing::warn!(columns = ?unread, "pusher apps table: columns Herald does not read (left alone)");
        }
        self.unread = unread;
        apps
    }
}

/// One row (`row_to_json`) as an app; the columns not read go to `unread`. The error names the
/// row's id when it has one, never a value.
pub fn row_app(
    row: &str,
    unread: &mut BTreeSet<String>,
) -> Result<DbApp, (Option<String>, String)> {
    let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(row) else {
        return Err((None, "not a JSON object".into()));
    };
    let id = match map.get("id") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let fail = |why: String| (id.clone(), why);
    let enabled = match map.remove("enabled") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        // MySQL-style tinyint, as Soketi's tables sometimes have.
        Some(Value::Number(n)) if n.as_i64().is_some() => n.as_i64() != Some(0),
        Some(_) => return Err(fail("enabled must be a boolean".into())),
    };
    // Both spellings of the client-events flag as columns: either one true enables them (serde
    // would refuse the alias twice).
    if let (Some(a), Some(b)) = (
        map.get("enable_client_events"),
        map.get("enable_client_messages"),
    ) {
        let on = a == &Value::Bool(true) || b == &Value::Bool(true);
        map.remove("enable_client_messages");
        map.insert("enable_client_events".into(), Value::Bool(on));
    }
    let mut fields = Map::new();
    for (column, value) in std::mem::take(&mut map) {
        if !COLUMNS.contains(&column.as_str()) {
            unread.insert(column);
            continue;
        }
        let value = match value {
            // NULL: the default.
            Value::Null => continue,
            // A whole float (a `double precision` limit) is the integer.
            Value::Number(n) if n.as_i64().is_none() && n.as_u64().is_none() => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9e15 => Value::from(f as i64),
                _ => return Err(fail(format!("{column} must be a whole number"))),
            },
            // `webhooks` stored as JSON text.
            Value::String(s) if column == "webhooks" => serde_json::from_str(&s)
                .map_err(|_| fail("webhooks is text but not JSON".into()))?,
            v => v,
        };
        fields.insert(column, value);
    }
    // Errors of serde name a column and a type; the secret column is text, so its value is
    // never in one.
    let config: AppConfig = serde_json::from_value(Value::Object(fields))
        .map_err(|e| fail(format!("not an app: {e}")))?;
    Ok(DbApp { config, enabled })
}

/// A PostgreSQL error with the server's message (`db error` alone says nothing).
fn describe(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soketi_rows_are_apps() {
        let mut unread = BTreeSet::new();
        let row = r#"{"id": 12, "key": "k", "secret": "s", "enabled": null,
            "enable_client_messages": true, "max_connections": -1, "max_event_payload_in_kb": 4.0,
            "max_presence_member_size_in_kb": null, "max_channel_name_length": 200,
            "webhooks": "[{\"url\": \"http://hooks.example/p\", \"event_types\": [\"channel_occupied\"]}]",
            "created_at": "2026-01-01"}"#;
        let app = row_app(row, &mut unread).unwrap();
        assert!(app.enabled);
        assert_eq!(app.config.id, "12");
        assert!(app.config.enable_client_events);
        assert_eq!(app.config.max_connections, 0);
        assert_eq!(app.config.max_event_payload_in_kb, Some(4));
        assert_eq!(app.config.max_presence_member_size_in_kb, None);
        assert_eq!(app.config.webhooks[0].url, "http://hooks.example/p");
        assert_eq!(
            unread.into_iter().collect::<Vec<_>>(),
            ["created_at", "max_channel_name_length"]
        );
    }

    #[test]
    fn every_column_is_read() {
        let mut row = serde_json::json!({"id": "a", "key": "k", "secret": "s", "enabled": false,
            "webhooks": [], "enable_client_events": true, "enable_client_messages": true,
            "enable_subscription_count": true, "enable_watchlist_events": true});
        for c in COLUMNS.iter().filter(|c| c.starts_with("max_")) {
            row[c] = 3.into();
        }
        let mut unread = BTreeSet::new();
        let app = row_app(&row.to_string(), &mut unread).unwrap();
        assert!(unread.is_empty() && !app.enabled);
        assert!(app.config.enable_watchlist_events);
        assert_eq!(app.config.max_read_requests_per_second, Some(3));
    }

    #[test]
    fn bad_rows_are_refused_without_their_values() {
        let mut unread = BTreeSet::new();
        let (id, why) = row_app(
            r#"{"id": "a", "key": "k", "secret": "s", "max_connections": "lots"}"#,
            &mut unread,
        )
        .unwrap_err();
        assert_eq!(id.as_deref(), Some("a"));
        assert!(why.contains("not an app"), "{why}");
        let (_, why) = row_app(
            r#"{"id": "a", "key": "k", "secret": "hunter2", "enabled": "yes"}"#,
            &mut unread,
        )
        .unwrap_err();
        assert!(!why.contains("hunter2"), "{why}");
        assert!(row_app(
            r#"{"id": "a", "key": "k", "max_connections": 1.5}"#,
            &mut unread
        )
        .is_err());
    }

    #[test]
    fn config_is_checked_and_never_shows_the_url() {
        let config: AppsDbConfig = serde_json::from_value(
            serde_json::json!({"url": "postgres://u:hunter2@db/x", "table": "hosting.apps"}),
        )
        .unwrap();
        config.check().unwrap();
        assert_eq!(config.refresh_ms, 5000);
        assert!(!format!("{config:?}").contains("hunter2"));
        assert_eq!(
            quoted_table("hosting.apps").unwrap(),
            "\"hosting\".\"apps\""
        );
        for bad in ["Apps", "a;b", "a.b.c", "", "1apps"] {
            assert!(quoted_table(bad).is_err(), "{bad}");
        }
        let fast = AppsDbConfig {
            refresh_ms: 10,
            ..config.clone()
        };
        assert!(fast.check().is_err());
        let typo = serde_json::json!({"url": "x", "refresh": 1});
        assert!(serde_json::from_value::<AppsDbConfig>(typo).is_err());
        let bad_url = AppsDbConfig {
            url: "host=db port=notaport password=hunter2".into(),
            ..config
        };
        let e = format!("{:#}", bad_url.check().unwrap_err());
        assert!(
            !e.contains("hunter2") && e.contains("not a PostgreSQL connection string"),
            "{e}"
        );
    }
}
