//! One harness for every test that drives the real `herald` binary: a node on a free port (alone,
//! or one of several on a shared broker), plain HTTP for its API and `/metrics`, SSE streams read
//! by `curl`, tokens, config files and the TLS fixture. The protocol client is [`crate::client`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::client::Client;

/// The API key every test node is started with (`HERALD_API_KEY`).
pub const API_KEY: &str = "testkey";
/// The HMAC secret test tokens are signed with (`HERALD_TOKEN_HMAC_SECRET`).
pub const SECRET: &str = "test-hmac-secret";
/// How long the harness waits for a node, a reply or a read before giving up.
pub(crate) const WAIT: Duration = Duration::from_secs(15);

/// A file of the server's test fixtures (`crates/server/tests/fixtures`).
pub fn fixture(name: &str) -> String {
    format!(
        "{}/../server/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The herald binary: `HERALD_BIN`, else `<target>/debug/herald` after `cargo build -p
/// herald-server` (a no-op when it is fresh, so a stale binary is never tested), once per process.
pub fn herald_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("HERALD_BIN") {
            return PathBuf::from(bin);
        }
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build
            .args(["build", "-p", "herald-server", "--bin", "herald"])
            .current_dir(&workspace)
            .env("CARGO_TARGET_DIR", &target);
        // Cargo gives a test process its package's CARGO_PKG_*, CARGO_MANIFEST_DIR, …; build
        // scripts (ring's) watch those names, so passing them on would rebuild half the tree here
        // and again in the next ordinary build.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            let injected = [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_CFG_",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ];
            if injected.iter().any(|p| key.starts_with(p)) {
                build.env_remove(key.as_ref());
            }
        }
        let status = build.status().expect("run cargo build -p herald-server");
        let bin = target.join("debug").join("herald");
        // The working tree is shared: a half-edited server may not build for a moment.
        assert!(
            status.success() || bin.exists(),
            "cargo build -p herald-server failed and there is no earlier binary"
        );
        if !status.success() {
            eprintln!("cargo build -p herald-server failed; testing the earlier binary");
        }
        assert!(
            bin.exists(),
            "no herald binary at {} (set HERALD_BIN)",
            bin.display()
        );
        bin
    })
    .clone()
}

/// A running `herald serve`, killed on drop.
pub struct Node {
    /// The node's name (`HERALD_NODE_NAME`; `herald` when not set).
    pub name: String,
    child: Option<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Whether it listens with TLS (the listening line says `https://`).
    pub tls: bool,
}

impl Node {
    /// `herald serve --dev` with the test API key and HMAC secret.
    pub async fn dev() -> Node {
        Node::start(&["--dev"], &[]).await
    }

    /// Node `name` (`--dev`) on a free port against the broker at `broker_url`.
    pub async fn on_broker(name: &str, broker_url: &str) -> Node {
        Node::on_broker_with(name, broker_url, &[]).await
    }

    /// Like [`on_broker`](Self::on_broker), with extra `HERALD_*` settings (e.g.
    /// `HERALD_NATS__REPLICAS`).
    pub async fn on_broker_with(name: &str, broker_url: &str, env: &[(&str, &str)]) -> Node {
        let mut all = vec![
            ("HERALD_BROKER_URL", broker_url),
            ("HERALD_NODE_NAME", name),
        ];
        all.extend_from_slice(env);
        Node::start(&["--dev"], &all).await
    }

    /// `herald serve` with extra flags and environment, on a free port unless `--port` is given.
    /// `HERALD_API_KEY` and the HMAC secret are set unless `env` overrides them; no other
    /// `HERALD_*` variable of the test's own environment reaches the node. `HERALD_TEST_LOG`
    /// sets its `RUST_LOG` (default `warn`).
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Node {
        let mut cmd = Command::new(herald_bin());
        cmd.arg("serve").args(args);
        if !args.contains(&"--port") {
            cmd.args(["--port", "0"]);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("HERALD_API_KEY", API_KEY)
            .env("HERALD_TOKEN_HMAC_SECRET", SECRET)
            .env(
                "RUST_LOG",
                std::env::var("HERALD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            );
        cmd.envs(env.iter().copied());
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn herald");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("herald did not start in time")
            .expect("read stdout")
            .expect("herald exited before listening");
        // "herald listening on http://127.0.0.1:PORT (WebSocket ws://…/ws)"
        let url = line.split_whitespace().nth(3).expect("listening line");
        let tls = url.starts_with("https://");
        let addr = url
            .split("://")
            .nth(1)
            .expect("url")
            .parse()
            .expect("address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let name = env
            .iter()
            .find(|(k, _)| *k == "HERALD_NODE_NAME")
            .map_or("herald", |(_, v)| v);
        Node {
            name: name.to_owned(),
            child: Some(child),
            addr,
            tls,
        }
    }

    /// A handle on a node started elsewhere (for another task); it does not own the process.
    pub fn attach(name: &str, addr: SocketAddr) -> Node {
        Node {
            name: name.to_owned(),
            child: None,
            addr,
            tls: false,
        }
    }

    /// The node's process (not for an [`attach`](Self::attach)ed handle).
    pub fn process(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("an attached node has no process here")
    }

    /// Kill the process at once (a crash).
    pub async fn kill(mut self) {
        if let Some(child) = self.child.as_mut() {
            // SIGKILL, then reap: bounded, so a process stuck in the kernel fails the test.
            let _ = tokio::time::timeout(WAIT, child.kill())
                .await
                .unwrap_or_else(|_| {
                    panic!("{} did not exit within {WAIT:?} of SIGKILL", self.name)
                });
        }
    }

    /// Send SIGTERM (a graceful stop: the node drains).
    pub fn sigterm(&self) {
        let pid = self.child.as_ref().and_then(Child::id).expect("pid");
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
    }

    /// The process's resident memory in KiB (Linux `/proc`); `None` when it is not ours or gone.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The WebSocket endpoint.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// A protocol client that has not sent anything yet.
    pub async fn client(&self) -> Client {
        Client::open(self.addr, &[]).await
    }

    /// A client connected anonymously (dev mode) with these subscriptions (no options).
    pub async fn connected(&self, channels: &[&str]) -> Client {
        let subs: serde_json::Map<String, Value> = channels
            .iter()
            .map(|ch| (ch.to_string(), json!({})))
            .collect();
        self.subscriber(Value::Object(subs)).await
    }

    /// A client connected anonymously with `subs` (channel → subscribe options, e.g. `since`);
    /// the reply is in [`Client::connect_reply`].
    pub async fn subscriber(&self, subs: Value) -> Client {
        self.try_subscriber(subs)
            .await
            .unwrap_or_else(|why| panic!("connect on {}: {why}", self.name))
    }

    /// Like [`subscriber`](Self::subscriber), but the node may be down or refuse: why not.
    pub async fn try_subscriber(&self, subs: Value) -> Result<Client, String> {
        let tcp = tokio::time::timeout(WAIT, TcpStream::connect(self.addr))
            .await
            .map_err(|_| "connect timeout".to_owned())?
            .map_err(|e| format!("connect: {e}"))?;
        let mut c =
            tokio::time::timeout(WAIT, Client::handshake(Box::new(tcp), &self.ws_url(), &[]))
                .await
                .map_err(|_| "handshake timeout".to_owned())?
                .map_err(|e| format!("handshake: {e}"))?;
        let reply = c
            .try_call("connect", json!({ "subs": subs }))
            .await
            .ok_or("closed before the connect reply")?;
        if reply.get("connect").is_none() {
            return Err(format!("refused: {reply}"));
        }
        c.connect_reply = reply["connect"].clone();
        Ok(c)
    }

    /// A copyable handle for HTTP calls (usable from spawned tasks).
    pub fn api_handle(&self) -> Api {
        Api(self.addr)
    }

    /// Call the HTTP API with the test key: POST with a body, GET without.
    pub async fn api(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        self.api_handle().api(path, body).await
    }

    /// Raw HTTP request; returns status and JSON body (or the body as a string).
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        key: Option<&str>,
    ) -> (u16, Value) {
        self.api_handle().http(method, path, body, key).await
    }

    /// HTTP with the test key that may fail (the node was killed, the connection reset).
    pub async fn try_http(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let body = body.map(|b| b.to_string());
        self.api_handle()
            .try_http(method, path, body, Some(API_KEY))
            .await
    }

    /// `POST /api/publish`, asserting success; the reply (`epoch`, `offset`).
    pub async fn publish(&self, channel: &str, data: Value) -> Value {
        self.api_handle().publish(channel, data).await
    }

    /// `POST /api/publish` with an optional idempotency key; (status, body).
    pub async fn try_publish(&self, channel: &str, data: Value, key: Option<&str>) -> (u16, Value) {
        let mut body = json!({"channel": channel, "data": data});
        if let Some(key) = key {
            body["idempotency_key"] = json!(key);
        }
        self.api("/api/publish", Some(body)).await
    }

    /// A metric's value from `/metrics` (the first line `name` or `name{…}`).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.http("GET", "/metrics", None, None).await;
        let text = body.as_str().unwrap_or_default().to_owned();
        text.lines()
            .find(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} not found on {}", self.name))
    }
}

/// HTTP calls to a node.
#[derive(Clone, Copy)]
pub struct Api(pub SocketAddr);

impl Api {
    /// Call the HTTP API with the test key: POST with a body, GET without.
    pub async fn api(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        self.http(
            if body.is_some() { "POST" } else { "GET" },
            path,
            body.map(|b| b.to_string()),
            Some(API_KEY),
        )
        .await
    }

    /// Raw HTTP request; returns status and JSON body (or the body as a string).
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        key: Option<&str>,
    ) -> (u16, Value) {
        self.try_http(method, path, body, key)
            .await
            .unwrap_or_else(|why| panic!("{method} {path}: {why}"))
    }

    /// Raw HTTP that may fail: `Err` says why.
    pub async fn try_http(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        key: Option<&str>,
    ) -> Result<(u16, Value), String> {
        let mut stream = tokio::time::timeout(WAIT, TcpStream::connect(self.0))
            .await
            .map_err(|_| "connect timeout".to_owned())?
            .map_err(|e| format!("connect: {e}"))?;
        let body = body.unwrap_or_default();
        let auth = key
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tokio::time::timeout(WAIT, stream.write_all(req.as_bytes()))
            .await
            .map_err(|_| "write timeout".to_owned())?
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
            .await
            .map_err(|_| "timeout".to_owned())?
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&raw);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line in {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
        Ok((status, value))
    }

    /// `POST /api/publish`, asserting success; the reply.
    pub async fn publish(&self, channel: &str, data: Value) -> Value {
        let (status, body) = self
            .api(
                "/api/publish",
                Some(json!({"channel": channel, "data": data})),
            )
            .await;
        assert_eq!(status, 200, "publish failed: {body}");
        body
    }
}

/// A raw SSE client of `channel` on `node` that sends its request and never reads, with a 4 KiB
/// receive buffer: the node's writes to it soon block (a slow consumer).
pub async fn stuck_sse_reader(node: &Node, channel: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let mut stuck = tokio::time::timeout(WAIT, socket.connect(node.addr))
        .await
        .expect("connect within the wait")
        .expect("connect");
    let request =
        format!("GET /connection/sse?channel={channel} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    tokio::time::timeout(WAIT, stuck.write_all(request.as_bytes()))
        .await
        .expect("send the request within the wait")
        .expect("send the request");
    stuck
}

/// `total` publications of 8,000 bytes each on `channel`, from two publishers at once (far more
/// than kernel buffers hold); join the handles with [`crate::joined`].
pub fn flood(node: &Node, channel: &str, total: u64) -> Vec<tokio::task::JoinHandle<()>> {
    (0..2)
        .map(|_| {
            let api = node.api_handle();
            let channel = channel.to_owned();
            let pad = "x".repeat(8000);
            tokio::spawn(async move {
                for _ in 0..total / 2 {
                    api.publish(&channel, json!(pad)).await;
                }
            })
        })
        .collect()
}

/// Sign an HS256 token with the test secret.
pub fn token(claims: Value) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("sign a token")
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A config file in its own temp directory, removed when this is dropped: keep it alive as long
/// as the node that reads it. Derefs to the file's path.
pub struct ConfigFile {
    path: String,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for ConfigFile {
    type Target = str;
    fn deref(&self) -> &str {
        &self.path
    }
}

/// Write a TOML config into a temp file named `name`.
pub fn config_file(name: &str, toml: &str) -> ConfigFile {
    let dir = tempfile::Builder::new()
        .prefix("herald-test-")
        .tempdir()
        .expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, toml).expect("write the config");
    ConfigFile {
        path: path.to_string_lossy().into_owned(),
        _dir: dir,
    }
}

/// TLS connector trusting the fixture certificate.
pub fn tls_connector() -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(fixture("tls_cert.pem"))
        .expect("the fixture certificate")
    {
        roots.add(cert.expect("a certificate")).expect("add root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// An SSE stream read by `curl -sN`, as a script or a proxy-bound consumer would.
pub struct Sse {
    _child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

/// One SSE event: its name (empty for publications), its `id` and its `data`.
pub type SseEvent = (String, Option<String>, Value);

impl Node {
    /// `GET /connection/sse?{query}`, resuming from `last_event_id` when given.
    pub fn sse(&self, query: &str, last_event_id: Option<&str>) -> Sse {
        let url = format!("http://{}/connection/sse?{query}", self.addr);
        let mut cmd = Command::new("curl");
        cmd.args(["-sN", "--no-buffer"]);
        if let Some(id) = last_event_id {
            cmd.args(["-H", &format!("Last-Event-ID: {id}")]);
        }
        let mut child = cmd
            .arg(url)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("curl (apt-get install curl)");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Sse {
            _child: child,
            lines,
        }
    }
}

impl Sse {
    /// The next event with data; panics if none comes within the harness's wait.
    pub async fn event(&mut self) -> SseEvent {
        let (mut name, mut id, mut data) = (String::new(), None, None::<String>);
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line())
                .await
                .expect("an SSE line in time")
                .expect("read")
                .expect("the SSE stream ended");
            if line.is_empty() {
                if let Some(data) = data.take() {
                    let data = serde_json::from_str(&data).expect("SSE data is JSON");
                    return (name, id, data);
                }
                continue; // a comment, a retry hint or an id-only block
            }
            if let Some(v) = line.strip_prefix("event: ") {
                name = v.to_owned();
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_owned());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(v.to_owned());
            }
        }
    }

    /// The next publication (unnamed event), skipping named ones: its id and body.
    pub async fn publication(&mut self) -> (String, Value) {
        loop {
            let (name, id, data) = self.event().await;
            if name.is_empty() {
                return (id.expect("publications carry an id"), data);
            }
        }
    }
}
