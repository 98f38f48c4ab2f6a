//! WebSocket emulation (SSE down, POST up) against the real binary, driven by `curl` as a
//! client behind a WebSocket-hostile proxy would be: the protocol works unchanged (connect,
//! subscribe, publish, recovery with `since`, pings), and bad input gets a clear answer.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// One emulated connection: the SSE downstream read by `curl -N`, messages sent with `curl -X POST`.
struct Emulated {
    _child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    url: String,
    session: String,
    next_id: u64,
    /// Frames read while waiting for a reply, in order.
    pending: std::collections::VecDeque<Value>,
}

impl Emulated {
    async fn open(node: &Node) -> Emulated {
        let url = format!("http://{}/connection/emulation", node.addr);
        let mut child = Command::new("curl")
            .args(["-sN", "--no-buffer", &url])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("curl");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut e = Emulated {
            _child: child,
            lines,
            url,
            session: String::new(),
            next_id: 1,
            pending: Default::default(),
        };
        let (name, data) = e.event().await.expect("the session event");
        assert_eq!(name, "session");
        e.session = data["session"].as_str().expect("session id").to_owned();
        assert_eq!(e.session.len(), 32, "{data}");
        e
    }

    /// The next event: (name, data); `None` when the stream ends.
    async fn event(&mut self) -> Option<(String, Value)> {
        let mut name = String::new();
        let mut data: Option<String> = None;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("an event in time")
                .expect("read")?;
            if line.is_empty() {
                if let Some(d) = data.take() {
                    return Some((name, serde_json::from_str(&d).expect("JSON data")));
                }
                continue;
            }
            if let Some(v) = line.strip_prefix("event: ") {
                name = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(v.to_owned());
            }
        }
    }

    /// The next protocol frame, answering pings (`{}`) as a client must.
    async fn frame(&mut self) -> Value {
        if let Some(f) = self.pending.pop_front() {
            return f;
        }
        loop {
            let (name, data) = self.event().await.expect("the stream ended");
            assert_eq!(name, "", "a frame, not event {name}: {data}");
            if data == json!({}) {
                assert_eq!(self.post("{}").await.0, 204);
                continue;
            }
            return data;
        }
    }

    /// The next publication push (presence pushes skipped).
    async fn publication(&mut self) -> Value {
        loop {
            let f = self.frame().await;
            if f.get("pub").is_some() {
                return f;
            }
        }
    }

    async fn post(&self, body: &str) -> (u16, Value) {
        post(&format!("{}?session={}", self.url, self.session), body).await
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let (status, body) = self
            .post(&json!({ "id": id, method: params }).to_string())
            .await;
        assert_eq!(status, 204, "{body}");
        let mut held = std::collections::VecDeque::new();
        loop {
            let f = self.frame().await;
            if f["id"] == id {
                held.extend(self.pending.drain(..));
                self.pending = held;
                return f;
            }
            held.push_back(f);
        }
    }
}

async fn post(url: &str, body: &str) -> (u16, Value) {
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "15",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
        ])
        .args(["-H", "Content-Type: text/plain", "--data-binary", body, url])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text.rsplit_once('\n').unwrap();
    (
        status.parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_protocol_runs_unchanged_over_sse_and_post() {
    let node = Node::dev().await;
    let mut c = Emulated::open(&node).await;
    let r = c.call("connect", json!({ "subs": { "news": {} } })).await;
    let epoch = r["connect"]["subs"]["news"]["epoch"].clone();
    assert!(epoch.is_string(), "{r}");
    node.publish("news", json!({"n": 1})).await;
    let p = c.publication().await;
    assert_eq!(
        (&p["pub"]["channel"], &p["pub"]["offset"]),
        (&json!("news"), &json!(1)),
        "{p}"
    );
    let r = c
        .call("publish", json!({"channel": "news", "data": {"n": 2}}))
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let p = c.publication().await;
    assert_eq!(p["pub"]["data"], json!({"n": 2}), "{p}");
    drop(c);

    // Missed while away, recovered on a new emulated connection with `since`.
    node.publish("news", json!({"n": 3})).await;
    let mut back = Emulated::open(&node).await;
    let r = back
        .call(
            "connect",
            json!({ "subs": { "news": { "since": { "epoch": epoch, "offset": 2 } } } }),
        )
        .await;
    let sub = &r["connect"]["subs"]["news"];
    assert_eq!(sub["recovered"], true, "{r}");
    assert_eq!(sub["publications"][0]["offset"], 3, "{r}");
    assert_eq!(
        node.metric("herald_stream_connections_open{transport=\"emulation\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer() {
    let node = Node::start(&["--dev"], &[("HERALD_LIMITS__MAX_FRAME_BYTES", "1024")]).await;
    let base = format!("http://{}/connection/emulation", node.addr);
    // Posting to a session that does not exist.
    let (status, body) = post(&format!("{base}?session=nope"), "{}").await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (404, Some(108)),
        "{body}"
    );
    let (status, _) = post(&base, "{}").await;
    assert_eq!(status, 404);

    // Malformed JSON ends the connection with 4500, as on WebSocket.
    let mut c = Emulated::open(&node).await;
    c.call("connect", json!({})).await;
    assert_eq!(c.post("{not json").await.0, 204);
    let (_, disconnect) = c.event().await.unwrap();
    assert_eq!(disconnect["disconnect"]["code"], 4500, "{disconnect}");
    let (name, close) = c.event().await.unwrap();
    assert_eq!((name.as_str(), &close["code"]), ("close", &json!(4500)));
    assert!(c.event().await.is_none(), "the stream ends");
    let (status, _) = c.post("{}").await;
    assert_eq!(status, 404, "the session is gone");

    // A message over the frame limit: 413, and the connection ends with 4503.
    let mut c = Emulated::open(&node).await;
    c.call("connect", json!({})).await;
    let big = json!({"id": 9, "publish": {"channel": "x", "data": "y".repeat(2000)}}).to_string();
    let (status, body) = c.post(&big).await;
    assert_eq!((status, body["error"]["code"].as_u64()), (413, Some(106)));
    let (_, disconnect) = c.event().await.unwrap();
    assert_eq!(disconnect["disconnect"]["code"], 4503, "{disconnect}");

    // Parameters on GET are refused (connect goes in the first POST).
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "15",
            "-w",
            "\n%{http_code}",
            &format!("{base}?token=x"),
        ])
        .output()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("\n400"));
}

#[tokio::test]
async fn a_session_that_never_connects_is_closed() {
    let node = Node::start(
        &["--dev"],
        &[("HERALD_LIMITS__HANDSHAKE_TIMEOUT_MS", "500")],
    )
    .await;
    let mut c = Emulated::open(&node).await;
    let (_, disconnect) = c.event().await.unwrap();
    assert_eq!(disconnect["disconnect"]["code"], 4500, "{disconnect}");
    let (name, _) = c.event().await.unwrap();
    assert_eq!(name, "close");
}
