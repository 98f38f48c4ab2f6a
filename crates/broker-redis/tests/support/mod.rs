//! Real `herald` nodes on free ports sharing a Redis, a WebSocket client that follows PROTOCOL.md,
//! and a subscriber that recovers like the SDK does.
#![allow(dead_code)]

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
use tokio_websockets::{ClientBuilder, Message, WebSocketStream};

pub const API_KEY: &str = "k";
const WAIT: Duration = Duration::from_secs(10);

/// The `herald` binary: `HERALD_BIN`, else `<target>/debug/herald` when it is newer than every
/// source file of the workspace (as after `cargo test --workspace`), else built now with
/// `cargo build -p herald-server --bin herald`. Once per test process.
pub fn herald_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("HERALD_BIN") {
            return PathBuf::from(bin);
        }
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace.join("target"));
        let bin = target.join("debug/herald");
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        if built.is_some_and(|b| newest_source(&workspace) <= b) {
            return bin;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "-p", "herald-server", "--bin", "herald"])
            .current_dir(&workspace)
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("run cargo build -p herald-server");
        assert!(status.success(), "cargo build -p herald-server failed");
        assert!(bin.exists(), "no herald binary at {}", bin.display());
        bin
    })
    .clone()
}

/// The newest modification time of the workspace's Rust sources, manifests and lock file.
fn newest_source(workspace: &std::path::Path) -> std::time::SystemTime {
    fn walk(dir: &std::path::Path, newest: &mut std::time::SystemTime) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            if path.is_dir() {
                if name != "target"
                    && name != "node_modules"
                    && !name.to_string_lossy().starts_with('.')
                {
                    walk(&path, newest);
                }
            } else if path.extension().is_some_and(|x| x == "rs") || name == "Cargo.toml" {
                if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                    *newest = (*newest).max(t);
                }
            }
        }
    }
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    walk(&workspace.join("crates"), &mut newest);
    for f in ["Cargo.toml", "Cargo.lock"] {
        if let Ok(t) = std::fs::metadata(workspace.join(f)).and_then(|m| m.modified()) {
            newest = newest.max(t);
        }
    }
    newest
}

/// A running `herald serve --dev` node, killed on drop.
pub struct Herald {
    pub name: String,
    pub addr: SocketAddr,
    child: Child,
    _config: tempfile::TempPath,
}

pub mod tempfile {
    //! A file removed on drop (no dependency for one helper).
    use std::path::{Path, PathBuf};

    pub struct TempPath(PathBuf);

    impl TempPath {
        pub fn write(tag: &str, contents: &str) -> TempPath {
            let path = std::env::temp_dir().join(format!(
                "herald-test-{tag}-{}-{:08x}.toml",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::write(&path, contents).expect("write temp file");
            TempPath(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Herald {
    /// `herald serve --dev --port 0` as node `name` on `broker_url`. The settings go both in the
    /// environment (`HERALD_BROKER_URL`, `HERALD_NODE_NAME`, `HERALD_API_KEY`) and in a config file.
    pub async fn start(broker_url: &str, name: &str) -> Herald {
        Self::start_with(broker_url, name, "").await
    }

    /// As [`start`](Self::start), with extra TOML appended to the config file.
    pub async fn start_with(broker_url: &str, name: &str, extra_toml: &str) -> Herald {
        let config = tempfile::TempPath::write(
            name,
            &format!(
                "broker_url = \"{broker_url}\"\nnode_name = \"{name}\"\napi_key = \"{API_KEY}\"\n{extra_toml}\n"
            ),
        );
        let mut cmd = Command::new(herald_bin());
        cmd.args(["serve", "--dev", "--port", "0", "--config"])
            .arg(config.path());
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("HERALD_BROKER_URL", broker_url)
            .env("HERALD_NODE_NAME", name)
            .env("HERALD_API_KEY", API_KEY)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn herald");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = tokio::time::timeout(WAIT, lines.next_line())
                .await
                .expect("herald did not start in time")
                .expect("read stdout")
                .expect("herald exited before listening");
            // "herald listening on http://127.0.0.1:PORT (WebSocket ws://…/ws)"
            if let Some(url) = line.strip_prefix("herald listening on ") {
                let url = url.split_whitespace().next().unwrap();
                break url.split("://").nth(1).unwrap().parse().expect("address");
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Herald {
            name: name.to_owned(),
            addr,
            child,
            _config: config,
        }
    }

    /// Kill the process (like a crash).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Raw HTTP request; status and JSON body (or the body as a string).
    pub async fn http(&self, method: &str, path: &str, body: Option<String>) -> (u16, Value) {
        let mut stream = TcpStream::connect(self.addr).await.expect("connect API");
        let body = body.unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {API_KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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

    /// `POST /api/publish`; status and body.
    pub async fn try_publish(&self, channel: &str, data: Value) -> (u16, Value) {
        let body = json!({"channel": channel, "data": data}).to_string();
        self.http("POST", "/api/publish", Some(body)).await
    }

    /// `POST /api/publish`, which must succeed; the reply.
    pub async fn publish(&self, channel: &str, data: Value) -> Value {
        let (status, body) = self.try_publish(channel, data).await;
        assert_eq!(status, 200, "publish on {} failed: {body}", self.name);
        body
    }

    /// A metric from `/metrics` (the first line that starts with `name` and a space).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.http("GET", "/metrics", None).await;
        let text = body.as_str().unwrap_or_default().to_owned();
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} not found on {}", self.name))
    }

    /// A connected client (anonymous, dev mode).
    pub async fn client(&self) -> Ws {
        Ws::connect(self.addr, json!({})).await.expect("connect")
    }
}

/// A protocol client: splits newline-batched frames and answers pings.
pub struct Ws {
    ws: WebSocketStream<TcpStream>,
    /// Pushes received but not yet taken.
    pending: VecDeque<Value>,
    /// Messages of the last frame not yet looked at.
    incoming: VecDeque<Value>,
    next_id: u64,
    /// The `connect` reply.
    pub connect: Value,
}

impl Ws {
    /// Open a connection and send `connect` with `params`.
    pub async fn connect(addr: SocketAddr, params: Value) -> Result<Ws, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (ws, _) = ClientBuilder::from_uri(format!("ws://{addr}/ws").parse().unwrap())
            .connect_on(tcp)
            .await
            .map_err(|e| e.to_string())?;
        let mut ws = Ws {
            ws,
            pending: VecDeque::new(),
            incoming: VecDeque::new(),
            next_id: 1,
            connect: Value::Null,
        };
        let reply = ws.call("connect", params).await?;
        if reply.get("connect").is_none() {
            return Err(format!("connect refused: {reply}"));
        }
        ws.connect = reply["connect"].clone();
        Ok(ws)
    }

    /// Send a command and wait for its reply; pushes meanwhile are kept in order.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({ "id": id, method: params }).to_string();
        self.ws
            .send(Message::text(text))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let msg = tokio::time::timeout(WAIT, self.read())
                .await
                .map_err(|_| format!("no reply to {method}"))??;
            if msg.get("id").and_then(Value::as_u64) == Some(id) {
                return Ok(msg);
            }
            self.pending.push_back(msg);
        }
    }

    /// `subscribe`; the reply's result (panics on an error reply).
    pub async fn subscribe(&mut self, params: Value) -> Value {
        let r = self.call("subscribe", params).await.expect("subscribe");
        assert!(r.get("subscribe").is_some(), "subscribe failed: {r}");
        r["subscribe"].clone()
    }

    /// The next push within `wait`, or `Ok(None)`; `Err` when the connection ended.
    pub async fn next_push(&mut self, wait: Duration) -> Result<Option<Value>, String> {
        if let Some(p) = self.pending.pop_front() {
            return Ok(Some(p));
        }
        match tokio::time::timeout(wait, self.read()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Read one new message from the socket (a frame may carry several); answer pings.
    async fn read(&mut self) -> Result<Value, String> {
        loop {
            if let Some(v) = self.incoming.pop_front() {
                return Ok(v);
            }
            let msg = match self.ws.next().await {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("closed".into()),
            };
            if let Some((code, reason)) = msg.as_close() {
                return Err(format!("closed {} {reason}", u16::from(code)));
            }
            let Some(text) = msg.as_text() else { continue };
            for line in text.split('\n').filter(|l| !l.is_empty()) {
                let v: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
                if v.as_object().is_some_and(|o| o.is_empty()) {
                    let _ = self.ws.send(Message::text("{}".to_owned())).await;
                    continue;
                }
                self.incoming.push_back(v);
            }
        }
    }

    /// Publications (`pub` pushes) of `channel` until `n` arrived or `wait` passed with nothing.
    pub async fn publications(&mut self, channel: &str, n: usize, wait: Duration) -> Vec<Value> {
        let mut got = Vec::new();
        while got.len() < n {
            match self.next_push(wait).await {
                Ok(Some(p)) => {
                    if p["pub"]["channel"] == channel {
                        got.push(p["pub"].clone());
                    }
                }
                _ => break,
            }
        }
        got
    }
}

/// A subscriber that keeps one channel's stream complete the way the SDK does: on an `unsub`
/// push it subscribes again with `since`, on a lost connection it reconnects with `since`.
/// Records every offset it got, in order; any `recovered: false` is recorded as a loss.
pub struct Follower {
    pub offsets: Vec<u64>,
    pub epoch: String,
    pub losses: u32,
    pub resubscribes: u32,
}

impl Follower {
    /// Follow `channel` on the node at `addr` until `stop` fires; then drain for `drain`.
    pub async fn run(
        addr: SocketAddr,
        channel: String,
        ready: tokio::sync::oneshot::Sender<()>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        drain: Duration,
    ) -> Follower {
        let mut f = Follower {
            offsets: Vec::new(),
            epoch: String::new(),
            losses: 0,
            resubscribes: 0,
        };
        let mut ws = Ws::connect(addr, json!({})).await.expect("connect");
        let r = ws.subscribe(json!({"channel": channel})).await;
        f.epoch = r["epoch"].as_str().unwrap().to_owned();
        let start = r["offset"].as_u64().unwrap();
        let _ = ready.send(());
        let mut last = start;
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            if deadline.is_none() && *stop.borrow() {
                deadline = Some(tokio::time::Instant::now() + drain);
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return f;
            }
            let push = tokio::select! {
                p = ws.next_push(Duration::from_millis(100)) => p,
                _ = stop.changed(), if deadline.is_none() => continue,
            };
            match push {
                Ok(Some(p)) => {
                    if let Some(publication) = p.get("pub") {
                        if publication["channel"] == channel.as_str() {
                            let o = publication["offset"].as_u64().unwrap();
                            f.offsets.push(o);
                            last = last.max(o);
                        }
                    } else if p.get("unsub").is_some() {
                        f.resubscribes += 1;
                        // Subscribe again with `since`; "temporarily unavailable" means retry.
                        loop {
                            let since = json!({"epoch": f.epoch, "offset": last});
                            let r = ws
                                .call("subscribe", json!({"channel": channel, "since": since}))
                                .await;
                            match r {
                                Ok(r) if r.get("subscribe").is_some() => {
                                    last = f.absorb(&r["subscribe"], last);
                                    break;
                                }
                                Ok(r) if r["error"]["code"] == 111 || r["error"]["code"] == 100 => {
                                    tokio::time::sleep(Duration::from_millis(200)).await;
                                }
                                Ok(_) => {
                                    f.losses += 1;
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    // Reconnect (with retries) and recover.
                    f.resubscribes += 1;
                    loop {
                        let since = json!({"epoch": f.epoch, "offset": last});
                        let params = json!({"subs": {channel.as_str(): {"since": since}}});
                        match Ws::connect(addr, params).await {
                            Ok(new)
                                if new.connect["subs"][channel.as_str()].get("error").is_none() =>
                            {
                                ws = new;
                                let sub = ws.connect["subs"][channel.as_str()].clone();
                                last = f.absorb(&sub, last);
                                break;
                            }
                            _ => tokio::time::sleep(Duration::from_millis(200)).await,
                        }
                    }
                }
            }
        }
    }

    /// Take a subscribe result with `since`: its recovered publications, or a loss.
    fn absorb(&mut self, result: &Value, last: u64) -> u64 {
        if result["recovered"] != true {
            self.losses += 1;
            return last;
        }
        let mut last = last;
        for p in result["publications"].as_array().into_iter().flatten() {
            let o = p["offset"].as_u64().unwrap();
            self.offsets.push(o);
            last = last.max(o);
        }
        last
    }
}
