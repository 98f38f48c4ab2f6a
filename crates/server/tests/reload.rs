//! Configuration reload on a running node (`SIGHUP`, `POST /admin/api/reload`): connections and
//! subscriptions stay; a changed namespace rule and a new token key apply at once; keys fixed at
//! start-up are named, not applied; an invalid file is refused with the old configuration kept
//! and an `error` line; the loaded version changes.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use herald_testkit::eventually;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

const ADMIN_PASSWORD: &str = "reload-admin-pw";
const FIRST_SECRET: &str = "first-hmac-secret-0123456789";
const SECOND_SECRET: &str = "second-hmac-secret-9876543210";
const WAIT: Duration = Duration::from_secs(20);

/// The configuration with `room:` channels read-only for clients (or not) and the HMAC secret.
fn config(room_publish: bool, secret: &str, extra: &str) -> String {
    format!(
        r#"
api_key = "{API_KEY}"
token_hmac_secret = "{secret}"
log_format = "json"
{extra}
[admin]
enabled = true
password = "{ADMIN_PASSWORD}"

[default_namespace]
subscribe = "authenticated"
publish = true

[[namespaces]]
name = "room"
subscribe = "authenticated"
publish = {room_publish}
"#
    )
}

/// A node started on a config file, with its log (stderr) collected.
struct Reloadable {
    child: Child,
    addr: std::net::SocketAddr,
    log: Arc<Mutex<String>>,
    file: ConfigFile,
}

impl Reloadable {
    async fn start(toml: &str) -> Reloadable {
        let file = config_file("herald.toml", toml);
        let mut cmd = Command::new(herald_bin());
        cmd.args(["serve", "--config", &file, "--port", "0"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn herald");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("herald did not start in time")
            .expect("read stdout")
            .expect("herald exited before listening");
        let addr = line
            .split_whitespace()
            .nth(3)
            .and_then(|url| url.split("://").nth(1))
            .expect("listening line")
            .parse()
            .expect("address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = stderr.next_line().await {
                sink.lock().unwrap().push_str(&l);
                sink.lock().unwrap().push('\n');
            }
        });
        Reloadable {
            child,
            addr,
            log,
            file,
        }
    }

    fn rewrite(&self, toml: &str) {
        std::fs::write(&*self.file, toml).expect("rewrite the config");
    }

    fn sighup(&self) {
        let pid = self.child.id().expect("pid");
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP failed");
    }

    /// Log lines (JSON) whose message is `message`.
    fn log_lines(&self, message: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message)
            .collect()
    }

    async fn wait_for_log(&self, message: &str, count: usize) -> Vec<Value> {
        eventually(WAIT, &format!("{count} log line(s) {message:?}"), || {
            let lines = self.log_lines(message);
            async move { lines.len() >= count }
        })
        .await;
        self.log_lines(message)
    }

    async fn client(&self, secret: &str, user: &str) -> (Client, Value) {
        let mut c = Client::open(self.addr, &[]).await;
        let reply = c
            .call("connect", json!({"token": sign(secret, user)}))
            .await;
        (c, reply)
    }

    /// An admin API call with the admin password as a bearer token: status and JSON body.
    async fn admin(&self, method: &str, path: &str) -> (u16, Value) {
        http(self.addr, method, path, &format!("Bearer {ADMIN_PASSWORD}")).await
    }

    async fn version(&self) -> Value {
        let (status, overview) = self.admin("GET", "/admin/api/overview").await;
        assert_eq!(status, 200, "{overview}");
        overview["config_version"].clone()
    }

    async fn metric(&self, name: &str) -> f64 {
        let (status, text) = http(self.addr, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        let text = text.as_str().unwrap_or_default().to_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

/// One HTTP/1.1 exchange: status and the body as JSON (or a string).
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    authorization: &str,
) -> (u16, Value) {
    let mut stream = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let auth = if authorization.is_empty() {
        String::new()
    } else {
        format!("Authorization: {authorization}\r\n")
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("answer timed out")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (status, value)
}

fn sign(secret: &str, user: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": user}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("sign")
}

fn is_error(reply: &Value) -> bool {
    reply.get("error").is_some()
}

/// Wait for a publication on `channel` and return its data.
async fn publication(c: &mut Client, channel: &str) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let m = c.next().await;
            if m["pub"]["channel"] == channel {
                return m["pub"]["data"].clone();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no publication on {channel} within {WAIT:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_namespaces_and_token_keys_without_dropping_connections() {
    let node = Reloadable::start(&config(false, FIRST_SECRET, "")).await;
    let (mut alice, reply) = node.client(FIRST_SECRET, "alice").await;
    assert!(!is_error(&reply), "connect: {reply}");
    let sub = alice.call("subscribe", json!({"channel": "room:a"})).await;
    assert!(!is_error(&sub), "subscribe: {sub}");
    let refused = alice
        .call("publish", json!({"channel": "room:a", "data": {"n": 0}}))
        .await;
    assert!(is_error(&refused), "room is read-only at first: {refused}");
    assert_eq!(node.version().await["number"], 1);

    node.rewrite(&config(
        true,
        SECOND_SECRET,
        r#"broker_url = "redis://127.0.0.1:1""#,
    ));
    node.sighup();
    let lines = node.wait_for_log("configuration reloaded", 1).await;
    let fields = &lines[0]["fields"];
    assert_eq!(fields["trigger"], "SIGHUP", "{fields}");
    let applied = fields["applied"].as_str().unwrap_or_default();
    assert!(
        applied.contains("namespaces") && applied.contains("token_hmac_secret"),
        "{fields}"
    );
    assert!(
        fields["not_applied"]
            .as_str()
            .unwrap_or_default()
            .contains("broker_url"),
        "{fields}"
    );
    let log = node.log.lock().unwrap().clone();
    assert!(
        !log.contains(SECOND_SECRET) && !log.contains(FIRST_SECRET),
        "a secret reached the log"
    );
    assert_eq!(node.version().await["number"], 2);

    // The same connection: the new rule applies to its next command, its subscription is live.
    let ok = alice
        .call("publish", json!({"channel": "room:a", "data": {"n": 1}}))
        .await;
    assert!(!is_error(&ok), "room is writable after the reload: {ok}");
    assert_eq!(publication(&mut alice, "room:a").await, json!({"n": 1}));

    // New connections: the new key is accepted, the old one no longer.
    let (_bob, reply) = node.client(SECOND_SECRET, "bob").await;
    assert!(!is_error(&reply), "the new key connects: {reply}");
    let (_carol, reply) = node.client(FIRST_SECRET, "carol").await;
    assert!(is_error(&reply), "the old key is refused: {reply}");
    // The broker did not change: publications still flow through the one in force.
    let (status, _) = http(node.addr, "GET", "/health", "").await;
    assert_eq!(status, 200);
    assert_eq!(
        node.metric("herald_config_reloads_total{result=\"ok\"}")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_is_refused_and_the_old_configuration_stays() {
    let node = Reloadable::start(&config(false, FIRST_SECRET, "")).await;
    let (mut alice, reply) = node.client(FIRST_SECRET, "alice").await;
    assert!(!is_error(&reply), "connect: {reply}");
    assert!(!is_error(
        &alice.call("subscribe", json!({"channel": "news"})).await
    ));

    // An unknown key (with a valid rule change and a new key that must not be applied).
    node.rewrite(&format!("prot = 1\n{}", config(true, SECOND_SECRET, "")));
    node.sighup();
    let lines = node
        .wait_for_log(
            "configuration reload refused: the old configuration stays in force",
            1,
        )
        .await;
    assert_eq!(lines[0]["level"], "ERROR", "{}", lines[0]);
    let cause = lines[0]["fields"]["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("prot"), "the cause names the key: {cause}");

    // The admin call is refused the same way, with the reason.
    let (status, answer) = node.admin("POST", "/admin/api/reload").await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("prot"), "{answer}");

    // Nothing of the new file is in force; the connection still gets its publications.
    assert_eq!(node.version().await["number"], 1);
    let refused = alice
        .call("publish", json!({"channel": "room:a", "data": {}}))
        .await;
    assert!(is_error(&refused), "the old rule stays: {refused}");
    let (_bob, reply) = node.client(FIRST_SECRET, "bob").await;
    assert!(!is_error(&reply), "the old key stays: {reply}");
    let (_carol, reply) = node.client(SECOND_SECRET, "carol").await;
    assert!(is_error(&reply), "the new key is not in force: {reply}");
    let ok = alice
        .call(
            "publish",
            json!({"channel": "news", "data": {"still": "here"}}),
        )
        .await;
    assert!(!is_error(&ok), "{ok}");
    assert_eq!(
        publication(&mut alice, "news").await,
        json!({"still": "here"})
    );
    assert_eq!(
        node.metric("herald_config_reloads_total{result=\"refused\"}")
            .await,
        2.0
    );
}

/// A Centrifugo `grpc://` proxy endpoint brought in by a reload is refused as unsupported, not
/// accepted to fail at each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_proxy_endpoint_is_refused_at_reload() {
    let node = Reloadable::start(&config(false, FIRST_SECRET, "")).await;
    node.rewrite(&config(
        false,
        FIRST_SECRET,
        "[proxy]\nrpc_url = \"grpc://user:s3cret@127.0.0.1:10000\"\n",
    ));
    let (status, answer) = node.admin("POST", "/admin/api/reload").await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("proxy.rpc_url: gRPC proxy endpoints are not supported"),
        "{answer}"
    );
    assert!(!message.contains("s3cret"), "{answer}");
    assert_eq!(node.version().await["number"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_call_answers_what_was_applied_and_what_waits_for_a_restart() {
    let node = Reloadable::start(&config(false, FIRST_SECRET, "")).await;
    let (mut alice, reply) = node.client(FIRST_SECRET, "alice").await;
    assert!(!is_error(&reply), "connect: {reply}");
    assert!(!is_error(
        &alice.call("subscribe", json!({"channel": "news"})).await
    ));
    let before = node.version().await;

    let next = config(
        false,
        FIRST_SECRET,
        "broker_url = \"redis://127.0.0.1:1\"\n[limits]\nmax_channels_per_connection = 1\naccept_queues = 2\n",
    );
    node.rewrite(&next);
    let (status, answer) = node.admin("POST", "/admin/api/reload").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["applied"],
        json!(["limits.max_channels_per_connection"]),
        "{answer}"
    );
    let not_applied: Vec<&str> = answer["not_applied"]
        .as_array()
        .expect("not_applied")
        .iter()
        .map(|n| n["key"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        not_applied,
        ["broker_url", "limits.accept_queues"],
        "{answer}"
    );
    assert!(answer["not_applied"][0]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("start-up")));

    let version = &answer["version"];
    assert_eq!(version["number"], 2, "{answer}");
    let sha = hex::encode(Sha256::digest(next.as_bytes()));
    assert_eq!(version["file_sha256"], json!(sha[..12]), "{answer}");
    assert!(version["loaded_at_ms"].as_u64() >= before["loaded_at_ms"].as_u64());
    assert_eq!(node.version().await, *version, "the overview shows it");
    let lines = node.wait_for_log("configuration reloaded", 1).await;
    assert_eq!(lines[0]["fields"]["trigger"], "admin API");

    // The new limit applies to the existing connection's next command.
    let second = alice.call("subscribe", json!({"channel": "other"})).await;
    assert!(
        is_error(&second),
        "one channel per connection now: {second}"
    );
    // The kept keys keep their old values in the effective configuration.
    let (_, effective) = node.admin("GET", "/admin/api/config").await;
    assert_eq!(effective["limits"]["max_channels_per_connection"], 1);
    assert_ne!(effective["limits"]["accept_queues"], 2, "{effective}");
    assert_ne!(
        effective["broker_url"], "redis://127.0.0.1:1",
        "{effective}"
    );

    // A reload with nothing changed applies nothing and still counts a version.
    let (status, again) = node.admin("POST", "/admin/api/reload").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["applied"], json!([]));
    assert_eq!(again["version"]["number"], 3);
    // GET is not a reload.
    let (status, _) = node.admin("GET", "/admin/api/reload").await;
    assert_eq!(status, 405);
}

/// `/app/{key}` on `addr`: the first frame's event (`pusher:connection_established` or
/// `pusher:error`).
async fn pusher_answer(addr: std::net::SocketAddr, key: &str) -> Value {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("tcp connect");
    let url = format!("ws://{addr}/app/{key}?protocol=7&client=raw&version=1");
    let mut c = Client::open_on(Box::new(tcp), &url, &[])
        .await
        .expect("ws handshake");
    c.next().await["event"].clone()
}

fn pusher_app(id: &str, key: &str) -> String {
    format!(
        "[[pusher.apps]]\nid = \"{id}\"\nkey = \"{key}\"\nsecret = \"{key}-secret-0123456789\"\n"
    )
}

#[tokio::test]
async fn pusher_apps_are_reloaded_all_or_nothing() {
    let first = format!(
        "{}{}",
        config(false, FIRST_SECRET, ""),
        pusher_app("1", "app-one")
    );
    let node = Reloadable::start(&first).await;
    assert_eq!(
        pusher_answer(node.addr, "app-one").await,
        "pusher:connection_established"
    );
    assert_eq!(pusher_answer(node.addr, "app-two").await, "pusher:error");

    // A second app, and another Pusher key that needs a restart.
    let second = format!(
        "{}[pusher]\nactivity_timeout_s = 30\n{}{}",
        config(false, FIRST_SECRET, ""),
        pusher_app("1", "app-one"),
        pusher_app("2", "app-two")
    );
    node.rewrite(&second);
    let (status, answer) = node.admin("POST", "/admin/api/reload").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["applied"], json!(["pusher.apps"]), "{answer}");
    assert_eq!(
        answer["not_applied"][0]["key"], "pusher.activity_timeout_s",
        "{answer}"
    );
    assert_eq!(
        pusher_answer(node.addr, "app-two").await,
        "pusher:connection_established"
    );

    // Two apps with one key: refused whole, both apps as they were.
    node.rewrite(&format!(
        "{}{}{}",
        config(false, FIRST_SECRET, ""),
        pusher_app("1", "app-one"),
        pusher_app("3", "app-one")
    ));
    let (status, answer) = node.admin("POST", "/admin/api/reload").await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        pusher_answer(node.addr, "app-two").await,
        "pusher:connection_established"
    );
}
