//! Pusher apps read from a PostgreSQL table (`[pusher.postgres]`): a real PostgreSQL
//! (herald-testkit), the real binary, Pusher clients over WebSocket and signed HTTP API calls.
//! Rows added, changed, disabled and deleted take effect without a restart; a configured app
//! wins over a row with its key; the database down at start-up or later keeps the apps last read.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{config_file, herald_bin, Client, ConfigFile, Node, API_KEY, SECRET};
use herald_testkit::eventually;
use herald_testkit::postgres::PostgresServer;
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// How long a change may take to reach the node (refresh_ms is 200).
const CHANGE: Duration = Duration::from_secs(10);

/// Soketi's apps table, as its docs give it (with a column Herald does not read).
const DDL: &str = "CREATE TABLE apps (
    id varchar(255) PRIMARY KEY,
    key varchar(255) NOT NULL UNIQUE,
    secret varchar(255) NOT NULL,
    max_connections integer,
    enable_client_messages boolean NOT NULL DEFAULT false,
    enabled boolean NOT NULL DEFAULT true,
    max_backend_events_per_second integer,
    max_client_events_per_second integer,
    max_read_requests_per_second integer,
    webhooks json,
    max_presence_members_per_channel integer,
    max_presence_member_size_in_kb integer,
    max_channel_name_length integer,
    max_event_channels_at_once integer,
    max_event_name_length integer,
    max_event_payload_in_kb integer,
    max_event_batch_size integer
)";

/// The app in the TOML file.
const CONFIGURED: (&str, &str, &str) = ("toml-app", "toml-key", "toml-secret");

/// A node whose log (stderr, `RUST_LOG=info`) the test reads, with the TOML app and
/// `[pusher.postgres]` on `url`; the process is killed when the child is dropped.
async fn logged_node(url: &str) -> (Node, Arc<Mutex<String>>, tokio::process::Child, ConfigFile) {
    use tokio::io::AsyncBufReadExt;
    let (id, key, secret) = CONFIGURED;
    let file = config_file(
        "herald.toml",
        &format!(
            "[[pusher.apps]]\nid = \"{id}\"\nkey = \"{key}\"\nsecret = \"{secret}\"\n\
             [pusher.postgres]\nurl = \"{url}\"\nrefresh_ms = 200\n"
        ),
    );
    let mut cmd = tokio::process::Command::new(herald_bin());
    cmd.args(["serve", "--dev", "--port", "0", "--config", &file]);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .env("HERALD_API_KEY", API_KEY)
        .env("HERALD_TOKEN_HMAC_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald");
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            let mut log = sink.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("herald did not start in time")
        .expect("read stdout")
        .unwrap_or_else(|| panic!("herald exited before listening: {}", log.lock().unwrap()));
    let addr = line
        .split_whitespace()
        .nth(3)
        .and_then(|u| u.strip_prefix("http://"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("listening line: {line}"));
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    (Node::attach("herald", addr), log, child, file)
}

/// A URL with a password (trust authentication ignores it): it must never be logged.
fn url_with_password(pg: &PostgresServer) -> String {
    format!(
        "postgres://postgres:hunter2-db-password@127.0.0.1:{}/postgres",
        pg.port()
    )
}

/// Open `/app/{key}`: `Ok` (client, socket id) once established, or `Err` with the close code.
async fn open(node: &Node, key: &str) -> Result<(Client, String), Option<u16>> {
    let tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
    let url = format!(
        "ws://{}/app/{key}?protocol=7&client=raw&version=1",
        node.addr
    );
    let mut c = Client::open_on(Box::new(tcp), &url, &[])
        .await
        .expect("ws handshake");
    let m = c.next().await;
    if m["event"] == "pusher:connection_established" {
        let data: Value = serde_json::from_str(m["data"].as_str().unwrap()).unwrap();
        return Ok((c, data["socket_id"].as_str().unwrap().to_owned()));
    }
    assert_eq!(m["event"], "pusher:error", "{m}");
    Err(c.closed().await.code)
}

/// Wait until `/app/{key}` is answered as `want` (`None`: established; else the close code).
async fn until_opened_as(node: &Node, key: &str, want: Option<u16>) {
    eventually(CHANGE, &format!("/app/{key} answered {want:?}"), || async {
        match open(node, key).await {
            Ok(_) => want.is_none(),
            Err(code) => want.is_some() && code == want,
        }
    })
    .await;
}

/// A signed `GET /apps/{id}/channels` with `key` and `secret`: the status.
async fn channels_status(node: &Node, id: &str, key: &str, secret: &str) -> u16 {
    use herald_server::pusher::auth::sign;
    let path = format!("/apps/{id}/channels");
    let query = format!(
        "auth_key={key}&auth_timestamp={}&auth_version=1.0",
        common::now()
    );
    let signature = sign(secret, &format!("GET\n{path}\n{query}"));
    let url = format!("{path}?{query}&auth_signature={signature}");
    node.http("GET", &url, None, None).await.0
}

/// Subscribe to a private channel with a signature made with `key` and `secret`: the reply.
async fn private_subscribe(c: &mut Client, socket: &str, key: &str, secret: &str) -> Value {
    use herald_server::pusher::auth::sign;
    let channel = "private-room";
    let auth = format!("{key}:{}", sign(secret, &format!("{socket}:{channel}")));
    c.send_raw(
        &json!({"event": "pusher:subscribe", "data": {"channel": channel, "auth": auth}})
            .to_string(),
    )
    .await;
    c.next().await
}

async fn metric(node: &Node, name: &str) -> f64 {
    node.metric(name).await
}

/// A row added, its secret changed, disabled, deleted: each seen by the node within the refresh
/// interval, without a restart. Open connections stay open through the changes and check
/// signatures with the current secret. A row with the configured app's key is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_added_changed_disabled_and_deleted_without_a_restart() {
    let pg = PostgresServer::start();
    pg.psql(DDL);
    pg.psql("INSERT INTO apps (id, key, secret, max_channel_name_length) VALUES ('a', 'key-a', 'secret-a', 200)");
    let (node, log, _child, _file) = logged_node(&url_with_password(&pg)).await;

    // Read before serving: the first connection finds the row.
    let (_a, _) = open(&node, "key-a").await.expect("row a served at once");
    assert_eq!(channels_status(&node, "a", "key-a", "secret-a").await, 200);
    assert_eq!(open(&node, "key-b").await.err(), Some(Some(4001)));
    assert_eq!(metric(&node, "herald_pusher_apps_db_apps").await, 1.0);
    assert_eq!(metric(&node, "herald_pusher_apps_db_up").await, 1.0);

    // A new row.
    pg.psql("INSERT INTO apps (id, key, secret) VALUES ('b', 'key-b', 'secret-b')");
    until_opened_as(&node, "key-b", None).await;
    assert_eq!(channels_status(&node, "b", "key-b", "secret-b").await, 200);
    let (mut open_b, socket) = open(&node, "key-b").await.expect("b");

    // A changed secret: new signatures use it, the old one is refused, also on the
    // connection opened before the change.
    pg.psql("UPDATE apps SET secret = 'secret-b2' WHERE id = 'b'");
    eventually(CHANGE, "the new secret signs HTTP calls", || async {
        channels_status(&node, "b", "key-b", "secret-b2").await == 200
    })
    .await;
    assert_eq!(channels_status(&node, "b", "key-b", "secret-b").await, 401);
    let refused = private_subscribe(&mut open_b, &socket, "key-b", "secret-b").await;
    assert_eq!(refused["event"], "pusher:subscription_error", "{refused}");
    let ok = private_subscribe(&mut open_b, &socket, "key-b", "secret-b2").await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );

    // Disabled: new connections 4003, HTTP 403; the open connection stays open.
    pg.psql("UPDATE apps SET enabled = false WHERE id = 'b'");
    until_opened_as(&node, "key-b", Some(4003)).await;
    assert_eq!(channels_status(&node, "b", "key-b", "secret-b2").await, 403);
    open_b
        .send_raw(r#"{"event": "pusher:ping", "data": {}}"#)
        .await;
    assert_eq!(open_b.next().await["event"], "pusher:pong");

    // Deleted: 4001 and 404, as an app that never was.
    pg.psql("DELETE FROM apps WHERE id = 'b'");
    until_opened_as(&node, "key-b", Some(4001)).await;
    assert_eq!(channels_status(&node, "b", "key-b", "secret-b2").await, 404);

    // A row with the configured app's key: the configured app is served, the row left out.
    let (id, key, secret) = CONFIGURED;
    pg.psql(&format!(
        "INSERT INTO apps (id, key, secret) VALUES ('c', '{key}', 'row-secret')"
    ));
    eventually(
        CHANGE,
        "the clashing row is left out, with a warning",
        || async {
            log.lock()
                .unwrap()
                .contains("a configured app has its id or key")
        },
    )
    .await;
    let (_t, _) = open(&node, key).await.expect("the configured app");
    assert_eq!(channels_status(&node, id, key, secret).await, 200);
    assert_eq!(channels_status(&node, "c", key, "row-secret").await, 404);
    assert_eq!(metric(&node, "herald_pusher_apps_db_apps").await, 1.0);

    let log = log.lock().unwrap();
    assert!(
        log.contains("max_channel_name_length"),
        "the unread column is named: {log}"
    );
    for secret in ["hunter2", "secret-a", "secret-b", "row-secret"] {
        assert!(!log.contains(secret), "{secret} in the log: {log}");
    }
}

/// The database down at start-up: the node starts and serves its configured app; once the
/// database is up its rows are served; down again, the rows last read stay in force, the
/// metrics say so, and the log says it once (without the URL's password).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_down_keeps_the_apps_last_read() {
    let mut pg = PostgresServer::start();
    pg.psql(DDL);
    pg.psql("INSERT INTO apps (id, key, secret) VALUES ('a', 'key-a', 'secret-a')");
    pg.stop();
    let (node, log, _child, _file) = logged_node(&url_with_password(&pg)).await;
    let (_t, _) = open(&node, CONFIGURED.1)
        .await
        .expect("the configured app is served without the database");
    assert_eq!(open(&node, "key-a").await.err(), Some(Some(4001)));
    assert_eq!(metric(&node, "herald_pusher_apps_db_up").await, 0.0);
    assert!(metric(&node, "herald_pusher_apps_db_failures_total").await >= 1.0);

    pg.restart();
    until_opened_as(&node, "key-a", None).await;
    assert_eq!(metric(&node, "herald_pusher_apps_db_up").await, 1.0);

    pg.stop();
    eventually(CHANGE, "the failure is seen", || async {
        metric(&node, "herald_pusher_apps_db_up").await == 0.0
    })
    .await;
    let failures = metric(&node, "herald_pusher_apps_db_failures_total").await;
    // Several refreshes fail (200 ms apart) while the row stays in force.
    eventually(CHANGE, "failures go on being counted", || async {
        metric(&node, "herald_pusher_apps_db_failures_total").await >= failures + 3.0
    })
    .await;
    let (_a, _) = open(&node, "key-a")
        .await
        .expect("the row last read is still served");
    assert_eq!(channels_status(&node, "a", "key-a", "secret-a").await, 200);

    let log = log.lock().unwrap();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pusher apps table not read"))
        .collect();
    assert_eq!(
        failed.len(),
        2,
        "once per outage (the log repeats only after a minute): {log}"
    );
    assert!(log.contains("pusher apps table read again"), "{log}");
    assert!(
        !log.contains("hunter2"),
        "the URL's password in the log: {log}"
    );
}
