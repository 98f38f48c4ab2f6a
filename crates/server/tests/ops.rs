//! Operating the binary: health, metrics, graceful drain on SIGTERM, the command line, config
//! layering, TLS, and `herald token`.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use herald_testkit::eventually;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Run `herald ARGS` to completion with a clean `HERALD_*` environment plus `env`.
fn herald(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn herald");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("herald {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn health_is_ok() {
    let node = Node::dev().await;
    let (status, body) = node.http("GET", "/health", None, None).await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
}

/// `GET /ready` (a readiness probe): 200 while the node takes connections, 503 once it drains.
/// The listener closes at SIGTERM, so the 503 is seen on a keep-alive connection opened before.
#[tokio::test]
async fn ready_is_ok_then_503_while_draining() {
    let mut node = Node::start(&["--dev"], &[("HERALD_DRAIN_MS", "3000")]).await;
    let (status, body) = node.http("GET", "/ready", None, None).await;
    assert_eq!((status, body), (200, json!({"status": "ready"})));

    // One HTTP/1.1 connection kept alive across the SIGTERM.
    let mut http = TcpStream::connect(node.addr).await.unwrap();
    let before = ask_ready(&mut http).await;
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    assert!(before.ends_with(r#"{"status":"ready"}"#), "{before}");

    // A client that keeps the node draining (it is not read, so it does not finish the close).
    let _client = node.connected(&["room"]).await;
    node.sigterm();
    let started = Instant::now();
    let during = loop {
        let answer = ask_ready(&mut http).await;
        if answer.starts_with("HTTP/1.1 503") {
            break answer;
        }
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "/ready still 200 5 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(during.ends_with(r#"{"status":"draining"}"#), "{during}");
    let status = tokio::time::timeout(Duration::from_secs(10), node.process().wait())
        .await
        .expect("herald did not exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// `GET /ready` on an open HTTP/1.1 connection (kept alive): the raw answer.
async fn ask_ready(http: &mut TcpStream) -> String {
    let host = http.peer_addr().unwrap();
    http.write_all(format!("GET /ready HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.ends_with(b"}") {
        let n = tokio::time::timeout(Duration::from_secs(5), http.read(&mut buf))
            .await
            .expect("no answer to GET /ready within 5 s")
            .unwrap();
        assert!(n > 0, "connection closed: {}", text(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    text(&seen)
}

#[tokio::test]
async fn metrics_count_connections() {
    let node = Node::dev().await;
    let (status, body) = node.http("GET", "/metrics", None, None).await;
    assert_eq!(status, 200);
    let text = body.as_str().expect("text body");
    assert!(text.contains("# TYPE herald_connections gauge"), "{text}");
    assert_eq!(node.metric("herald_connections").await, 0.0);
    let accepted = node.metric("herald_connections_accepted_total").await;

    let mut c = node.connected(&["m"]).await;
    assert_eq!(node.metric("herald_connections").await, 1.0);
    assert_eq!(
        node.metric("herald_connections_accepted_total").await,
        accepted + 1.0
    );
    assert_eq!(node.metric("herald_subscriptions").await, 1.0);
    c.call("publish", json!({"channel": "m", "data": 1})).await;
    assert!(node.metric("herald_publications_total").await >= 1.0);
    drop(c);
    eventually(
        Duration::from_secs(10),
        "herald_connections back to 0 after the client left",
        || async { node.metric("herald_connections").await == 0.0 },
    )
    .await;
    assert_eq!(node.metric("herald_subscriptions").await, 0.0);
}

#[tokio::test]
async fn sigterm_drains_every_client_with_4000_and_exits_0() {
    let drain_ms = 1500u64;
    let mut node = Node::start(&["--dev"], &[("HERALD_DRAIN_MS", "1500")]).await;
    let mut clients = Vec::new();
    for i in 0..5 {
        let mut c = node.connected(&["room"]).await;
        let r = c
            .call("subscribe", json!({"channel": format!("own-{i}")}))
            .await;
        assert!(r.get("subscribe").is_some());
        clients.push(c);
    }
    let sent = Instant::now();
    node.sigterm();
    for c in &mut clients {
        let closed = c.closed().await;
        assert_eq!(closed.code, Some(4000), "{closed:?}");
        let d = closed.disconnect.expect("disconnect push");
        assert_eq!(d["code"], 4000, "{d}");
        assert_eq!(d["reconnect"], true, "{d}");
        let after = d["after_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("after_ms: {d}"));
        assert!(after < drain_ms, "after_ms {after} outside [0, {drain_ms})");
    }
    let status = tokio::time::timeout(Duration::from_secs(6), node.process().wait())
        .await
        .expect("herald did not exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    let took = sent.elapsed();
    assert!(
        took < Duration::from_millis(drain_ms) + Duration::from_secs(3),
        "exit took {took:?}"
    );
    // It no longer listens.
    assert!(TcpStream::connect(node.addr).await.is_err());
}

#[tokio::test]
async fn sigterm_with_no_clients_exits_promptly() {
    let mut node = Node::start(&["--dev"], &[("HERALD_DRAIN_MS", "10000")]).await;
    let sent = Instant::now();
    node.sigterm();
    let status = tokio::time::timeout(Duration::from_secs(5), node.process().wait())
        .await
        .expect("herald did not exit")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
}

#[tokio::test]
async fn help_and_version() {
    let out = herald(&["--help"], &[]);
    assert!(out.status.success(), "{out:?}");
    let help = text(&out.stdout);
    assert!(help.contains("serve") && help.contains("token"), "{help}");
    let out = herald(&["serve", "--help"], &[]);
    assert!(out.status.success(), "{out:?}");
    let help = text(&out.stdout);
    for flag in [
        "--dev",
        "--port",
        "--bind",
        "--config",
        "--tls-cert",
        "--tls-key",
    ] {
        assert!(help.contains(flag), "serve --help lacks {flag}: {help}");
    }
    let out = herald(&["token", "--help"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("--sub"));
    let out = herald(&["--version"], &[]);
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("herald "), "{out:?}");
    // Unknown flags fail.
    let out = herald(&["serve", "--no-such-flag"], &[]);
    assert!(!out.status.success());
}

#[tokio::test]
async fn dev_refuses_a_public_bind() {
    for bind in ["0.0.0.0", "::", "192.0.2.1"] {
        let out = herald(&["serve", "--dev", "--bind", bind, "--port", "0"], &[]);
        assert!(
            !out.status.success(),
            "--dev --bind {bind} started: {out:?}"
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("loopback") && err.contains(bind),
            "unclear message for {bind}: {err}"
        );
        assert!(out.stdout.is_empty(), "it must not listen: {out:?}");
    }
    let out = herald(
        &["serve", "--dev", "--bind", "localhost", "--port", "0"],
        &[],
    );
    assert!(!out.status.success());
    let out = herald(&["serve", "--config", "/no/such/herald.toml"], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/no/such/herald.toml"),
        "{out:?}"
    );
    let bad = config_file("bad.toml", "prot = 8000\n");
    let out = herald(&["serve", "--config", &bad, "--port", "0"], &[]);
    assert!(!out.status.success(), "a typo in the file must be refused");
    assert!(text(&out.stderr).contains("prot"), "{out:?}");
}

#[tokio::test]
async fn broker_tables_reach_the_brokers() {
    // A typo in the [redis] / [nats] table is refused by the broker's own config, so the table
    // really is handed over.
    for (url, table) in [
        ("redis://127.0.0.1:1", "redis"),
        ("nats://127.0.0.1:1", "nats"),
    ] {
        let cfg = config_file(
            "broker.toml",
            &format!("broker_url = \"{url}\"\n[{table}]\nno_such_key = 1\n"),
        );
        let out = herald(&["serve", "--config", &cfg, "--port", "0"], &[]);
        assert!(!out.status.success(), "{out:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("invalid [{table}] table")) && err.contains("no_such_key"),
            "{err}"
        );
    }
    let out = herald(
        &["serve", "--port", "0"],
        &[("HERALD_BROKER_URL", "carrier-pigeon://x")],
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown broker"), "{out:?}");
}

#[tokio::test]
async fn config_file_sets_namespaces_and_env_overrides_it() {
    let cfg = config_file(
        "herald.toml",
        r#"
        allow_anonymous = true
        ping_interval_s = 30
        node_name = "from-file"

        [limits]
        max_channels_per_connection = 50

        [default_namespace]
        subscribe = "anonymous"
        publish = false

        [[namespaces]]
        name = "chat"
        subscribe = "anonymous"
        publish = true
        presence = true
        "#,
    );
    let node = Node::start(
        &["--config", &cfg],
        &[
            ("HERALD_PING_INTERVAL_S", "7"),
            ("HERALD_DEFAULT_NAMESPACE__PUBLISH", "true"),
            ("HERALD_LIMITS__MAX_CHANNELS_PER_CONNECTION", "2"),
        ],
    )
    .await;
    let mut c = node.client().await;
    let r = c.call("connect", json!({})).await;
    assert_eq!(r["connect"]["ping_interval"], 7, "env wins over the file");
    assert_eq!(r["connect"]["node"], "from-file", "file wins over defaults");
    // The file's namespace exists, with its settings.
    let r = c.call("subscribe", json!({"channel": "chat:lobby"})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = c.call("presence", json!({"channel": "chat:lobby"})).await;
    assert!(r.get("presence").is_some(), "{r}");
    let r = c.call("subscribe", json!({"channel": "other:x"})).await;
    assert_eq!(r["error"]["code"], 102, "{r}");
    // Env merged into the file's section: publish turned on, subscribe kept.
    let r = c
        .call("publish", json!({"channel": "plain", "data": 1}))
        .await;
    assert_eq!(r["publish"]["offset"], 1, "{r}");
    let r = c.call("subscribe", json!({"channel": "plain"})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = c.call("subscribe", json!({"channel": "plain2"})).await;
    assert_eq!(r["error"]["code"], 106, "env limit 2 wins over 50: {r}");
}

/// A TLS connection to the node, verified against the fixture certificate.
async fn tls(node: &Node) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(node.addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tls_connector()
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// One HTTPS request; status and JSON body.
async fn https(node: &Node, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut s = tls(node).await;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    // A peer that skips close_notify ends in an error after the data; what was read counts.
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.into())),
    )
}

#[tokio::test]
async fn tls_serves_https_and_wss() {
    let cert = fixture("tls_cert.pem");
    let key = fixture("tls_key.pem");
    let node = Node::start(&["--dev", "--tls-cert", &cert, "--tls-key", &key], &[]).await;
    assert!(node.tls, "the listening line says https://");

    let (status, body) = https(&node, "GET", "/health", None).await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));

    let stream = tls(&node).await;
    let mut c = Client::open_on(Box::new(stream), "wss://localhost/ws", &[])
        .await
        .expect("WebSocket over TLS");
    let r = c.call("connect", json!({"subs": {"secure": {}}})).await;
    assert!(r["connect"]["subs"]["secure"]["epoch"].is_string(), "{r}");
    assert_eq!(c.push("join").await["channel"], "secure");
    let (status, r) = https(
        &node,
        "POST",
        "/api/publish",
        Some(json!({"channel": "secure", "data": {"over": "tls"}})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        c.push("pub").await,
        json!({"channel": "secure", "offset": 1, "data": {"over": "tls"}})
    );

    // SSE over TLS (served on the raw connection, uni/direct.rs): each event arrives as written,
    // not held in the TLS layer's buffer.
    let mut sse = tls(&node).await;
    sse.write_all(b"GET /connection/sse?channel=secure HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let mut published = false;
    while !seen.contains("\"data\":{\"again\":\"tls\"}") {
        if !published && seen.contains("event: connected") {
            published = true;
            let (status, r) = https(
                &node,
                "POST",
                "/api/publish",
                Some(json!({"channel": "secure", "data": {"again": "tls"}})),
            )
            .await;
            assert_eq!(status, 200, "{r}");
        }
        let n = tokio::time::timeout(Duration::from_secs(10), sse.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("SSE over TLS stalled: {seen:?}"))
            .unwrap();
        assert!(n > 0, "SSE over TLS ended: {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200 OK\r\n"), "{seen:?}");
    assert_eq!(
        c.push("join").await["channel"],
        "secure",
        "the SSE client joined"
    );
    assert_eq!(c.push("pub").await["data"], json!({"again": "tls"}));

    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(node.addr).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut raw)).await;
    assert!(!String::from_utf8_lossy(&raw).contains("200 OK"));
    // The TLS client still works.
    let r = c.call("presence", json!({"channel": "secure"})).await;
    assert!(r.get("presence").is_some(), "{r}");
}

/// A client that comes back resumes its TLS session with the node's ticket (no certificate sent
/// again), even after more clients than a session cache would hold came and went (a reconnect
/// storm); a ticket from another node, whose key differs, falls back to a full handshake.
#[tokio::test]
async fn tls_sessions_resume_on_the_issuing_node() {
    use rustls::HandshakeKind::{Full, Resumed};
    let cert = fixture("tls_cert.pem");
    let key = fixture("tls_key.pem");
    let flags = ["--dev", "--tls-cert", &cert, "--tls-key", &key];
    let (a, b) = tokio::join!(Node::start(&flags, &[]), Node::start(&flags, &[]));
    // One connector: its session store (keyed by the name "localhost") is shared by every
    // connection below, as a browser's is.
    let connector = tls_connector();
    let handshake = |node: &Node| {
        let connector = connector.clone();
        let addr = node.addr;
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
            let kind = s.get_ref().1.handshake_kind();
            // The ticket arrives after the handshake: read the answer to take it in.
            s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut raw = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
            assert!(
                String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"),
                "{raw:?}"
            );
            kind
        }
    };
    assert_eq!(handshake(&a).await, Some(Full), "first visit");
    // 300 other clients: more than the 256 sessions rustls' default server cache would keep.
    let others = tls_connector();
    for _ in 0..300 {
        let tcp = TcpStream::connect(a.addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        others.connect(name, tcp).await.expect("TLS handshake");
    }
    assert_eq!(handshake(&a).await, Some(Resumed), "back to the same node");
    let (_, metrics) = https(&a, "GET", "/metrics", None).await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        metrics.contains("herald_tls_resumed_total 1\n"),
        "the node counts the resumed handshake: {metrics}"
    );
    assert_eq!(
        handshake(&b).await,
        Some(Full),
        "another node cannot read the ticket: a full handshake, not a failure"
    );
}

#[tokio::test]
async fn tls_flags_go_together_and_bad_files_fail() {
    let out = herald(
        &[
            "serve",
            "--dev",
            "--port",
            "0",
            "--tls-cert",
            &fixture("tls_cert.pem"),
        ],
        &[],
    );
    assert!(!out.status.success(), "--tls-cert without --tls-key");
    let out = herald(
        &[
            "serve",
            "--dev",
            "--port",
            "0",
            "--tls-cert",
            &fixture("tls_cert.pem"),
            "--tls-key",
            &fixture("rsa_public.pem"),
        ],
        &[],
    );
    assert!(
        !out.status.success(),
        "a public key is no private key: {out:?}"
    );
}

#[tokio::test]
async fn herald_token_prints_a_working_token() {
    let out = herald(
        &[
            "token",
            "--sub",
            "alice",
            "--secret",
            "s",
            "--expires-in",
            "600",
            "--channels",
            "news,alerts",
            "--info",
            r#"{"name":"Alice"}"#,
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let t = text(&out.stdout).trim().to_owned();
    assert_eq!(t.split('.').count(), 3, "a JWT: {t}");

    let cfg = config_file(
        "herald.toml",
        "[default_namespace]\nsubscribe = \"authenticated\"\npresence = true\n\n[[namespaces]]\nname = \"priv\"\nsubscribe = \"token\"\n",
    );
    let node = Node::start(&["--config", &cfg], &[("HERALD_TOKEN_HMAC_SECRET", "s")]).await;
    let mut c = node.client().await;
    let r = c.call("connect", json!({"token": t})).await;
    let res = &r["connect"];
    let secs = res["expires_in"].as_u64().unwrap_or_else(|| panic!("{r}"));
    assert!((598..=600).contains(&secs), "{r}");
    assert!(res["subs"]["news"]["epoch"].is_string(), "{r}");
    assert!(res["subs"]["alerts"]["epoch"].is_string(), "{r}");
    let (_, p) = node
        .api("/api/presence", Some(json!({"channel": "news"})))
        .await;
    let entry = p["clients"][res["client"].as_str().unwrap()].clone();
    assert_eq!(entry, json!({"user": "alice", "info": {"name": "Alice"}}));

    // The secret may come from the environment; a plain token has no exp.
    let out = herald(
        &["token", "--sub", "bob"],
        &[("HERALD_TOKEN_HMAC_SECRET", "s")],
    );
    assert!(out.status.success(), "{out:?}");
    let mut c = node.client().await;
    let r = c
        .call("connect", json!({"token": text(&out.stdout).trim()}))
        .await;
    assert!(r["connect"]["client"].is_string(), "{r}");
    assert!(r["connect"].get("expires_in").is_none(), "{r}");
    // A subscription token for a channel.
    let r = c.call("subscribe", json!({"channel": "priv:x"})).await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    let out = herald(
        &[
            "token",
            "--sub",
            "bob",
            "--channel",
            "priv:x",
            "--secret",
            "s",
        ],
        &[],
    );
    assert!(out.status.success());
    let r = c
        .call(
            "subscribe",
            json!({"channel": "priv:x", "token": text(&out.stdout).trim()}),
        )
        .await;
    assert!(r["subscribe"]["epoch"].is_string(), "{r}");
    // Signed with another secret, it is refused.
    let out = herald(&["token", "--sub", "eve", "--secret", "other"], &[]);
    let mut c = node.client().await;
    let r = c
        .call("connect", json!({"token": text(&out.stdout).trim()}))
        .await;
    assert_eq!(r["error"]["code"], 101, "{r}");
    // Without a secret it fails.
    let out = herald(&["token", "--sub", "x"], &[]);
    assert!(!out.status.success());
}

/// The node binds several listeners on its port (`limits.accept_queues`, `SO_REUSEPORT`): a
/// second node started on the same port must still be refused, not join the first one's group
/// and take half its connections.
#[tokio::test]
async fn a_port_in_use_is_refused() {
    let node = Node::dev().await;
    let port = node.addr.port().to_string();
    for queues in ["8", "1"] {
        let out = herald(
            &["serve", "--dev", "--port", &port],
            &[("HERALD_LIMITS__ACCEPT_QUEUES", queues)],
        );
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "accept_queues={queues}: {stderr}");
        assert!(
            stderr.contains("binding"),
            "accept_queues={queues}: {stderr}"
        );
    }
    // The first node is unharmed and still takes every connection.
    for _ in 0..16 {
        let mut client = node.connected(&["room"]).await;
        client.ws_ping().await;
    }
}

/// Out of descriptors (EMFILE), the node keeps its accept loops: connections wait in the kernel's
/// queue and are taken once descriptors are free again, and the failures are logged about once
/// a second, not by every loop every 50 ms.
#[tokio::test]
async fn accepting_survives_running_out_of_descriptors() {
    use tokio::io::AsyncBufReadExt;
    // A hard limit of 64 descriptors: about 40 left for connections after the node's own.
    let mut cmd = tokio::process::Command::new("prlimit");
    cmd.args(["--nofile=64:64", "--"])
        .arg(herald_bin())
        .args(["serve", "--dev", "--port", "0"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    let mut node = cmd
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("prlimit (util-linux) runs the node");
    let mut stdout = tokio::io::BufReader::new(node.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(std::time::Duration::from_secs(15), stdout.next_line())
        .await
        .expect("herald (under prlimit) did not start within 15 s")
        .unwrap()
        .expect("listening line");
    let addr: std::net::SocketAddr = line
        .split_whitespace()
        .nth(3)
        .and_then(|u| u.strip_prefix("http://"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("listening line: {line}"));
    let mut stderr = node.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });

    // 100 idle connections: more than the node has descriptors for.
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Held for 1.5 s (the point): the log must show about one failure line a second over it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(held);

    // Once they are gone, the node answers again.
    eventually(
        Duration::from_secs(10),
        "a 200 from /health once the descriptors are free again",
        || async {
            let answer = async {
                let mut s = TcpStream::connect(addr).await.ok()?;
                s.write_all(
                    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                )
                .await
                .ok()?;
                let mut raw = Vec::new();
                s.read_to_end(&mut raw).await.ok()?;
                Some(String::from_utf8_lossy(&raw).into_owned())
            };
            let answer = tokio::time::timeout(Duration::from_secs(2), answer).await;
            matches!(&answer, Ok(Some(text)) if text.starts_with("HTTP/1.1 200"))
        },
    )
    .await;
    node.kill().await.unwrap();
    let log = log.await.unwrap();
    let failures = log.matches("accept failed").count();
    assert!(
        failures >= 1,
        "the node never ran out of descriptors: {log}"
    );
    assert!(
        failures <= 4,
        "{failures} lines in 1.5 s: accept failures are logged once a second\n{log}"
    );
}
