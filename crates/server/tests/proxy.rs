//! Proxy hooks against the real binary and a real HTTP backend: a separate Python process
//! (tests/fixtures/proxy_backend.py) on a free port, whose behaviour each test picks through the
//! cookies, data, channels and methods it sends.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tokio::process::Command;

use herald_testkit::hooks::HookBackend as Backend;

/// Namespaces: `room` asks the subscribe proxy (and is token-only without it), `chat` sends
/// publications through the publish proxy (and forbids client publishing without it).
const NAMESPACES: &str = r#"
[[namespaces]]
name = "room"
subscribe = "token"
subscribe_proxy = true

[[namespaces]]
name = "chat"
subscribe = "authenticated"
publish = false
publish_proxy = true
history_size = 10
"#;

async fn node(backend: &Backend, timeout_ms: u64) -> (Node, ConfigFile) {
    let cfg = config_file(
        "herald.toml",
        &format!("{}{NAMESPACES}", backend.section(timeout_ms)),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    (node, cfg)
}

/// A client whose upgrade request carries these cookies and headers.
async fn open(node: &Node, cookie: Option<&str>, headers: &[(&str, &str)]) -> Client {
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    if let Some(c) = cookie {
        all.push(("Cookie", c));
    }
    Client::open(node.addr, &all).await
}

/// A client connected through the proxy as `user`.
async fn logged_in(node: &Node, user: &str) -> Client {
    let mut c = open(node, Some(&format!("sessionid={user}")), &[]).await;
    let r = c.call("connect", json!({})).await;
    assert!(r.get("connect").is_some(), "connect failed: {r}");
    c
}

#[tokio::test]
async fn connect_proxy_authenticates_and_forwards_only_listed_headers_and_cookies() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;

    let mut alice = open(
        &node,
        Some("csrftoken=c1; sessionid=alice; theme=dark"),
        &[("X-App-Version", "7"), ("X-Secret", "never-forwarded")],
    )
    .await;
    let r = alice
        .call(
            "connect",
            json!({"data": {"hello": 1, "channels": ["news", "dm#alice"]}}),
        )
        .await;
    let connect = &r["connect"];
    assert_eq!(
        connect["data"],
        json!({
            "headers": {"x-app-version": "7"},
            "cookies": {"sessionid": "alice"},
            "ip": "127.0.0.1",
            "transport": "websocket",
            "data": {"hello": 1, "channels": ["news", "dm#alice"]},
        }),
        "{r}"
    );
    // Server-side subscriptions from the result, with their positions.
    for ch in ["news", "dm#alice"] {
        let sub = &connect["subs"][ch];
        assert!(sub["epoch"].is_string(), "{ch}: {r}");
        assert_eq!(sub["offset"], 0, "{ch}: {r}");
    }
    node.publish("news", json!({"n": 1})).await;
    let publication = alice.push("pub").await;
    assert_eq!(
        (&publication["channel"], &publication["data"]),
        (&json!("news"), &json!({"n": 1}))
    );
    // The proxy's user is the connection's user: a channel limited to bob stays closed.
    let r = alice.call("subscribe", json!({"channel": "dm#bob"})).await;
    assert_eq!(r["error"]["code"], 103, "{r}");

    // No session cookie: the backend's own error code reaches the client, then close 4505.
    let mut anonymous = open(&node, Some("csrftoken=c1"), &[]).await;
    let r = anonymous.call("connect", json!({})).await;
    assert_eq!(
        r["error"],
        json!({"code": 1401, "message": "not logged in"}),
        "{r}"
    );
    assert_eq!(anonymous.closed().await.code, Some(4505));

    // The backend's disconnect closes with its code and reason.
    let mut banned = open(&node, Some("sessionid=banned"), &[]).await;
    banned.send("connect", json!({})).await;
    let closed = banned.closed().await;
    assert_eq!(closed.code, Some(4601));
    assert_eq!(closed.disconnect.unwrap()["reason"], "banned");
}

#[tokio::test]
async fn a_token_skips_the_connect_proxy_unless_connect_always() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;
    // No cookie, so the backend would refuse: the token is what lets it in.
    let mut c = open(&node, None, &[]).await;
    let r = c
        .call("connect", json!({"token": token(json!({"sub": "tok"}))}))
        .await;
    assert!(r["connect"].is_object(), "{r}");
    assert!(r["connect"].get("data").is_none(), "{r}");

    let cfg = config_file(
        "herald.toml",
        &format!("{}connect_always = true\n", backend.section(2000)),
    );
    let always = Node::start(&["--config", &cfg], &[]).await;
    let mut c = open(&always, None, &[]).await;
    let r = c
        .call("connect", json!({"token": token(json!({"sub": "tok"}))}))
        .await;
    assert_eq!(r["error"]["code"], 1401, "{r}");
}

#[tokio::test]
async fn backend_failures_become_documented_errors_never_hangs() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 300).await;
    // (mode, reply error code); each closes with 4005 so the client comes back later.
    for (mode, code) in [
        ("slow", 112),
        ("500", 100),
        ("garbage", 100),
        ("big", 100),
        ("badcode", 100),
    ] {
        let mut c = open(&node, Some("sessionid=alice"), &[]).await;
        let started = Instant::now();
        let r = c.call("connect", json!({"data": {"mode": mode}})).await;
        assert_eq!(r["error"]["code"], code, "{mode}: {r}");
        assert_eq!(c.closed().await.code, Some(4005), "{mode}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{mode} took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(node.metric("herald_proxy_calls_total").await, 5.0);
    assert_eq!(node.metric("herald_proxy_unavailable_total").await, 1.0);
    assert_eq!(node.metric("herald_proxy_bad_answers_total").await, 4.0);
    // Nobody listens: connection refused is retryable too.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = config_file(
        "herald.toml",
        &format!("[proxy]\nconnect_url = \"http://127.0.0.1:{closed_port}/connect\"\n"),
    );
    let down = Node::start(&["--config", &cfg], &[]).await;
    let mut c = open(&down, Some("sessionid=alice"), &[]).await;
    let r = c.call("connect", json!({})).await;
    assert_eq!(
        r["error"],
        json!({"code": 112, "message": "backend unavailable"}),
        "{r}"
    );
    assert_eq!(c.closed().await.code, Some(4005));
}

#[tokio::test]
async fn subscribe_proxy_allows_denies_and_disconnects() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;
    let mut alice = logged_in(&node, "alice").await;

    // Allowed although the namespace is token-only: the backend decides, its data comes back.
    let r = alice
        .call(
            "subscribe",
            json!({"channel": "room:lobby", "data": {"pin": 42}}),
        )
        .await;
    assert_eq!(
        r["subscribe"]["data"],
        json!({"channel": "room:lobby", "user": "alice", "data": {"pin": 42}}),
        "{r}"
    );
    assert!(r["subscribe"]["epoch"].is_string(), "{r}");
    node.publish("room:lobby", json!("hello")).await;
    assert_eq!(alice.push("pub").await["data"], "hello");

    let r = alice
        .call("subscribe", json!({"channel": "room:deny-me"}))
        .await;
    assert_eq!(
        r["error"],
        json!({"code": 1403, "message": "not a member"}),
        "{r}"
    );
    // A user list is checked before the backend is asked.
    let r = alice
        .call("subscribe", json!({"channel": "room:x#bob"}))
        .await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    // Through connect.subs as well.
    let mut bob = open(&node, Some("sessionid=bob"), &[]).await;
    let r = bob
        .call(
            "connect",
            json!({"subs": {"room:a": {}, "room:deny-b": {}}}),
        )
        .await;
    assert_eq!(r["connect"]["subs"]["room:a"]["data"]["user"], "bob", "{r}");
    assert_eq!(
        r["connect"]["subs"]["room:deny-b"]["error"]["code"], 1403,
        "{r}"
    );

    alice
        .send("subscribe", json!({"channel": "room:kick"}))
        .await;
    let closed = alice.closed().await;
    assert_eq!(closed.code, Some(4602));
    assert_eq!(closed.disconnect.unwrap()["reason"], "kicked");
}

#[tokio::test]
async fn publish_proxy_allows_rewrites_and_rejects() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;
    let mut reader = logged_in(&node, "reader").await;
    let r = reader
        .call("subscribe", json!({"channel": "chat:general"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let mut alice = logged_in(&node, "alice").await;

    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:general", "data": {"action": "rewrite", "text": "hi"}}),
        )
        .await;
    assert_eq!(r["publish"]["offset"], 1, "{r}");
    let rewritten = json!({"text": "HI", "by": "alice"});
    let p = reader.push("pub").await;
    assert_eq!(p["data"], rewritten);
    assert_eq!(p["info"]["user"], "alice");

    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:general", "data": {"text": "as is"}}),
        )
        .await;
    assert_eq!(r["publish"]["offset"], 2, "{r}");
    assert_eq!(reader.push("pub").await["data"], json!({"text": "as is"}));

    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:general", "data": {"action": "reject"}}),
        )
        .await;
    assert_eq!(
        r["error"],
        json!({"code": 1409, "message": "not allowed"}),
        "{r}"
    );
    assert!(
        reader
            .next_within(Duration::from_millis(300))
            .await
            .is_none(),
        "a rejected publication was delivered"
    );

    // History keeps what subscribers got.
    let (status, h) = node
        .api("/api/history", Some(json!({"channel": "chat:general"})))
        .await;
    assert_eq!(status, 200, "{h}");
    let stored: Vec<Value> = h["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["data"].clone())
        .collect();
    assert_eq!(stored, [rewritten, json!({"text": "as is"})]);
}

#[tokio::test]
async fn rpc_is_answered_by_the_backend_and_slow_calls_hold_up_nobody_else() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 3000).await;
    let mut alice = logged_in(&node, "alice").await;
    let r = alice
        .call("rpc", json!({"method": "echo", "data": {"q": [1, 2]}}))
        .await;
    assert_eq!(
        r["rpc"]["data"],
        json!({"method": "echo", "user": "alice", "data": {"q": [1, 2]}}),
        "{r}"
    );
    let r = alice.call("rpc", json!({"method": "fail"})).await;
    assert_eq!(
        r["error"],
        json!({"code": 1500, "message": "no such thing"}),
        "{r}"
    );

    // A call that takes the backend 2 s does not delay another connection's calls, nor the
    // publications of its own connection.
    let r = alice.call("subscribe", json!({"channel": "news"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let slow_id = alice.send("rpc", json!({"method": "slow"})).await;
    let slow_sent = Instant::now();
    // A head start, so that bob's call overlaps alice's: the backend shows no sign of a call in
    // progress to wait for, and a late start would only weaken the check, never fail it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let mut bob = logged_in(&node, "bob").await;
    let r = bob.call("rpc", json!({"method": "echo"})).await;
    assert_eq!(r["rpc"]["data"]["user"], "bob", "{r}");
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "bob waited {:?} behind alice's slow call",
        started.elapsed()
    );
    node.publish("news", json!("during the call")).await;
    let m = alice.next().await;
    assert_eq!(m["pub"]["data"], "during the call", "{m}");
    assert!(
        slow_sent.elapsed() < Duration::from_millis(1800),
        "the publication waited for the 2 s call: {:?}",
        slow_sent.elapsed()
    );
    let r = alice.reply(slow_id).await;
    assert_eq!(r["rpc"]["data"]["method"], "slow", "{r}");

    // Past the timeout: the retryable code.
    let (short, _cfg2) = self::node(&backend, 300).await;
    let mut carol = logged_in(&short, "carol").await;
    let started = Instant::now();
    let r = carol.call("rpc", json!({"method": "slow"})).await;
    assert_eq!(r["error"]["code"], 112, "{r}");
    assert!(started.elapsed() < Duration::from_millis(1200));
    // The connection stays usable.
    let r = carol.call("rpc", json!({"method": "echo"})).await;
    assert_eq!(r["rpc"]["data"]["user"], "carol", "{r}");

    // Without rpc_url, rpc is refused.
    let plain = Node::dev().await;
    let mut c = plain.connected(&[]).await;
    let r = c.call("rpc", json!({"method": "echo"})).await;
    assert_eq!(r["error"]["code"], 108, "{r}");
}

#[tokio::test]
async fn refresh_proxy_extends_or_ends_an_expiring_connection() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;
    let mut keep = open(&node, Some("sessionid=keeper"), &[]).await;
    let r = keep
        .call("connect", json!({"data": {"mode": "expire"}}))
        .await;
    assert!(r["connect"]["expires_in"].as_u64().unwrap() <= 1, "{r}");
    let mut gone = open(&node, Some("sessionid=leaver"), &[]).await;
    let r = gone
        .call("connect", json!({"data": {"mode": "expire"}}))
        .await;
    assert!(r["connect"]["expires_in"].is_u64(), "{r}");

    let closed = gone.closed().await;
    assert_eq!(closed.code, Some(4004));
    // Time passes past the expiry that ended `gone`: the extended connection must see nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = keep.call("subscribe", json!({"channel": "news"})).await;
    assert!(
        r["subscribe"].is_object(),
        "extended connection unusable: {r}"
    );
}

#[tokio::test]
async fn sub_refresh_proxy_extends_or_ends_an_expiring_subscription() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;
    let mut alice = logged_in(&node, "alice").await;
    for ch in ["room:short-keep", "room:short-drop"] {
        let r = alice.call("subscribe", json!({"channel": ch})).await;
        assert!(
            r["subscribe"]["expires_in"].as_u64().unwrap() <= 1,
            "{ch}: {r}"
        );
    }
    let unsub = alice.push("unsub").await;
    assert_eq!(
        (&unsub["channel"], &unsub["code"]),
        (&json!("room:short-drop"), &json!(4004)),
        "{unsub}"
    );
    // Time passes past the expiry that ended the other subscription: this one must stay.
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.publish("room:short-keep", json!("still here")).await;
    let p = alice.push("pub").await;
    assert_eq!(
        (&p["channel"], &p["data"]),
        (&json!("room:short-keep"), &json!("still here"))
    );
}

#[tokio::test]
async fn server_side_subscriptions_from_token_proxy_and_personal_channel_recover_with_since() {
    let backend = Backend::start().await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            "personal_channel = \"user:#{{user}}\"\n{}\n[[namespaces]]\nname = \"user\"\n\
             subscribe = \"token\"\nhistory_size = 10\n",
            backend.section(2000)
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;

    // Through the connect proxy: its channels and the personal channel.
    let mut alice = open(&node, Some("sessionid=alice"), &[]).await;
    let r = alice
        .call("connect", json!({"data": {"channels": ["news"]}}))
        .await;
    let mut subs: Vec<&String> = r["connect"]["subs"].as_object().unwrap().keys().collect();
    subs.sort();
    assert_eq!(subs, ["news", "user:#alice"], "{r}");
    // Through a token's channels claim, the same.
    let mut bob = node.client().await;
    let r = bob
        .call(
            "connect",
            json!({"token": token(json!({"sub": "bob", "channels": ["news"]}))}),
        )
        .await;
    let bob_sub = r["connect"]["subs"]["user:#bob"].clone();
    assert!(bob_sub["epoch"].is_string(), "{r}");
    assert_eq!(bob_sub["offset"], 0, "{r}");
    assert!(r["connect"]["subs"]["news"]["epoch"].is_string(), "{r}");

    // A broadcast to personal channels reaches them without any client subscribe.
    let (status, body) = node
        .api(
            "/api/broadcast",
            Some(json!({"channels": ["user:#alice", "user:#bob"], "data": "hi"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let p = alice.push("pub").await;
    assert_eq!(
        (&p["channel"], &p["data"]),
        (&json!("user:#alice"), &json!("hi"))
    );
    let p = bob.push("pub").await;
    assert_eq!(
        (&p["channel"], &p["offset"]),
        (&json!("user:#bob"), &json!(1))
    );

    // Bob goes away, misses one, and comes back with since: recovered.
    drop(bob);
    node.publish("user:#bob", json!("missed")).await;
    let mut bob = node.client().await;
    let since = json!({"epoch": bob_sub["epoch"], "offset": 1});
    let r = bob
        .call(
            "connect",
            json!({"token": token(json!({"sub": "bob"})), "subs": {"user:#bob": {"since": since}}}),
        )
        .await;
    let sub = &r["connect"]["subs"]["user:#bob"];
    assert_eq!(sub["recovered"], true, "{r}");
    assert_eq!(sub["publications"][0]["data"], "missed", "{r}");
    assert_eq!(sub["publications"].as_array().unwrap().len(), 1, "{r}");
}

#[tokio::test]
async fn the_stream_and_sse_transports_go_through_the_connect_proxy_too() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 2000).await;
    let out = Command::new("curl")
        .args(["-sN", "--max-time", "1", "-X", "POST"])
        .arg(format!("http://{}/connection/stream", node.addr))
        .args(["-H", "Cookie: theme=dark; sessionid=carol"])
        .args(["-H", "X-App-Version: 9", "-H", "X-Other: no"])
        .args(["-d", r#"{"subs": {"news": {}}, "data": {"via": "curl"}}"#])
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    let first: Value = serde_json::from_str(text.lines().next().expect("a line")).unwrap();
    assert_eq!(
        first["connect"]["data"],
        json!({
            "headers": {"x-app-version": "9"},
            "cookies": {"sessionid": "carol"},
            "ip": "127.0.0.1",
            "transport": "stream",
            "data": {"via": "curl"},
        }),
        "{text}"
    );
    assert!(
        first["connect"]["subs"]["news"]["epoch"].is_string(),
        "{text}"
    );

    // Server-Sent Events: the same, with the data in the `connected` event.
    let out = Command::new("curl")
        .args(["-sN", "--max-time", "1"])
        .arg(format!("http://{}/connection/sse?channel=news", node.addr))
        .args(["-H", "Cookie: sessionid=dave"])
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    let connected = text
        .split("\n\n")
        .find(|block| block.contains("event: connected"))
        .and_then(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .unwrap_or_else(|| panic!("no connected event in {text}"));
    let connected: Value = serde_json::from_str(connected).unwrap();
    assert_eq!(connected["data"]["transport"], "sse", "{text}");
    assert_eq!(
        connected["data"]["cookies"],
        json!({"sessionid": "dave"}),
        "{text}"
    );
}

/// Two nodes on one broker, both with the hooks: a publication rewritten by the publish proxy on
/// one node is what a subscriber on the other receives and what history there returns; the
/// connect, subscribe and rpc hooks answer on either node.
async fn hooks_work_the_same_on_every_node(broker_url: &str) {
    let backend = Backend::start().await;
    let cfg = config_file(
        "herald.toml",
        &format!("{}{NAMESPACES}", backend.section(2000)),
    );
    let env = [("HERALD_BROKER_URL", broker_url)];
    let a = Node::start(&["--config", &cfg], &env).await;
    let b = Node::start(&["--config", &cfg], &env).await;

    let mut reader = logged_in(&b, "reader").await;
    let r = reader
        .call("subscribe", json!({"channel": "chat:multi", "data": 1}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let r = reader
        .call("subscribe", json!({"channel": "room:deny-b"}))
        .await;
    assert_eq!(r["error"]["code"], 1403, "{r}");
    let r = reader.call("rpc", json!({"method": "echo"})).await;
    assert_eq!(r["rpc"]["data"]["user"], "reader", "{r}");

    let mut alice = logged_in(&a, "alice").await;
    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:multi", "data": {"action": "rewrite", "text": "across"}}),
        )
        .await;
    assert_eq!(r["publish"]["offset"], 1, "{r}");
    let rewritten = json!({"text": "ACROSS", "by": "alice"});
    let p = reader.push("pub").await;
    assert_eq!(
        (&p["channel"], &p["data"]),
        (&json!("chat:multi"), &rewritten)
    );
    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:multi", "data": {"action": "reject"}}),
        )
        .await;
    assert_eq!(r["error"]["code"], 1409, "{r}");

    let (status, h) = b
        .api("/api/history", Some(json!({"channel": "chat:multi"})))
        .await;
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["publications"][0]["data"], rewritten, "{h}");
    assert_eq!(h["publications"].as_array().unwrap().len(), 1, "{h}");
}

#[tokio::test]
async fn hooks_across_nodes_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    hooks_work_the_same_on_every_node(&redis.url()).await;
}

#[tokio::test]
async fn hooks_across_nodes_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    hooks_work_the_same_on_every_node(&nats.url()).await;
}

/// Status line, headers (names in lower case) and body of a request refused before streaming,
/// read by curl.
async fn http_answer(args: &[&str]) -> (u16, Vec<(String, String)>, Value) {
    let out = Command::new("curl")
        .args(["-s", "-i", "--max-time", "5"])
        .args(args)
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (
        status,
        headers,
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// SSE and NDJSON requests keep the connect hook's answer in their HTTP status and body: a
/// refusal is its 14xx code's 4xx status, a backend `disconnect` comes back with its code and
/// reason, a bad answer is 502 and an unavailable backend 503 with `Retry-After`.
#[tokio::test]
async fn stream_refusals_keep_the_connect_hooks_answer() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend, 300).await;
    let sse = format!("http://{}/connection/sse?channel=news", node.addr);
    let stream = format!("http://{}/connection/stream", node.addr);
    let error = |code: u64, message: &str| json!({"error": {"code": code, "message": message}});
    let retry_after = |headers: &[(String, String)]| {
        headers
            .iter()
            .find(|(k, _)| k == "retry-after")
            .map(|(_, v)| v.clone())
    };

    let (status, headers, body) = http_answer(&[&sse]).await;
    assert_eq!((status, &body), (401, &error(1401, "not logged in")));
    assert_eq!(retry_after(&headers), None);
    let (status, _, body) = http_answer(&["-H", "Cookie: sessionid=banned", &sse]).await;
    assert_eq!((status, &body), (403, &error(4601, "banned")));
    let (status, _, body) = http_answer(&["-X", "POST", "-d", "{}", &stream]).await;
    assert_eq!((status, &body), (401, &error(1401, "not logged in")));
    let bad = r#"{"data": {"mode": "garbage"}}"#;
    let (status, _, body) = http_answer(&["-X", "POST", "-d", bad, &stream]).await;
    assert_eq!((status, &body), (502, &error(100, "internal error")));
    let slow = r#"{"data": {"mode": "slow"}}"#;
    let (status, headers, body) = http_answer(&["-X", "POST", "-d", slow, &stream]).await;
    assert_eq!((status, &body), (503, &error(112, "backend unavailable")));
    assert_eq!(retry_after(&headers).as_deref(), Some("2"));
}

/// A minimal HTTP/1.1 backend on a real listener: every request is a connect hook allowed after
/// `delay`. It counts the TCP connections it accepted, the most open at once (a connection the
/// node closes, even while its request waits, is noticed at once), and the most requests it was
/// answering at once.
struct CountingBackend {
    port: u16,
    counts: std::sync::Arc<Counts>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Counts {
    accepted: std::sync::atomic::AtomicUsize,
    open: Gauge,
    in_flight: Gauge,
}

/// A number that goes up and down, and the highest it reached.
#[derive(Default)]
struct Gauge {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Gauge {
    fn up(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
    }

    fn down(&self) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One connection of a [`CountingBackend`], until the node closes it.
async fn counting_connection(mut tcp: tokio::net::TcpStream, delay: Duration, counts: &Counts) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // One request: the head, then Content-Length bytes of body.
        let complete = |seen: &[u8]| {
            let at = seen.windows(4).position(|w| w == b"\r\n\r\n")?;
            let head = String::from_utf8_lossy(&seen[..at]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            (seen.len() >= at + 4 + length).then_some(at + 4 + length)
        };
        let end = loop {
            if let Some(end) = complete(&seen) {
                break end;
            }
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        };
        seen.drain(..end);
        // The backend's answer takes `delay` (the point of this backend); wait, but notice a node that gives up and closes the connection meanwhile.
        counts.in_flight.up();
        let gone = tokio::select! {
            _ = tokio::time::sleep(delay) => false,
            read = tcp.read(&mut buf) => match read {
                Ok(0) | Err(_) => true,
                Ok(n) => {
                    seen.extend_from_slice(&buf[..n]);
                    false
                }
            },
        };
        counts.in_flight.down();
        if gone {
            return;
        }
        let body = r#"{"result": {"user": "u"}}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if tcp.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

impl CountingBackend {
    async fn start(delay: Duration) -> CountingBackend {
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                c.accepted.fetch_add(1, Ordering::SeqCst);
                c.open.up();
                let c = c.clone();
                tokio::spawn(async move {
                    counting_connection(tcp, delay, &c).await;
                    c.open.down();
                });
            }
        });
        CountingBackend {
            port,
            counts,
            _task: task,
        }
    }

    /// (connections accepted, most open at once, most requests answered at once)
    fn counts(&self) -> (usize, usize, usize) {
        let c = &self.counts;
        (
            c.accepted.load(std::sync::atomic::Ordering::SeqCst),
            c.open.most(),
            c.in_flight.most(),
        )
    }
}

/// `proxy.max_connections` bounds the calls in flight to the backend, and so the connections a
/// node opens to it: 400 connects at once all succeed with at most 8 calls at a time, through a
/// handful of connections (a finished call's connection goes back to the pool a moment after its
/// answer, so a burst may open a few more than 8; the pool keeps at most 8 idle). With a backend
/// slower than `timeout_ms`, the connects waiting for a free call fail with 112 in bounded time.
#[tokio::test]
async fn backend_connections_are_capped() {
    const CAP: usize = 8;
    const CLIENTS: usize = 400;
    let backend = CountingBackend::start(Duration::from_millis(10)).await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            "[proxy]\nconnect_url = \"http://127.0.0.1:{}/connect\"\ntimeout_ms = 20000\n\
             max_connections = {CAP}\n",
            backend.port
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let connects = (0..CLIENTS).map(|_| {
        let addr = node.addr;
        tokio::spawn(async move {
            let mut c = Client::open(addr, &[]).await;
            c.call("connect", json!({})).await
        })
    });
    let replies = tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::join_all(connects),
    )
    .await
    .expect("400 connects within 60 s");
    for r in replies {
        let r = r.unwrap();
        assert!(r.get("connect").is_some(), "{r}");
    }
    let (accepted, open, calls) = backend.counts();
    assert!(
        calls <= CAP && open <= 2 * CAP && accepted <= 2 * CAP,
        "{calls} calls at once, {open} connections open at once, {accepted} in all; cap {CAP}"
    );

    // A backend slower than the timeout: the calls past the cap wait, then fail with 112.
    let slow = CountingBackend::start(Duration::from_secs(5)).await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            "[proxy]\nconnect_url = \"http://127.0.0.1:{}/connect\"\ntimeout_ms = 500\n\
             max_connections = {CAP}\n",
            slow.port
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let started = Instant::now();
    let connects = (0..3 * CAP).map(|_| {
        let addr = node.addr;
        tokio::spawn(async move {
            let mut c = Client::open(addr, &[]).await;
            c.call("connect", json!({})).await
        })
    });
    for r in futures_util::future::join_all(connects).await {
        let r = r.unwrap();
        assert_eq!(r["error"]["code"], 112, "{r}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    drop(slow);
}

/// `binary_encoding` on `[proxy]`, off again for the `chat` namespace's hooks.
async fn binary_node(backend: &Backend) -> (Node, ConfigFile) {
    let cfg = config_file(
        "herald.toml",
        &format!(
            "{}binary_encoding = true\n{NAMESPACES}\n\
             [[proxy.namespaces]]\nname = \"chat\"\nbinary_encoding = false\n",
            backend.section(3000)
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    (node, cfg)
}

#[tokio::test]
async fn binary_encoding_sends_b64data_and_reads_the_answers_b64data() {
    use base64::Engine;
    let backend = Backend::start().await;
    let (node, _cfg) = binary_node(&backend).await;
    let mut alice = logged_in(&node, "alice").await;

    // The request carries the data's exact bytes as b64data and no data; the answer's b64data
    // is the reply's data.
    let r = alice
        .call("rpc", json!({"method": "echo", "data": {"q": [1, 2]}}))
        .await;
    let sent = base64::engine::general_purpose::STANDARD.encode(r#"{"q":[1,2]}"#);
    assert_eq!(
        r["rpc"]["data"],
        json!({"method": "echo", "user": "alice", "data": null, "b64data": sent}),
        "{r}"
    );

    // The subscribe hook: request and answer in b64data.
    let r = alice
        .call(
            "subscribe",
            json!({"channel": "room:lobby", "data": {"k": 1}}),
        )
        .await;
    assert_eq!(
        r["subscribe"]["data"],
        json!({"channel": "room:lobby", "user": "alice", "data": {"k": 1}}),
        "{r}"
    );

    // An answer with both data and b64data, or b64data that is not JSON: internal error.
    for method in ["both", "notjson"] {
        let r = alice.call("rpc", json!({"method": method})).await;
        assert_eq!(r["error"]["code"], 100, "{method}: {r}");
    }
    // The connection is still usable.
    let r = alice.call("rpc", json!({"method": "echo"})).await;
    assert_eq!(r["rpc"]["data"]["user"], "alice", "{r}");
}

#[tokio::test]
async fn binary_encoding_is_set_per_namespace() {
    let backend = Backend::start().await;
    let (node, _cfg) = binary_node(&backend).await;
    let mut reader = logged_in(&node, "reader").await;
    let r = reader
        .call("subscribe", json!({"channel": "chat:general"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let mut alice = logged_in(&node, "alice").await;
    // `chat` turns it off: the publish hook gets data and answers data (no "b64" mark).
    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:general", "data": {"action": "rewrite", "text": "hi"}}),
        )
        .await;
    assert!(r["publish"].is_object(), "{r}");
    assert_eq!(
        reader.push("pub").await["data"],
        json!({"text": "HI", "by": "alice"})
    );
}

#[tokio::test]
async fn binary_encoding_rewrites_publications_from_b64data() {
    let backend = Backend::start().await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            "{}binary_encoding = true\n{NAMESPACES}",
            backend.section(3000)
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let mut reader = logged_in(&node, "reader").await;
    let r = reader
        .call("subscribe", json!({"channel": "chat:general"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let mut alice = logged_in(&node, "alice").await;
    let r = alice
        .call(
            "publish",
            json!({"channel": "chat:general", "data": {"action": "rewrite", "text": "hi"}}),
        )
        .await;
    assert!(r["publish"].is_object(), "{r}");
    assert_eq!(
        reader.push("pub").await["data"],
        json!({"text": "HI", "by": "alice", "b64": true})
    );
}
