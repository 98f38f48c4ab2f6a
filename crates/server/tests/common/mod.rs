//! Test harness: the real `herald` binary on a free port, a WebSocket client that follows
//! docs/protocol.md literally, and a plain HTTP client for the API.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_websockets::{ClientBuilder, Message, WebSocketStream};

pub(crate) const API_KEY: &str = "testkey";
pub(crate) const SECRET: &str = "test-hmac-secret";
const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A running `herald serve`, killed on drop.
pub(crate) struct Node {
    pub child: Child,
    pub addr: SocketAddr,
    pub tls: bool,
}

impl Node {
    /// `herald serve --dev` with the test API key and HMAC secret.
    pub(crate) async fn dev() -> Node {
        Node::start(&["--dev"], &[]).await
    }

    /// Start with extra flags and environment (`HERALD_API_KEY` and the HMAC secret are set
    /// unless `env` overrides them).
    pub(crate) async fn start(args: &[&str], env: &[(&str, &str)]) -> Node {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
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
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
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
        let addr = url.split("://").nth(1).unwrap().parse().expect("address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Node { child, addr, tls }
    }

    pub(crate) fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// A client that has not sent anything yet.
    pub(crate) async fn client(&self) -> Client {
        Client::open(self.addr, &[]).await
    }

    /// A client connected anonymously (dev mode) with these subscriptions.
    pub(crate) async fn connected(&self, channels: &[&str]) -> Client {
        let mut c = self.client().await;
        let subs: serde_json::Map<String, Value> = channels
            .iter()
            .map(|ch| (ch.to_string(), json!({})))
            .collect();
        let r = c.call("connect", json!({ "subs": subs })).await;
        assert!(r.get("connect").is_some(), "connect failed: {r}");
        c
    }

    /// A copyable handle for HTTP calls (usable from spawned tasks).
    pub(crate) fn api_handle(&self) -> Api {
        Api(self.addr)
    }

    /// Call the HTTP API with the test key.
    pub(crate) async fn api(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        self.api_handle().api(path, body).await
    }

    /// Raw HTTP request; returns status and JSON body (or the body as a string).
    pub(crate) async fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        key: Option<&str>,
    ) -> (u16, Value) {
        self.api_handle().http(method, path, body, key).await
    }

    pub(crate) async fn publish(&self, channel: &str, data: Value) -> Value {
        self.api_handle().publish(channel, data).await
    }

    /// Send SIGTERM.
    pub(crate) fn sigterm(&self) {
        let pid = self.child.id().expect("pid");
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
    }

    /// A metric's value from /metrics.
    pub(crate) async fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.http("GET", "/metrics", None, None).await;
        let text = body.as_str().unwrap_or_default().to_owned();
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} not found"))
    }
}

/// HTTP calls to a node.
#[derive(Clone, Copy)]
pub(crate) struct Api(pub SocketAddr);

impl Api {
    /// Call the HTTP API with the test key.
    pub(crate) async fn api(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        self.http(
            if body.is_some() { "POST" } else { "GET" },
            path,
            body.map(|b| b.to_string()),
            Some(API_KEY),
        )
        .await
    }

    /// Raw HTTP request; returns status and JSON body (or the body as a string).
    pub(crate) async fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        key: Option<&str>,
    ) -> (u16, Value) {
        let mut stream = TcpStream::connect(self.0).await.expect("connect API");
        let body = body.unwrap_or_default();
        let auth = key
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
            .await
            .expect("API timeout")
            .unwrap();
        let text = String::from_utf8_lossy(&raw);
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
        (status, value)
    }

    pub(crate) async fn publish(&self, channel: &str, data: Value) -> Value {
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

pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How a connection ended.
#[derive(Debug)]
pub(crate) struct Closed {
    /// The `disconnect` push, if one came.
    pub disconnect: Option<Value>,
    /// The close frame's code, if one came.
    pub code: Option<u16>,
}

/// A protocol client: splits newline-batched frames, answers pings unless told not to.
pub(crate) struct Client {
    pub ws: WebSocketStream<Box<dyn Io>>,
    pending: VecDeque<Value>,
    next_id: u64,
    pub auto_pong: bool,
    pub close_code: Option<u16>,
}

impl Client {
    pub(crate) async fn open(addr: SocketAddr, headers: &[(&str, &str)]) -> Client {
        let tcp = TcpStream::connect(addr).await.expect("tcp connect");
        Client::open_on(Box::new(tcp), &format!("ws://{addr}/ws"), headers)
            .await
            .expect("ws handshake")
    }

    pub(crate) async fn open_on(
        io: Box<dyn Io>,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Client, tokio_websockets::Error> {
        let mut builder = ClientBuilder::from_uri(url.parse().unwrap());
        for (k, v) in headers {
            builder = builder
                .add_header(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(v).unwrap(),
                )
                .unwrap();
        }
        let (ws, _) = builder.connect_on(io).await?;
        Ok(Client {
            ws,
            pending: VecDeque::new(),
            next_id: 1,
            auto_pong: true,
            close_code: None,
        })
    }

    pub(crate) async fn send_raw(&mut self, text: &str) {
        self.ws
            .send(Message::text(text.to_owned()))
            .await
            .expect("send");
    }

    /// Send a text frame; false when the connection is already gone (fuzzing sends into
    /// connections the server may have closed).
    pub(crate) async fn try_send_raw(&mut self, text: &str) -> bool {
        self.ws.send(Message::text(text.to_owned())).await.is_ok()
    }

    /// Send a command; returns its id.
    pub(crate) async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_raw(&json!({ "id": id, method: params }).to_string())
            .await;
        id
    }

    /// Send a command and wait for its reply; pushes that arrive meanwhile are kept in order.
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.reply(id).await
    }

    /// Wait for the reply to `id`; other messages stay queued in order.
    pub(crate) async fn reply(&mut self, id: u64) -> Value {
        loop {
            if let Some(pos) = self.pending.iter().position(|m| m["id"] == id) {
                return self.pending.remove(pos).unwrap();
            }
            if !self.fill().await {
                panic!(
                    "closed while waiting for reply {id} (code {:?})",
                    self.close_code
                );
            }
        }
    }

    /// The next message (reply or push), panicking after 10 s.
    pub(crate) async fn next(&mut self) -> Value {
        match tokio::time::timeout(WAIT, self.next_or_closed()).await {
            Ok(Some(m)) => m,
            Ok(None) => panic!("connection closed (code {:?})", self.close_code),
            Err(_) => panic!("no message within {WAIT:?}"),
        }
    }

    /// The next message, or None when the connection closed.
    pub(crate) async fn next_or_closed(&mut self) -> Option<Value> {
        if let Some(m) = self.pending.pop_front() {
            return Some(m);
        }
        self.read().await
    }

    /// Wait up to `d` for a message; None if nothing came.
    pub(crate) async fn try_next(&mut self, d: Duration) -> Option<Value> {
        tokio::time::timeout(d, self.next_or_closed())
            .await
            .ok()
            .flatten()
    }

    /// Next push with this key (skipping nothing: panics if another message comes first).
    pub(crate) async fn push(&mut self, key: &str) -> Value {
        let m = self.next().await;
        assert!(m.get(key).is_some(), "expected a {key} push, got {m}");
        m[key].clone()
    }

    async fn read(&mut self) -> Option<Value> {
        loop {
            if let Some(m) = self.pending.pop_front() {
                return Some(m);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Read one WebSocket message into `pending` (split on newlines, pings answered). Returns
    /// false once the connection is closed.
    async fn fill(&mut self) -> bool {
        if self.close_code.is_some() {
            return false;
        }
        let msg = tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("read timed out");
        let msg = match msg {
            Some(Ok(m)) => m,
            _ => {
                self.close_code.get_or_insert(1006);
                return false;
            }
        };
        if let Some((code, _)) = msg.as_close() {
            self.close_code = Some(u16::from(code));
            return false;
        }
        let Some(text) = msg.as_text() else {
            return true;
        };
        let mut batch = Vec::new();
        for line in text.split('\n').filter(|l| !l.is_empty()) {
            batch.push(
                serde_json::from_str::<Value>(line)
                    .unwrap_or_else(|e| panic!("bad JSON from server {line:?}: {e}")),
            );
        }
        for m in batch {
            if m == json!({}) && self.auto_pong {
                self.send_raw("{}").await;
                continue;
            }
            self.pending.push_back(m);
        }
        true
    }

    /// Send a WebSocket-level ping frame (not the protocol's `{}`).
    pub(crate) async fn ws_ping(&mut self) {
        let _ = self
            .ws
            .send(tokio_websockets::Message::ping(bytes::Bytes::new()))
            .await;
    }

    /// Read until the connection closes; returns the disconnect push and close code.
    pub(crate) async fn closed(&mut self) -> Closed {
        let mut disconnect = None;
        while let Some(m) = tokio::time::timeout(WAIT, self.next_or_closed())
            .await
            .expect("not closed in time")
        {
            if let Some(d) = m.get("disconnect") {
                disconnect = Some(d.clone());
            }
        }
        Closed {
            disconnect,
            code: self.close_code,
        }
    }
}

/// Sign an HS256 token with the test secret.
pub(crate) fn token(claims: Value) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A config file in its own temp directory, removed when this is dropped: keep it alive as long
/// as the node that reads it. Derefs to the file's path.
pub(crate) struct ConfigFile {
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
pub(crate) fn config_file(name: &str, toml: &str) -> ConfigFile {
    let dir = tempfile::Builder::new()
        .prefix("herald-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, toml).unwrap();
    ConfigFile {
        path: path.to_string_lossy().into_owned(),
        _dir: dir,
    }
}

/// TLS connector trusting the fixture certificate.
pub(crate) fn tls_connector() -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(fixture("tls_cert.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Fuzzing: one of `seeds` with up to five random byte edits (each an insert or an overwrite).
pub(crate) fn edited_seed(
    seeds: &'static [&'static str],
) -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    use proptest::sample::{select, Index};
    let edit = (any::<Index>(), any::<u8>(), any::<bool>());
    (select(seeds), prop::collection::vec(edit, 0..6)).prop_map(|(seed, edits)| {
        let mut b = seed.as_bytes().to_vec();
        for (at, byte, insert) in edits {
            let i = at.index(b.len() + 1);
            if insert {
                b.insert(i, byte);
            } else if i < b.len() {
                b[i] = byte;
            }
        }
        String::from_utf8_lossy(&b).into_owned()
    })
}
