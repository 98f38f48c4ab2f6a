//! The one-way transports (SSE and NDJSON streaming) against the real binary, read by `curl -N`
//! as a user would: delivery, resume with `Last-Event-ID` / `since`, what cannot be recovered,
//! bad input, a client that never reads, and drain.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use herald_testkit::eventually;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// `curl -sN` reading a stream line by line.
struct Curl {
    _child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Curl {
    fn start(args: &[&str]) -> Curl {
        let mut child = Command::new("curl")
            .args(["-sN", "--no-buffer"])
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("curl");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Curl {
            _child: child,
            lines,
        }
    }

    fn sse(node: &Node, query: &str, last_event_id: Option<&str>) -> Curl {
        let url = format!("http://{}/connection/sse?{query}", node.addr);
        match last_event_id {
            Some(id) => Curl::start(&["-H", &format!("Last-Event-ID: {id}"), &url]),
            None => Curl::start(&[&url]),
        }
    }

    async fn line(&mut self) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("a line in time")
            .expect("read")
    }

    /// The next SSE event: (name, id, data). `None` at the end of the stream.
    async fn event(&mut self) -> Option<(String, Option<String>, String)> {
        let (mut name, mut id, mut data) = (String::new(), None, None::<String>);
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                if let Some(data) = data {
                    return Some((name, id, data));
                }
                continue; // a comment, a retry or an id-only block
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

    /// The next unnamed event (a publication), skipping named ones.
    async fn publication(&mut self) -> (String, Value) {
        loop {
            let (name, id, data) = self.event().await.expect("stream ended");
            if name.is_empty() {
                return (
                    id.expect("publications carry an id"),
                    serde_json::from_str(&data).unwrap(),
                );
            }
        }
    }

    /// The next event named `name`.
    async fn named(&mut self, name: &str) -> Value {
        loop {
            let (n, _, data) = self.event().await.expect("stream ended");
            if n == name {
                return serde_json::from_str(&data).unwrap();
            }
        }
    }

    async fn json_line(&mut self) -> Value {
        loop {
            let line = self.line().await.expect("stream ended");
            let v: Value = serde_json::from_str(&line).expect("a JSON line");
            if v != json!({}) {
                return v;
            }
        }
    }
}

/// Status and body of a request that is refused before streaming.
async fn refused(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut args = vec![
        "-s",
        "--max-time",
        "15",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ];
    let header_args: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    for h in &header_args {
        args.extend(["-H", h.as_str()]);
    }
    if !body.is_empty() {
        args.extend(["-d", body]);
    }
    let url = format!("http://{}{path}", node.addr);
    args.push(&url);
    let out = Command::new("curl").args(&args).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text.rsplit_once('\n').unwrap();
    (
        status.parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn sse_delivers_and_resumes_every_channel_with_last_event_id() {
    let node = Node::dev().await;
    node.publish("news", json!({"n": 1})).await;
    let mut sse = Curl::sse(&node, "channel=news&channel=sport", None);
    let connected = sse.named("connected").await;
    assert!(connected["client"].is_string(), "{connected}");
    node.publish("news", json!({"n": 2})).await;
    node.publish("sport", json!({"s": 1})).await;
    let (_, p) = sse.publication().await;
    assert_eq!(
        (p["channel"].as_str(), p["offset"].as_u64()),
        (Some("news"), Some(2))
    );
    let (id, p) = sse.publication().await;
    assert_eq!(p["data"], json!({"s": 1}));
    drop(sse);

    // Missed while away: both channels recover, in order, exactly once.
    node.publish("news", json!({"n": 3})).await;
    node.publish("sport", json!({"s": 2})).await;
    node.publish("news", json!({"n": 4})).await;
    let mut sse = Curl::sse(&node, "channel=news&channel=sport", Some(&id));
    let mut got = Vec::new();
    for _ in 0..3 {
        let (_, p) = sse.publication().await;
        got.push((
            p["channel"].as_str().unwrap().to_owned(),
            p["offset"].as_u64().unwrap(),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        [("news".into(), 3), ("news".into(), 4), ("sport".into(), 2)]
    );
    node.publish("news", json!({"n": 5})).await;
    let (_, p) = sse.publication().await;
    assert_eq!(p["offset"], 5, "live after the recovery: {p}");

    // A position from another epoch cannot be recovered: the client is told.
    let mut sse = Curl::sse(&node, "channel=news", Some("0000000000000000:3"));
    let failed = sse.named("recovery_failed").await;
    assert_eq!(failed["channel"], "news", "{failed}");
    assert_eq!(failed["offset"], 5, "{failed}");
}

#[tokio::test]
async fn ndjson_stream_carries_the_protocol_frames_and_recovers_with_since() {
    let node = Node::dev().await;
    let first = node.publish("feed", json!("a")).await;
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    node.publish("feed", json!("b")).await;
    let url = format!("http://{}/connection/stream", node.addr);
    let body = json!({"subs": {"feed": {"since": {"epoch": epoch, "offset": 1}}}}).to_string();
    let mut stream = Curl::start(&["-X", "POST", "-d", &body, &url]);
    let connect = stream.json_line().await;
    let sub = &connect["connect"]["subs"]["feed"];
    assert_eq!(sub["recovered"], true, "{connect}");
    assert_eq!(sub["publications"][0]["data"], "b", "{connect}");
    node.publish("feed", json!("c")).await;
    loop {
        let line = stream.json_line().await;
        if let Some(p) = line.get("pub") {
            assert_eq!((p["offset"].as_u64(), &p["data"]), (Some(3), &json!("c")));
            break;
        }
    }
}

#[tokio::test]
async fn bad_input_gets_a_clear_refusal_and_hurts_nobody() {
    let node = Node::start(&[], &[]).await; // tokens required
    let good = token(json!({"sub": "alice"}));
    let mut alice = Curl::sse(&node, &format!("channel=news&token={good}"), None);
    alice.named("connected").await;

    let path = format!("/connection/sse?channel=news&token={good}");
    for (id, why) in [
        ("garbage", "Last-Event-ID: each position is epoch:offset"),
        (
            "e:1,e:2",
            "Last-Event-ID names a different number of channels than the request",
        ),
        ("e:-4", "Last-Event-ID: bad offset"),
    ] {
        let (status, body) = refused(&node, "GET", &path, &[("Last-Event-ID", id)], "").await;
        assert_eq!(
            (status, body["error"]["message"].as_str()),
            (400, Some(why)),
            "{id}"
        );
    }
    let (status, body) = refused(&node, "GET", "/connection/sse?channel=news", &[], "").await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (401, Some(101)),
        "no token: {body}"
    );
    let (status, body) = refused(
        &node,
        "GET",
        "/connection/sse?channel=news&token=x.y.z",
        &[],
        "",
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (401, Some(101)),
        "bad token: {body}"
    );
    let (status, _) = refused(
        &node,
        "GET",
        &format!("/connection/sse?chanel=x&token={good}"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 400, "unknown parameter");
    let (status, _) = refused(&node, "POST", "/connection/stream", &[], "{not json").await;
    assert_eq!(status, 400, "malformed body");
    let (status, _) = refused(&node, "POST", "/connection/sse", &[], "").await;
    assert_eq!(status, 405);
    // A bearer header works as well as the query parameter; an unknown namespace is a sub_error.
    let mut bob = Curl::start(&[
        "-H",
        &format!("Authorization: Bearer {}", token(json!({"sub": "bob"}))),
        &format!(
            "http://{}/connection/sse?channel=nope:x&channel=news",
            node.addr
        ),
    ]);
    let err = bob.named("sub_error").await;
    assert_eq!(
        (err["channel"].as_str(), err["error"]["code"].as_u64()),
        (Some("nope:x"), Some(102))
    );

    node.publish("news", json!("still fine")).await;
    assert_eq!(alice.publication().await.1["data"], "still fine");
    assert_eq!(bob.publication().await.1["data"], "still fine");
}

#[tokio::test]
async fn a_reader_that_stops_is_dropped_and_drain_sends_a_retry_hint() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIMITS__WRITE_TIMEOUT_MS", "1000"),
            ("HERALD_DRAIN_MS", "3000"),
        ],
    )
    .await;
    // A raw TCP client with a small receive buffer that sends the request and never reads.
    let _stuck = stuck_sse_reader(&node, "flood").await;
    let mut reader = Curl::sse(&node, "channel=flood", None);
    reader.named("connected").await;
    // Far more than the kernel buffers hold (24 MB), from two publishers.
    const TOTAL: u64 = 3000;
    let publishers = flood(&node, "flood", TOTAL);
    // The reader gets everything, in order; the stuck one is dropped.
    for expected in 1..=TOTAL {
        let (_, p) = reader.publication().await;
        assert_eq!(p["offset"], expected);
    }
    for p in publishers {
        herald_testkit::joined(p, std::time::Duration::from_secs(120), "a publisher").await;
    }
    eventually(
        Duration::from_secs(10),
        "the SSE client that stopped reading dropped (1 stream left open)",
        || async {
            node.metric("herald_stream_connections_open{transport=\"sse\"}")
                .await
                == 1.0
        },
    )
    .await;

    node.sigterm();
    let mut lines = Vec::new();
    while let Some(line) = reader.line().await {
        lines.push(line);
    }
    let retry = lines.iter().find_map(|l| l.strip_prefix("retry: "));
    let retry: u64 = retry.expect("a retry hint").parse().unwrap();
    // Drawn from [floor, floor + drain window) (docs/transports.md, "Drain").
    assert!((1000..1000 + 3000).contains(&retry), "{retry}");
    let at = lines
        .iter()
        .position(|l| l == "event: disconnect")
        .expect("disconnect event");
    let d: Value = serde_json::from_str(lines[at + 1].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(
        (d["code"].as_u64(), d["reconnect"].as_bool()),
        (Some(4000), Some(true)),
        "{d}"
    );
}

/// Read from `tcp` into `seen` until it contains `needle` (10 s at most).
async fn read_until(tcp: &mut tokio::net::TcpStream, seen: &mut String, needle: &str) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    while !seen.contains(needle) {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{needle:?} in time; got {seen:?}"))
            .unwrap();
        assert!(n > 0, "closed before {needle:?}; got {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// An SSE request that opens its connection is served on the raw socket, one that follows
/// another request on a kept-alive connection by hyper: the same response either way.
#[tokio::test]
async fn sse_is_the_same_on_a_fresh_and_on_a_kept_alive_connection() {
    use tokio::io::AsyncWriteExt;
    let node = Node::dev().await;
    let sse = b"GET /connection/sse?channel=news HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:3000\r\n\r\n";
    let mut fresh = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    fresh.write_all(sse).await.unwrap();
    let mut kept = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut health = String::new();
    read_until(&mut kept, &mut health, "{\"status\":\"ok\"}").await;
    kept.write_all(sse).await.unwrap();

    let mut heads = Vec::new();
    let mut streams = Vec::new();
    for tcp in [&mut fresh, &mut kept] {
        let mut seen = String::new();
        read_until(tcp, &mut seen, "event: connected").await;
        let (head, body) = seen.split_once("\r\n\r\n").unwrap();
        let mut head: Vec<String> = head
            .to_ascii_lowercase()
            .lines()
            .filter(|l| !l.starts_with("date:"))
            .map(str::to_owned)
            .collect();
        head.sort();
        heads.push(head);
        // The body is chunked: a hex size line, then the chunk.
        let (size, rest) = body.split_once("\r\n").unwrap();
        assert!(rest.starts_with("retry: 2000\n\n"), "{body:?}");
        assert!(usize::from_str_radix(size, 16).is_ok(), "{body:?}");
        streams.push(String::new());
    }
    assert_eq!(heads[0], heads[1]);
    for line in [
        "http/1.1 200 ok",
        "content-type: text/event-stream",
        "cache-control: no-cache",
        "transfer-encoding: chunked",
        "access-control-allow-origin: http://localhost:3000",
    ] {
        assert!(
            heads[0].iter().any(|l| l == line),
            "{line} in {:?}",
            heads[0]
        );
    }
    node.publish("news", json!("both")).await;
    for (tcp, seen) in [&mut fresh, &mut kept].into_iter().zip(&mut streams) {
        read_until(tcp, seen, "\"data\":\"both\"").await;
    }
    assert_eq!(
        node.metric("herald_stream_connections_open{transport=\"sse\"}")
            .await,
        2.0
    );
    // A client that leaves is noticed on both paths.
    drop(fresh);
    drop(kept);
    eventually(
        Duration::from_secs(10),
        "no SSE stream open after both clients left",
        || async {
            node.metric("herald_stream_connections_open{transport=\"sse\"}")
                .await
                == 0.0
        },
    )
    .await;
}

/// A drain's `retry:` outlives the stream (`EventSource` keeps the last one for every later
/// reconnect): it is never tiny, even with a short drain window, and it matches the
/// `disconnect` event's `after_ms`; the next stream that opens puts the normal delay back.
#[tokio::test]
async fn a_drain_retry_has_a_floor_and_the_next_stream_resets_it() {
    const DRAIN_MS: u64 = 100;
    for _ in 0..3 {
        let drain = DRAIN_MS.to_string();
        let node = Node::start(&["--dev"], &[("HERALD_DRAIN_MS", drain.as_str())]).await;
        let mut reader = Curl::sse(&node, "channel=news", None);
        assert_eq!(reader.line().await.as_deref(), Some("retry: 2000"));
        reader.named("connected").await;
        node.sigterm();
        let mut lines = Vec::new();
        while let Some(line) = reader.line().await {
            lines.push(line);
        }
        let retries: Vec<u64> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("retry: "))
            .map(|r| r.parse().unwrap())
            .collect();
        let [retry] = retries[..] else {
            panic!("one retry hint in {lines:?}")
        };
        assert!(
            (1000..1000 + DRAIN_MS).contains(&retry),
            "retry {retry} outside [1000, {})",
            1000 + DRAIN_MS
        );
        let at = lines
            .iter()
            .position(|l| l == "event: disconnect")
            .expect("disconnect event");
        let d: Value = serde_json::from_str(lines[at + 1].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(d["after_ms"].as_u64(), Some(retry), "{d}");
    }
    // The stream a browser opens next (here on another node) asks for the normal delay again.
    let node = Node::dev().await;
    let mut reader = Curl::sse(&node, "channel=news", None);
    assert_eq!(reader.line().await.as_deref(), Some("retry: 2000"));
}
