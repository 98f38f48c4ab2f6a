//! Hostile input that once crashed a handler, wedged a channel or leaked internals: each case
//! gets a clear error, and the node keeps serving everyone else.

mod common;

use common::*;
use herald_testkit::eventually_some;
use serde_json::json;

/// Raw JSON text for `/api/publish` (serde_json's `Value` cannot hold 200 levels itself).
fn publish_body(channel: &str, depth: usize) -> String {
    format!(
        r#"{{"channel":"{channel}","data":{}{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[tokio::test]
async fn deeply_nested_data_is_refused_and_history_never_panics() {
    let node = Node::dev().await;
    let api = node.api_handle();
    let post = |body: String| api.http("POST", "/api/publish", Some(body), Some(API_KEY));
    let (status, body) = post(publish_body("deep", 200)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], 107, "{body}");
    // 64 levels are fine, and history reads them back.
    let (status, body) = post(publish_body("deep", 64)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = node
        .api("/api/history", Some(json!({"channel": "deep"})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["publications"].as_array().map(Vec::len), Some(1));
    // Clients are held to the same bound.
    let mut c = node.connected(&["deep"]).await;
    let frame = format!(
        r#"{{"id":9,"publish":{{"channel":"deep","data":{}{}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    c.send_raw(&frame).await;
    let r = c.reply(9).await;
    assert_eq!(r["error"]["code"], 107, "{r}");
}

#[tokio::test]
async fn idempotency_keys_with_control_characters_are_refused() {
    let node = Node::dev().await;
    for key in ["a\r\nb", "", "with space", &"k".repeat(129)] {
        let (status, body) = node
            .api(
                "/api/publish",
                Some(json!({"channel": "k", "data": 1, "idempotency_key": key})),
            )
            .await;
        assert_eq!(status, 400, "{key:?}: {body}");
        assert_eq!(body["error"]["code"], 107, "{body}");
    }
    let (status, body) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "k", "data": 1, "idempotency_key": "order-42"})),
        )
        .await;
    assert_eq!((status, body["offset"].clone()), (200, json!(1)), "{body}");
}

#[tokio::test]
async fn an_expiry_at_the_end_of_time_neither_panics_nor_leaks() {
    let node = Node::start(&[], &[]).await;
    let forever = token(json!({"sub": "alice", "exp": u64::MAX}));
    let mut c = node.client().await;
    let r = c.call("connect", json!({"token": forever})).await;
    assert!(r["connect"]["expires_in"].as_u64().is_some(), "{r}");
    let r = c.call("refresh", json!({"token": forever})).await;
    assert!(r["refresh"]["expires_in"].as_u64().is_some(), "{r}");
    let r = c.call("history", json!({"channel": "x", "limit": 0})).await;
    assert!(
        r.get("history").is_some(),
        "the connection still serves: {r}"
    );
}

#[tokio::test]
async fn a_subscription_token_cannot_connect_and_refusals_say_no_parser_text() {
    let node = Node::start(&[], &[]).await;
    let sub_token = token(json!({"sub": "alice", "channel": "news", "exp": now() + 60}));
    let mut c = node.client().await;
    let r = c.call("connect", json!({"token": sub_token})).await;
    assert_eq!(r["error"]["code"], 101, "{r}");
    // A token whose header names an algorithm serde does not know.
    let mut c = node.client().await;
    let r = c
        .call(
            "connect",
            json!({"token": "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0."}),
        )
        .await;
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(r["error"]["code"], 101, "{r}");
    for leak in ["variant", "expected", "JSON", "line"] {
        assert!(!message.contains(leak), "parser text in {message:?}");
    }
}

#[tokio::test]
async fn one_connect_recovering_many_channels_stays_within_its_byte_budget() {
    let cfg = config_file(
        "herald.toml",
        r#"
        dev = true
        [limits]
        max_recovery_bytes = 4000
        "#,
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let channels = ["r1", "r2", "r3", "r4"];
    let mut subs = serde_json::Map::new();
    for ch in channels {
        let first = node.publish(ch, json!(0)).await;
        for _ in 0..3 {
            node.publish(ch, json!("x".repeat(1000))).await;
        }
        subs.insert(
            ch.into(),
            json!({"since": {"epoch": first["epoch"], "offset": 1}}),
        );
    }
    let mut c = node.client().await;
    let r = c.call("connect", json!({ "subs": subs })).await;
    let got = &r["connect"]["subs"];
    let recovered: Vec<bool> = channels
        .iter()
        .map(|ch| got[ch]["recovered"].as_bool().expect("recovered"))
        .collect();
    // Each channel recovers ~3 KB: one fits the 4000-byte budget, the rest are told plainly.
    assert_eq!(recovered.iter().filter(|r| **r).count(), 1, "{got}");
    for ch in channels {
        let sub = &got[ch];
        let n = sub["publications"].as_array().map_or(0, Vec::len);
        assert_eq!(n, if sub["recovered"] == true { 3 } else { 0 }, "{sub}");
    }
    assert_eq!(node.metric("herald_recovery_over_budget_total").await, 3.0);
}

/// One raw HTTP/1.1 request with these headers; returns the status.
async fn raw_status(node: &Node, request_head: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    tcp.write_all(request_head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn browsers_reach_only_what_the_config_allows() {
    let cfg = config_file(
        "herald.toml",
        r#"
        allowed_origins = ["https://app.example"]
        api_allowed_origins = ["https://admin.example"]
        "#,
    );
    let node = Node::start(&["--dev", "--config", &cfg], &[]).await;
    let upgrade = |origin: &str| {
        format!(
            "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{origin}\r\n"
        )
    };
    assert_eq!(
        raw_status(&node, &upgrade("Origin: https://app.example\r\n")).await,
        101
    );
    assert_eq!(
        raw_status(&node, &upgrade("Origin: https://evil.example\r\n")).await,
        403
    );
    assert_eq!(
        raw_status(&node, &upgrade("")).await,
        101,
        "non-browser clients"
    );
    // The API: cross-site calls only from listed origins, never from a random page.
    let api = |origin: &str| {
        let body = r#"{"channel":"c","data":1}"#;
        format!(
            "POST /api/publish HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\n\
             Authorization: Bearer testkey\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    assert_eq!(raw_status(&node, &api("https://evil.example")).await, 403);
    assert_eq!(raw_status(&node, &api("https://admin.example")).await, 200);
    // A --dev node answers only to a loopback Host (no DNS rebinding).
    let rebound = "GET /api/channels HTTP/1.1\r\nHost: evil.example:8000\r\n\r\n";
    assert_eq!(raw_status(&node, rebound).await, 403);
}

#[tokio::test]
async fn connections_per_ip_are_bounded() {
    let node = Node::start(
        &["--dev"],
        &[("HERALD_LIMITS__MAX_CONNECTIONS_PER_IP", "3")],
    )
    .await;
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(node.connected(&["room"]).await);
    }
    let tcp = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let refused = Client::open_on(Box::new(tcp), &node.ws_url(), &[]).await;
    assert!(
        refused.is_err(),
        "a fourth connection from one IP is closed at once: {:?}",
        refused.map(|c| c.close_code)
    );
    drop(kept.pop());
    let mut again = eventually_some(
        std::time::Duration::from_secs(10),
        "a connection from the same IP accepted once one of its three ended",
        || async { node.try_subscriber(json!({"room": {}})).await.ok() },
    )
    .await;
    let r = again
        .call("history", json!({"channel": "room", "limit": 0}))
        .await;
    assert!(r.get("history").is_some(), "{r}");
}

#[tokio::test]
async fn websocket_handshakes_per_ip_are_rate_limited() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIMITS__HANDSHAKES_PER_IP_PER_S", "2"),
            ("HERALD_LIMITS__HANDSHAKE_BURST_PER_IP", "3"),
        ],
    )
    .await;
    let upgrade = "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
                   Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let mut first = node.connected(&["room"]).await;
    for _ in 0..2 {
        assert_eq!(raw_status(&node, upgrade).await, 101, "within the burst");
    }
    assert_eq!(raw_status(&node, upgrade).await, 429, "past the burst");
    assert_eq!(node.metric("herald_handshakes_refused_total").await, 1.0);
    // The API and open connections are not affected; the rate refills.
    let (status, _) = node.api("/api/info", None).await;
    assert_eq!(status, 200);
    let r = first
        .call("history", json!({"channel": "room", "limit": 0}))
        .await;
    assert!(r.get("history").is_some(), "{r}");
    // Waits out the refill (2 per second): a probe would spend the token it waits for.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(raw_status(&node, upgrade).await, 101, "refilled");
}

#[tokio::test]
async fn websocket_pings_do_not_stand_in_for_the_protocol_pong() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_PING_INTERVAL_S", "1"),
            ("HERALD_PONG_TIMEOUT_S", "1"),
        ],
    )
    .await;
    let mut c = node.connected(&["room"]).await;
    c.auto_pong = false;
    let started = std::time::Instant::now();
    let closed = loop {
        c.ws_ping().await;
        let _ = c.next_within(std::time::Duration::from_millis(300)).await;
        if let Some(code) = c.close_code {
            break code;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(8),
            "never closed"
        );
    };
    assert_eq!(closed, 4002);
}

/// Reading fresh channel names makes the node hold each one's epoch only
/// `history_empty_ttl_s` after the last read, not the day a published stream keeps.
#[tokio::test]
async fn reading_fresh_channel_names_leaves_no_lasting_state() {
    let cfg = config_file(
        "herald.toml",
        r#"
        [default_namespace]
        history_empty_ttl_s = 1
        "#,
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let epoch = |body: serde_json::Value| body["epoch"].as_str().unwrap().to_owned();
    let read = |channel: &'static str| {
        let node = &node;
        async move {
            let (status, body) = node
                .api("/api/history", Some(json!({"channel": channel})))
                .await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["offset"], 0, "{body}");
            body
        }
    };
    let first = epoch(read("fresh").await);
    // Reads within the TTL of the last read keep the epoch.
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        assert_eq!(epoch(read("fresh").await), first);
    }
    // Then nothing reads it: it is forgotten (the next read starts a new epoch). The TTL is
    // waited out, not polled: a read would keep the stream.
    tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
    assert_ne!(
        epoch(read("fresh").await),
        first,
        "the empty stream was kept"
    );
}
