//! The PostgreSQL transactional-outbox consumer.
//!
//! The application inserts `(method, payload, partition)` rows into an outbox table inside its
//! own transaction; this module publishes them and deletes them. docs/consumers.md has the DDL
//! ([`ddl`] prints the same text), the config and the delivery argument; in short:
//!
//! - Work is cut into partitions. A batch of a partition is one transaction that first takes the
//!   partition's transaction-level advisory lock (`pg_try_advisory_xact_lock`), so at most one
//!   transaction of any node handles a partition at a time, then takes the partition's oldest
//!   rows `FOR UPDATE SKIP LOCKED` in id order, publishes them one after another, and deletes
//!   the published ones before it commits. Order within a partition therefore holds across nodes.
//! - Each publication carries the idempotency key `outbox:<table>:<id>` (or the payload's own
//!   key). A batch that dies after publishing and before committing is rolled back; its rows are
//!   taken again and the broker recognises their keys, so subscribers get each row once.
//! - A row that cannot be published (bad JSON shape, unknown method, refused channel) is moved
//!   to `<table>_dead` with the error in the same transaction; a retryable failure (broker down)
//!   ends the batch at that row, which is tried again with backoff, the rows behind it waiting.
//! - `LISTEN` on the table's channel (an insert trigger notifies the row's partition) wakes the
//!   workers at once; they also poll every `poll_interval_ms`. Lost connections are reopened
//!   with backoff.
//! - A row whose payload is over the HTTP API's body limit for its method
//!   ([`publishing::max_body_bytes`]) is dead-lettered without being read into memory.
//! - A statement PostgreSQL refuses for want of a privilege is logged with the privileges the
//!   role lacks ([`privileges`]), once a minute, not as a lost connection.
//! - Connections are plain, or TLS (rustls, the server's certificate verified) when the DSN
//!   says `sslmode=require`.

mod privileges;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use herald_broker::Backoff;
use herald_core::metrics::{consumer_labels, ConsumerLabels};
use herald_core::NodeContext;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::config::SslMode;
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls, Socket, Statement};

use super::batch;
use crate::centrifugo::command::{action, decode};
use crate::publishing;

/// The `kind` label of this consumer's metrics.
const KIND: &str = "postgres";
/// First wait after a failure (connection or retryable publish); doubled up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between two tries.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Default number of worker connections per consumer (fewer when there are fewer partitions).
const DEFAULT_CONNECTIONS: u32 = 4;
/// Failed channels named in a dead-letter row's error.
const MAX_LISTED_FAILURES: usize = 10;
/// Lag is measured this often at most (a `count(*)` over the table).
const LAG_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// The same failure is logged again only after this long (workers retry it every few seconds).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// One `[consumers.postgres.NAME]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConsumerConfig {
    /// Connection string: `host=… user=… dbname=…` or `postgres://user:pass@host/db`
    /// (without TLS).
    pub dsn: String,
    /// The outbox table, optionally schema-qualified (`app.outbox`); lower-case identifiers.
    pub table: String,
    /// Partitions `0..partitions`: rows of one partition are published in id order; different
    /// partitions are drained in parallel. Must be the same on every node.
    pub partitions: u32,
    /// Rows taken per transaction.
    pub batch_size: u32,
    /// Workers also look for rows this often, should a notification be missed.
    pub poll_interval_ms: u64,
    /// Create the table, the dead-letter table and the notify trigger at start when missing.
    pub create_table: bool,
    /// Worker connections on this node (0: one per partition, at most 4).
    pub connections: u32,
    /// PEM certificates to verify the server's TLS certificate with (default: the Mozilla
    /// roots). TLS is used when the DSN says `sslmode=require`.
    pub ca_file: Option<PathBuf>,
}

impl Default for PostgresConsumerConfig {
    fn default() -> Self {
        PostgresConsumerConfig {
            dsn: String::new(),
            table: "herald_outbox".into(),
            partitions: 1,
            batch_size: 100,
            poll_interval_ms: 1000,
            create_table: false,
            connections: 0,
            ca_file: None,
        }
    }
}

impl PostgresConsumerConfig {
    /// Check what serde cannot (the DSN's syntax, the table name, the numbers).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.dsn.trim().is_empty() {
            bail!("dsn is required");
        }
        // The DSN may hold a password: the parser's message only, never the text.
        tokio_postgres::Config::from_str(&self.dsn).context("dsn does not parse")?;
        if let Some(ca) = &self.ca_file {
            tls::client_config(Some(ca))?;
        }
        TableNames::new(&self.table)?;
        if !(1..=4096).contains(&self.partitions) {
            bail!("partitions must be within 1–4096");
        }
        if self.batch_size == 0 {
            bail!("batch_size must be at least 1");
        }
        if self.poll_interval_ms < 10 {
            bail!("poll_interval_ms must be at least 10");
        }
        Ok(())
    }

    fn worker_count(&self) -> u32 {
        let wanted = match self.connections {
            0 => DEFAULT_CONNECTIONS,
            n => n,
        };
        wanted.min(self.partitions).max(1)
    }
}

/// The SQL names derived from the table's name.
#[derive(Debug, Clone)]
struct TableNames {
    /// The table as configured (`outbox` or `app.outbox`).
    table: String,
    /// `<table>_dead`.
    dead: String,
    /// `<table>_notify`, the trigger function.
    function: String,
    /// `<name>_notify`, the trigger (trigger names take no schema).
    trigger: String,
    /// `<name>_partition_id`, the index (index names take no schema).
    index: String,
}

impl TableNames {
    fn new(table: &str) -> anyhow::Result<TableNames> {
        let ident = |s: &str| {
            let mut bytes = s.bytes();
            bytes
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
                && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, table),
        };
        // 63 bytes is PostgreSQL's identifier limit; the longest derived name adds 13.
        if !ident(name) || !schema.is_none_or(ident) || name.len() > 50 || table.len() > 100 {
            bail!(
                "table {table:?}: lower-case letters, digits and _ (at most 50), optionally \
                 after a schema and a dot"
            );
        }
        Ok(TableNames {
            table: table.to_owned(),
            dead: format!("{table}_dead"),
            function: format!("{table}_notify"),
            trigger: format!("{name}_notify"),
            index: format!("{name}_partition_id"),
        })
    }
}

/// The DDL of an outbox table, its dead-letter table and its notify trigger: what
/// `create_table = true` runs, and what docs/consumers.md shows for `herald_outbox`.
pub fn ddl(table: &str) -> anyhow::Result<String> {
    let n = TableNames::new(table)?;
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    id         bigserial PRIMARY KEY,
    method     text NOT NULL,
    payload    jsonb NOT NULL,
    partition  int NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (partition, id);
CREATE TABLE IF NOT EXISTS {dead} (
    id         bigint PRIMARY KEY,
    method     text,
    payload    jsonb,
    partition  int,
    created_at timestamptz,
    failed_at  timestamptz NOT NULL DEFAULT now(),
    error      text NOT NULL
);
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{table}', NEW.partition::text);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} AFTER INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
",
        table = n.table,
        index = n.index,
        dead = n.dead,
        function = n.function,
        trigger = n.trigger,
    ))
}

/// What the workers and the listener of one consumer share.
struct Shared {
    ctx: Arc<NodeContext>,
    name: String,
    config: PostgresConsumerConfig,
    pg: tokio_postgres::Config,
    /// Set when the DSN says `sslmode=require`.
    tls: Option<tls::MakeRustls>,
    names: TableNames,
    /// The first key of the partitions' advisory locks, `hashtext(lock_space)` in SQL; the
    /// partition is the second.
    lock_space: String,
    labels: ConsumerLabels,
    /// One per worker: rows may be waiting in one of its partitions.
    wake: Vec<Notify>,
    stop: watch::Receiver<bool>,
    /// Payloads longer than this are not read (`NULL` and their length instead): the largest
    /// body the API takes for any method, so a row over its own method's limit is known by its
    /// length without loading megabytes.
    payload_cap: i32,
    /// When each failure was last logged (see [`Shared::report`]).
    logged: Mutex<HashMap<String, Instant>>,
}

/// A failed statement or connection of a worker or the listener, as it is reported.
enum Failure {
    /// No connection could be made (or its statements prepared): tried again.
    Unreachable(String),
    /// The connection failed or closed: it is opened again.
    Lost(String),
    /// PostgreSQL refused a statement and the connection works (a missing table, say); with
    /// `denied`, for want of a privilege, and the text names the missing ones.
    Refused { denied: bool, text: String },
}

impl Shared {
    fn wake_all(&self) {
        for w in &self.wake {
            w.notify_one();
        }
    }

    /// A notification's payload is the row's partition; anything else wakes every worker.
    fn wake_partition(&self, payload: &str) {
        match payload.trim().parse::<u32>() {
            Ok(p) if p < self.config.partitions => {
                self.wake[p as usize % self.wake.len()].notify_one()
            }
            _ => self.wake_all(),
        }
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// What `e`, met on `client`, means; a refused privilege is looked up on `client`.
    async fn failure(&self, client: &Client, e: &tokio_postgres::Error) -> Failure {
        let Some(db) = e.as_db_error() else {
            return Failure::Lost(describe(e));
        };
        // Class 08 (connection exception) and 57 (operator intervention: shutdown, cancel)
        // end the session, whatever the server said.
        let class = &db.code().code()[..2];
        if e.is_closed() || class == "08" || class == "57" {
            return Failure::Lost(describe(e));
        }
        if privileges::is_denied(e) {
            let text = privileges::explain(client, &self.names, db).await;
            return Failure::Refused { denied: true, text };
        }
        let text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        Failure::Refused {
            denied: false,
            text,
        }
    }

    /// Log a failure of the `who` (worker or listener). The same one is logged at most once per
    /// [`FAILURE_LOG_EVERY`] by all of the consumer's connections together, and at debug level
    /// in between: a refused privilege would otherwise fill the log every few seconds per
    /// worker until someone grants it.
    fn report(&self, who: &str, failure: &Failure) {
        let (key, cause) = match failure {
            Failure::Unreachable(c) => (format!("{who} unreachable {c}"), c),
            Failure::Lost(c) => (format!("{who} lost {c}"), c),
            Failure::Refused { text, .. } => (format!("{who} refused {text}"), text),
        };
        let fresh = {
            let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
            logged.retain(|_, at| at.elapsed() < FAILURE_LOG_EVERY);
            let fresh = !logged.contains_key(&key);
            if fresh {
                logged.insert(key, Instant::now());
            }
            fresh
        };
        let name = &self.name;
        match (failure, fresh) {
            (_, false) => {
                tracing::debug!(consumer = %name, cause = %cause, "outbox {who} failed again")
            }
            (Failure::Unreachable(_), true) => {
                tracing::warn!(consumer = %name, cause = %cause, "outbox {who} could not connect to PostgreSQL and prepare its statements; trying again")
            }
            (Failure::Lost(_), true) => {
                tracing::warn!(consumer = %name, cause = %cause, "outbox {who} lost PostgreSQL; reconnecting")
            }
            (Failure::Refused { denied: true, .. }, true) => {
                tracing::error!(consumer = %name, cause = %cause, "outbox {who}: the database role lacks a privilege the consumer needs; nothing is taken until it is granted (trying again)")
            }
            (Failure::Refused { denied: false, .. }, true) => {
                tracing::warn!(consumer = %name, cause = %cause, "outbox {who}: PostgreSQL refused a statement; trying again")
            }
        }
    }

    /// A connection whose messages a task of its own reads; notifications, when `notified` is
    /// given, go there.
    async fn connect_with(
        &self,
        notified: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<(Client, AbortOnDrop), tokio_postgres::Error> {
        match &self.tls {
            None => {
                let (client, connection) = self.pg.connect(NoTls).await?;
                Ok((client, drive(connection, notified, self.name.clone())))
            }
            Some(tls) => {
                let (client, connection) = self.pg.connect(tls.clone()).await?;
                Ok((client, drive(connection, notified, self.name.clone())))
            }
        }
    }

    /// A connection whose task ends with it (when the client is dropped).
    async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, task) = self.connect_with(None).await?;
        task.detach();
        Ok(client)
    }
}

/// Read a connection's messages until it ends: this drives its queries, and hands its
/// notifications to `notified`.
fn drive<T>(
    mut connection: Connection<Socket, T>,
    notified: Option<mpsc::UnboundedSender<String>>,
    name: String,
) -> AbortOnDrop
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    AbortOnDrop(vec![tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if let Some(tx) = &notified {
                        let _ = tx.send(n.payload().to_owned());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(consumer = %name, cause = %e, "PostgreSQL connection ended");
                    return;
                }
            }
        }
    })])
}

/// A PostgreSQL error with the server's message (`db error` alone says nothing).
fn describe(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Aborts its tasks when dropped (the consumer's task was aborted on shutdown).
struct AbortOnDrop(Vec<JoinHandle<()>>);

impl AbortOnDrop {
    /// Let the tasks run on by themselves.
    fn detach(mut self) {
        self.0.clear();
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Run the consumer `name` until `stop` turns true: create the tables if configured, start the
/// workers, and listen for notifications.
pub async fn run(
    ctx: Arc<NodeContext>,
    name: String,
    config: PostgresConsumerConfig,
    stop: watch::Receiver<bool>,
) {
    // Both were checked when the config was loaded.
    let (Ok(mut pg), Ok(names)) = (
        tokio_postgres::Config::from_str(&config.dsn),
        TableNames::new(&config.table),
    ) else {
        tracing::error!(consumer = %name, "invalid consumer config");
        return;
    };
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(5));
    }
    if pg.get_application_name().is_none() {
        pg.application_name(format!("herald {}", ctx.config.node_name));
    }
    // A server that vanished without closing the socket (a machine or network loss) would
    // leave a worker waiting for a reply for hours; probes find it out in about 25 s.
    pg.keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3);
    let tls = match pg.get_ssl_mode() {
        SslMode::Require => match tls::client_config(config.ca_file.as_deref()) {
            Ok(c) => Some(tls::MakeRustls(c)),
            Err(e) => {
                tracing::error!(consumer = %name, cause = %format!("{e:#}"), "no TLS for PostgreSQL");
                return;
            }
        },
        // `prefer` (the default) stays plain: a server with a certificate nobody configured a
        // root for (Debian's self-signed default) keeps working as before.
        _ => None,
    };
    let workers = config.worker_count();
    let limits = &ctx.config.limits;
    let largest = ["publish", "broadcast"]
        .map(|m| publishing::max_body_bytes(limits, m))
        .into_iter()
        .max()
        .unwrap_or(0);
    let shared = Arc::new(Shared {
        payload_cap: i32::try_from(largest).unwrap_or(i32::MAX),
        logged: Mutex::new(HashMap::new()),
        tls,
        labels: consumer_labels(KIND, &name),
        lock_space: format!("herald_outbox:{}", names.table),
        wake: (0..workers).map(|_| Notify::new()).collect(),
        ctx,
        name,
        config,
        pg,
        names,
        stop,
    });
    // Every series exists from the start, at 0, so dashboards and alerts see the consumer.
    let metrics = shared.ctx.hub.metrics();
    for family in [
        &metrics.consumer_consumed,
        &metrics.consumer_published,
        &metrics.consumer_failed,
        &metrics.consumer_retries,
    ] {
        family.get_or_create(&shared.labels).inc_by(0);
    }
    metrics.consumer_lag.get_or_create(&shared.labels).set(0);
    if shared.config.create_table && !create_table(&shared).await {
        return;
    }
    let mut tasks = AbortOnDrop(
        (0..workers as usize)
            .map(|w| tokio::spawn(worker(shared.clone(), w)))
            .collect(),
    );
    listen(&shared).await;
    // Stopped: the workers finish the row in hand and commit.
    for task in std::mem::take(&mut tasks.0) {
        let _ = task.await;
    }
}

/// Run the DDL, once, retrying until it succeeds; false when stopped first. Nodes starting
/// together serialise on an advisory lock: `CREATE … IF NOT EXISTS` races otherwise.
async fn create_table(shared: &Shared) -> bool {
    let Ok(ddl) = ddl(&shared.names.table) else {
        return false;
    };
    let script = format!(
        "BEGIN;\nSELECT pg_advisory_xact_lock(hashtext('herald_outbox_ddl:{}'));\n{ddl}COMMIT;",
        shared.names.table
    );
    let mut stop = shared.stop.clone();
    let mut backoff = new_backoff();
    loop {
        let result = async {
            let client = shared.connect().await?;
            client.batch_execute(&script).await
        };
        match result.await {
            Ok(()) => return true,
            Err(e) => {
                tracing::warn!(consumer = %shared.name, cause = %describe(&e), "creating the outbox table failed; trying again")
            }
        }
        if sleep_or_stop(&mut stop, backoff.next_delay()).await {
            return false;
        }
    }
}

/// Waits between tries: doubling from [`BACKOFF_MIN`] to [`BACKOFF_MAX`], randomised ±25% so
/// nodes do not retry in step.
fn new_backoff() -> Backoff {
    Backoff::new(BACKOFF_MIN, BACKOFF_MAX)
}

/// Sleep `d`; true when `stop` turned true (or its sender is gone) first.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// Keep a `LISTEN` connection open (reconnecting with backoff) and turn notifications into
/// wake-ups; measure the lag on the same connection. Returns when stopped.
async fn listen(shared: &Shared) {
    let mut stop = shared.stop.clone();
    let mut backoff = new_backoff();
    loop {
        match listen_once(shared, &mut stop, &mut backoff).await {
            Ok(()) => return,
            Err(failure) => shared.report("listener", &failure),
        }
        if sleep_or_stop(&mut stop, backoff.next_delay()).await {
            return;
        }
    }
}

/// One listening connection, until stopped (`Ok`) or it fails.
async fn listen_once(
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
) -> Result<(), Failure> {
    let (notified, notifications) = mpsc::unbounded_channel();
    // The channel closes when the connection's task ends with the connection.
    let (client, _driver) = shared
        .connect_with(Some(notified))
        .await
        .map_err(|e| Failure::Unreachable(describe(&e)))?;
    match listening(shared, &client, notifications, stop, backoff).await {
        Ok(()) => Ok(()),
        Err(Some(e)) => Err(shared.failure(&client, &e).await),
        Err(None) => Err(Failure::Lost("the connection closed".into())),
    }
}

/// Listen and measure the lag on `client` until stopped (`Ok`), a statement fails
/// (`Err(Some)`), or the connection closes (`Err(None)`).
async fn listening(
    shared: &Shared,
    client: &Client,
    mut notifications: mpsc::UnboundedReceiver<String>,
    stop: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
) -> Result<(), Option<tokio_postgres::Error>> {
    client
        .batch_execute(&format!("LISTEN \"{}\"", shared.names.table))
        .await?;
    // Rows may have come while nobody listened.
    shared.wake_all();
    let lag_sql = format!(
        "SELECT count(*), count(*) FILTER (WHERE partition < 0 OR partition >= $1) FROM {}",
        shared.names.table
    );
    let lag_stmt = client.prepare(&lag_sql).await?;
    let partitions = shared.config.partitions as i32;
    let mut lag_timer = tokio::time::interval(
        Duration::from_millis(shared.config.poll_interval_ms).max(LAG_INTERVAL_MIN),
    );
    let mut stray_seen = 0;
    loop {
        tokio::select! {
            n = notifications.recv() => match n {
                Some(payload) => shared.wake_partition(&payload),
                None => return Err(None),
            },
            _ = lag_timer.tick() => {
                let row = client.query_one(&lag_stmt, &[&partitions]).await?;
                // Reset only once a statement worked: a role without SELECT must not make the
                // listener reconnect every 100 ms.
                backoff.reset();
                let (pending, stray): (i64, i64) = (row.get(0), row.get(1));
                shared.ctx.hub.metrics().consumer_lag.get_or_create(&shared.labels).set(pending);
                if stray != stray_seen && stray > 0 {
                    tracing::warn!(consumer = %shared.name, rows = stray, partitions, "outbox rows with a partition outside 0..partitions wait for a node configured with more partitions");
                }
                stray_seen = stray;
            }
            _ = stop.changed() => return Ok(()),
        }
    }
}

/// One worker connection, draining partitions `w, w + workers, …` until stopped.
async fn worker(shared: Arc<Shared>, w: usize) {
    let step = shared.wake.len();
    let partitions: Vec<i32> = (w..shared.config.partitions as usize)
        .step_by(step)
        .map(|p| p as i32)
        .collect();
    // Partitions waiting out a retryable failure: when to try again, and the backoff.
    let mut retry: HashMap<i32, (Instant, Backoff)> = HashMap::new();
    let mut stop = shared.stop.clone();
    let mut backoff = new_backoff();
    loop {
        let mut conn = match connect_worker(&shared).await {
            Ok(c) => c,
            Err(e) => {
                // Connecting, or preparing on a new connection (a missing table, say).
                shared.report("worker", &Failure::Unreachable(describe(&e)));
                if sleep_or_stop(&mut stop, backoff.next_delay()).await {
                    return;
                }
                continue;
            }
        };
        match drain(&shared, &mut conn, &partitions, &mut retry, w, &mut backoff).await {
            Ok(()) => return,
            Err(e) => {
                let failure = shared.failure(&conn.client, &e).await;
                shared.report("worker", &failure);
            }
        }
        if sleep_or_stop(&mut stop, backoff.next_delay()).await {
            return;
        }
    }
}

/// A worker's connection and its prepared statements.
struct WorkerConn {
    client: Client,
    lock: Statement,
    take: Statement,
    delete: Statement,
    dead_letter: Statement,
}

async fn connect_worker(shared: &Shared) -> Result<WorkerConn, tokio_postgres::Error> {
    let client = shared.connect().await?;
    let t = &shared.names.table;
    let lock = client
        .prepare("SELECT pg_try_advisory_xact_lock(hashtext($1), $2)")
        .await?;
    // A payload over $3 bytes comes as NULL with its length, to be dead-lettered unread.
    let take = client
        .prepare(&format!(
            "SELECT id, method, \
                    CASE WHEN octet_length(payload::text) <= $3 THEN payload::text END, \
                    octet_length(payload::text) \
             FROM {t} WHERE partition = $1 \
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
        ))
        .await?;
    let delete = client
        .prepare(&format!("DELETE FROM {t} WHERE id = ANY($1)"))
        .await?;
    let dead_letter = client
        .prepare(&format!(
            "WITH moved AS (DELETE FROM {t} WHERE id = $1 \
                RETURNING id, method, payload, partition, created_at) \
             INSERT INTO {dead} (id, method, payload, partition, created_at, error) \
             SELECT id, method, payload, partition, created_at, $2 FROM moved",
            dead = shared.names.dead
        ))
        .await?;
    Ok(WorkerConn {
        client,
        lock,
        take,
        delete,
        dead_letter,
    })
}

/// What one batch of a partition came to.
#[derive(Debug, PartialEq)]
enum Batch {
    /// The batch was full: more rows may wait.
    Full,
    /// Fewer rows than a batch (or none): the partition is drained for now.
    Drained,
    /// Another transaction (another node's) holds the partition.
    Busy,
    /// A row failed with a retryable error: it and the rows behind it wait.
    Retry,
}

/// Drain this worker's partitions whenever woken or the poll interval passes, until stopped
/// (`Ok`) or a statement fails (`Err`). `backoff`, the worker's wait before reconnecting, is
/// reset by each batch that worked: a connection that opens but whose statements are refused
/// is retried slower and slower, not every 100 ms.
async fn drain(
    shared: &Shared,
    conn: &mut WorkerConn,
    partitions: &[i32],
    retry: &mut HashMap<i32, (Instant, Backoff)>,
    w: usize,
    backoff: &mut Backoff,
) -> Result<(), tokio_postgres::Error> {
    let poll = Duration::from_millis(shared.config.poll_interval_ms);
    let mut stop = shared.stop.clone();
    loop {
        let mut more = false;
        for &p in partitions {
            if shared.stopped() {
                return Ok(());
            }
            if retry.get(&p).is_some_and(|(at, _)| *at > Instant::now()) {
                continue;
            }
            let outcome = batch(shared, conn, p).await?;
            backoff.reset();
            match outcome {
                Batch::Full => {
                    retry.remove(&p);
                    more = true;
                }
                // Busy: the holder (another node) retries on its own; a retry time left here
                // and past would wake this worker in a loop while the other holds it.
                Batch::Drained | Batch::Busy => {
                    retry.remove(&p);
                }
                Batch::Retry => {
                    let (at, backoff) = retry
                        .entry(p)
                        .or_insert_with(|| (Instant::now(), new_backoff()));
                    *at = Instant::now() + backoff.next_delay();
                }
            }
        }
        if more {
            continue;
        }
        let next_retry = retry.values().map(|(at, _)| *at).min();
        let wake_at = next_retry.map_or(Instant::now() + poll, |at| at.min(Instant::now() + poll));
        tokio::select! {
            _ = shared.wake[w].notified() => {}
            _ = tokio::time::sleep_until(wake_at) => {}
            _ = stop.changed() => return Ok(()),
        }
    }
}

/// One transaction over partition `p`: lock it, take its oldest rows, publish them in order,
/// delete what was published and dead-letter what cannot be, commit.
async fn batch(
    shared: &Shared,
    conn: &mut WorkerConn,
    p: i32,
) -> Result<Batch, tokio_postgres::Error> {
    let metrics = shared.ctx.hub.metrics();
    let tx = conn.client.transaction().await?;
    let locked: bool = tx
        .query_one(&conn.lock, &[&shared.lock_space, &p])
        .await?
        .get(0);
    if !locked {
        tx.rollback().await?;
        return Ok(Batch::Busy);
    }
    let limit = i64::from(shared.config.batch_size);
    let rows = tx
        .query(&conn.take, &[&p, &limit, &shared.payload_cap])
        .await?;
    let mut outcome = if rows.len() as i64 == limit {
        Batch::Full
    } else {
        Batch::Drained
    };
    let mut published = Vec::new();
    let mut failed = 0;
    for row in &rows {
        if shared.stopped() {
            outcome = Batch::Drained;
            break;
        }
        let id: i64 = row.get(0);
        let method: Option<&str> = row.get(1);
        let payload: Option<&str> = row.get(2);
        let length: Option<i32> = row.get(3);
        metrics
            .consumer_consumed
            .get_or_create(&shared.labels)
            .inc();
        match publish_row(shared, id, method, payload, length).await {
            Outcome::Published => published.push(id),
            Outcome::Refused(error) => {
                tracing::warn!(consumer = %shared.name, id, partition = p, %error, "outbox row moved to the dead-letter table");
                tx.execute(&conn.dead_letter, &[&id, &error]).await?;
                failed += 1;
            }
            Outcome::Retry(error) => {
                tracing::warn!(consumer = %shared.name, id, partition = p, %error, "outbox row not published; trying again");
                metrics.consumer_retries.get_or_create(&shared.labels).inc();
                outcome = Batch::Retry;
                break;
            }
        }
    }
    if !published.is_empty() {
        tx.execute(&conn.delete, &[&published]).await?;
    }
    tx.commit().await?;
    // Counted once committed: a batch rolled back publishes its rows again (same keys).
    metrics
        .consumer_published
        .get_or_create(&shared.labels)
        .inc_by(published.len() as u64);
    metrics
        .consumer_failed
        .get_or_create(&shared.labels)
        .inc_by(failed);
    Ok(outcome)
}

/// What publishing one row came to.
enum Outcome {
    /// Published to every channel (or found published before under its key).
    Published,
    /// Never publishable as it is: the error, for the dead-letter table.
    Refused(String),
    /// A retry can succeed (the broker was unavailable).
    Retry(String),
}

/// Publish one row under its idempotency key; `length` is the payload's, in bytes (the payload
/// itself is `None` when it is over [`Shared::payload_cap`]).
async fn publish_row(
    shared: &Shared,
    id: i64,
    method: Option<&str>,
    payload: Option<&str>,
    length: Option<i32>,
) -> Outcome {
    let (Some(method), Some(length)) = (method, length) else {
        return Outcome::Refused("method or payload is NULL".into());
    };
    let length = usize::try_from(length).unwrap_or(usize::MAX);
    if let Err(e) = publishing::check_body_size(&shared.ctx.config.limits, method, length) {
        return Outcome::Refused(e.to_string());
    }
    let Some(payload) = payload else {
        // Within its method's limit but over the cap: cannot be, the cap is the largest.
        return Outcome::Refused(format!("payload of {length} bytes was not read"));
    };
    let key = format!("outbox:{}:{id}", shared.names.table);
    // Many commands in one row, each under `<key>:<index>`.
    if method == "batch" {
        return match crate::batch::parse(payload.as_bytes(), &shared.ctx.config.limits) {
            Ok(b) => match batch::run(&shared.ctx, &b, &key).await {
                batch::Outcome::Done => Outcome::Published,
                batch::Outcome::Refused(error) => Outcome::Refused(error),
                batch::Outcome::Retry(error) => Outcome::Retry(error),
            },
            Err(e) => Outcome::Refused(e.to_string()),
        };
    }
    // Centrifugo's `subscribe`, `unsubscribe` and `disconnect` rows (a message to every node)
    // and `history_remove`.
    match action(method, payload.as_bytes(), &shared.ctx.namespaces) {
        Ok(Some(action)) => {
            return match action.run(&shared.ctx).await {
                Ok(()) => Outcome::Published,
                Err(e) if e.is_retryable() => Outcome::Retry(e.to_string()),
                Err(e) => Outcome::Refused(e.to_string()),
            }
        }
        Ok(None) => {}
        Err(e) => return Outcome::Refused(e.to_string()),
    }
    // Centrifugo's request fields too (`b64data`, `skip_history`, …): a Centrifugo outbox
    // table's rows decode as the compatibility API decodes them.
    let cmd = match decode(method, payload.as_bytes()) {
        Ok(cmd) => cmd,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    let done = match publishing::execute(&shared.ctx, &cmd, Some(&key)).await {
        Ok(done) => done,
        Err(e) if e.is_retryable() => return Outcome::Retry(e.to_string()),
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    let failed = done.failed(&cmd).count();
    if failed == 0 {
        return Outcome::Published;
    }
    // The first few failures tell what went wrong; a broadcast to 100,000 channels that all
    // failed would otherwise write megabytes into one row.
    let mut listed: Vec<String> = done
        .failed(&cmd)
        .take(MAX_LISTED_FAILURES)
        .map(|(channel, e)| format!("{channel}: {e}"))
        .collect();
    if failed > MAX_LISTED_FAILURES {
        listed.push(format!("… and {} more", failed - MAX_LISTED_FAILURES));
    }
    let listed = listed.join("; ");
    match done.retryable() {
        true => Outcome::Retry(listed),
        false => Outcome::Refused(format!(
            "{failed} of {} channels failed: {listed}",
            cmd.channels().len()
        )),
    }
}

/// TLS to PostgreSQL with rustls (ring), verifying the server's certificate and name (also
/// used by the Pusher apps table, crate::pusher::apps_db).
pub(crate) mod tls {
    use std::future::Future;
    use std::io;
    use std::path::Path;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context as TaskContext, Poll};

    use anyhow::Context;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

    /// The client side: `ca_file`'s certificates, or the Mozilla roots, as trust anchors.
    pub(crate) fn client_config(
        ca_file: Option<&Path>,
    ) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        match ca_file {
            Some(path) => {
                for cert in CertificateDer::pem_file_iter(path)
                    .with_context(|| format!("reading ca_file {}", path.display()))?
                {
                    roots
                        .add(cert.with_context(|| format!("a certificate in {}", path.display()))?)
                        .context("ca_file")?;
                }
                anyhow::ensure!(!roots.is_empty(), "no certificate in {}", path.display());
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// Makes a TLS connector per host.
    #[derive(Clone)]
    pub(crate) struct MakeRustls(pub(crate) Arc<rustls::ClientConfig>);

    impl<S> MakeTlsConnect<S> for MakeRustls
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type TlsConnect = Connect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, host: &str) -> io::Result<Connect> {
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(Connect {
                config: self.0.clone(),
                name,
            })
        }
    }

    /// The TLS handshake with one host.
    pub(crate) struct Connect {
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    }

    impl<S> TlsConnect<S> for Connect
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

        fn connect(self, stream: S) -> Self::Future {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            Box::pin(async move { Ok(Stream(connector.connect(self.name, stream).await?)) })
        }
    }

    /// A TLS stream to the server.
    pub(crate) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut TaskContext<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut TaskContext<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut TaskContext<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
        // SCRAM without channel binding (tokio-postgres falls back to plain SCRAM-SHA-256).
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked_and_derived() {
        let n = TableNames::new("app.outbox").unwrap();
        assert_eq!(n.dead, "app.outbox_dead");
        assert_eq!(n.function, "app.outbox_notify");
        assert_eq!(n.trigger, "outbox_notify");
        assert_eq!(n.index, "outbox_partition_id");
        for bad in ["", "Outbox", "a-b", "1x", "a.b.c", "a.", ".a", "x\"; DROP"] {
            assert!(TableNames::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TableNames::new(&"a".repeat(51)).is_err());
    }

    #[test]
    fn the_documented_ddl_is_the_one_herald_runs() {
        let doc = include_str!("../../../../docs/consumers.md");
        let ddl = ddl("herald_outbox").unwrap();
        assert!(
            doc.contains(&ddl),
            "docs/consumers.md must show ddl(\"herald_outbox\") verbatim:\n{ddl}"
        );
    }

    #[test]
    fn the_documented_grants_are_the_ones_the_consumer_needs() {
        let doc = include_str!("../../../../docs/consumers.md");
        let names = TableNames::new("herald_outbox").unwrap();
        let grants = privileges::grants(&names, "herald");
        assert!(
            doc.contains(&grants),
            "docs/consumers.md must show the grants verbatim:\n{grants}"
        );
    }

    #[test]
    fn workers_never_outnumber_partitions() {
        let c = |partitions, connections| PostgresConsumerConfig {
            partitions,
            connections,
            ..Default::default()
        };
        assert_eq!(c(1, 0).worker_count(), 1);
        assert_eq!(c(16, 0).worker_count(), 4);
        assert_eq!(c(16, 8).worker_count(), 8);
        assert_eq!(c(2, 8).worker_count(), 2);
    }
}
