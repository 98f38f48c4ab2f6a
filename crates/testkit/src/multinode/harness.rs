//! Real `herald` nodes (the server binary) on free ports, a protocol client over real
//! WebSockets, and plain HTTP for the API and `/metrics`. Broker-neutral: nodes get the broker
//! URL from a [`BrokerProcess`](super::BrokerProcess).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_websockets::{ClientBuilder, MaybeTlsStream, Message, WebSocketStream};

/// The API key every test node is started with.
pub const API_KEY: &str = "k";
const WAIT: Duration = Duration::from_secs(15);

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

/// A running `herald serve --dev`, killed on drop.
pub struct Node {
    /// The node's name (`HERALD_NODE_NAME`).
    pub name: String,
    child: Option<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Node {
    /// Start node `name` on a free port against the broker at `broker_url`.
    pub async fn start(name: &str, broker_url: &str) -> Node {
        Self::start_with(name, broker_url, &[]).await
    }

    /// Like [`start`](Self::start), with extra `HERALD_*` settings (e.g. `HERALD_NATS__REPLICAS`).
    pub async fn start_with(name: &str, broker_url: &str, env: &[(&str, &str)]) -> Node {
        let mut cmd = Command::new(herald_bin());
        cmd.args(["serve", "--dev", "--port", "0"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied());
        cmd.env("HERALD_BROKER_URL", broker_url)
            .env("HERALD_NODE_NAME", name)
            .env("HERALD_API_KEY", API_KEY)
            .env(
                "RUST_LOG",
                std::env::var("HERALD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
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
        let addr = url
            .split("://")
            .nth(1)
            .expect("url")
            .parse()
            .expect("address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Node {
            name: name.to_owned(),
            child: Some(child),
            addr,
        }
    }

    /// A handle on a node started elsewhere (for another task); it does not own the process.
    pub fn attach(name: &str, addr: SocketAddr) -> Node {
        Node {
            name: name.to_owned(),
            child: None,
            addr,
        }
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

    /// Kill the process at once (a crash).
    pub async fn kill(mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill().await;
        }
    }

    /// Raw HTTP; returns status and body as JSON (or a JSON string when it is not JSON).
    pub async fn http(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.try_http(method, path, body)
            .await
            .unwrap_or_else(|why| panic!("{method} {path} on {}: {why}", self.name))
    }

    /// Raw HTTP that may fail (the node was killed, the connection reset): `Err` says why.
    pub async fn try_http(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let mut stream = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {API_KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(req.as_bytes())
            .await
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

    /// `POST /api/publish`; (status, body).
    pub async fn try_publish(&self, channel: &str, data: Value, key: Option<&str>) -> (u16, Value) {
        let mut body = json!({"channel": channel, "data": data});
        if let Some(key) = key {
            body["idempotency_key"] = json!(key);
        }
        self.http("POST", "/api/publish", Some(body)).await
    }

    /// `POST /api/publish`, asserting success; returns the offset.
    pub async fn publish(&self, channel: &str, data: Value) -> u64 {
        let (status, body) = self.try_publish(channel, data, None).await;
        assert_eq!(status, 200, "publish on {}: {body}", self.name);
        body["offset"].as_u64().expect("offset")
    }

    /// A metric's value from `/metrics` (the first line `name` or `name{…}`).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.http("GET", "/metrics", None).await;
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

    /// A protocol client that may fail to connect (the node is down): the `connect` reply's
    /// result, or why not.
    pub async fn try_client(&self, subs: Value) -> Result<Client, String> {
        let uri = format!("ws://{}/ws", self.addr).parse().expect("uri");
        let (ws, _) = tokio::time::timeout(WAIT, ClientBuilder::from_uri(uri).connect())
            .await
            .map_err(|_| "handshake timeout".to_owned())?
            .map_err(|e| format!("handshake: {e}"))?;
        let mut c = Client {
            ws,
            pending: VecDeque::new(),
            next_id: 1,
            connect_reply: Value::Null,
            close_code: None,
            closed: false,
        };
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

    /// A protocol client connected (anonymously, dev mode) with these subscriptions.
    pub async fn client(&self, subs: Value) -> Client {
        let mut c = Client::open(self.addr).await;
        let reply = c.call("connect", json!({ "subs": subs })).await;
        assert!(
            reply.get("connect").is_some(),
            "connect failed on {}: {reply}",
            self.name
        );
        c.connect_reply = reply["connect"].clone();
        c
    }
}

/// A protocol client: splits newline-batched frames, answers pings, keeps pushes in order.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    pending: VecDeque<Value>,
    next_id: u64,
    /// The `connect` result (`client`, `subs`, …).
    pub connect_reply: Value,
    /// The close code, once the server closed the connection.
    pub close_code: Option<u16>,
    /// Whether the connection ended (closed, reset or failed).
    pub closed: bool,
}

impl Client {
    async fn open(addr: SocketAddr) -> Client {
        let uri = format!("ws://{addr}/ws").parse().expect("uri");
        let (ws, _) = ClientBuilder::from_uri(uri)
            .connect()
            .await
            .expect("ws handshake");
        Client {
            ws,
            pending: VecDeque::new(),
            next_id: 1,
            connect_reply: Value::Null,
            close_code: None,
            closed: false,
        }
    }

    /// Like [`call`](Self::call), `None` when the connection ends first.
    pub async fn try_call(&mut self, method: &str, params: Value) -> Option<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({ "id": id, method: params }).to_string();
        if self.ws.send(Message::text(text)).await.is_err() {
            self.closed = true;
            return None;
        }
        // Read frames (not `pending`, which holds pushes that arrived meanwhile) until the reply.
        loop {
            if let Some(pos) = self.pending.iter().position(|m| m["id"] == id) {
                return self.pending.remove(pos);
            }
            if !self.read_frame(WAIT).await {
                return None;
            }
        }
    }

    /// Send a command and wait for its reply (pushes meanwhile stay queued in order).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.try_call(method, params)
            .await
            .unwrap_or_else(|| panic!("closed before reply {id}"))
    }

    /// The next message within `wait`; `None` on timeout or close.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        if let Some(m) = self.pending.pop_front() {
            return Some(m);
        }
        self.read(wait).await
    }

    /// Collect `pub` pushes of `channel` until `count` arrived (or `wait` passes with nothing).
    pub async fn offsets(&mut self, channel: &str, count: usize, wait: Duration) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < count {
            let Some(m) = self.next_within(wait).await else {
                break;
            };
            if m["pub"]["channel"] == channel {
                out.push(m["pub"]["offset"].as_u64().expect("offset"));
            }
        }
        out
    }

    async fn read(&mut self, wait: Duration) -> Option<Value> {
        loop {
            if let Some(m) = self.pending.pop_front() {
                return Some(m);
            }
            if !self.read_frame(wait).await {
                return None;
            }
        }
    }

    /// Read one frame from the socket into `pending` (answering pings); `false` on close or
    /// when nothing arrived within `wait`.
    async fn read_frame(&mut self, wait: Duration) -> bool {
        let msg = match tokio::time::timeout(wait, self.ws.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(_) => {
                self.closed = true;
                return false;
            }
            Err(_) => return false,
        };
        if let Some((code, _)) = msg.as_close() {
            self.close_code = Some(u16::from(code));
            self.closed = true;
            return false;
        }
        let Some(text) = msg.as_text() else {
            return true;
        };
        let lines: Vec<Value> = text
            .split('\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).expect("JSON from server"))
            .collect();
        for m in lines {
            if m == json!({}) {
                if self.ws.send(Message::text("{}".to_owned())).await.is_err() {
                    self.closed = true;
                    return false;
                }
                continue;
            }
            self.pending.push_back(m);
        }
        true
    }
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
