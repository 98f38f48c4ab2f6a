//! The Pusher endpoint with raw WebSocket frames: bad input gets Pusher's documented errors and
//! nothing else changes; handshake refusals close with the protocol's codes; a Herald-protocol
//! client and a Pusher client share an app's channel through the `pusher` namespace; two nodes on
//! Redis or NATS deliver events and presence across nodes, report occupancy and members once per
//! cluster and answer the HTTP API's channel queries for the cluster; a refused webhook is retried;
//! a catch-up client beside a stock one (whose events the fan-out writes directly) gets every
//! event once, in order, with `herald_offset`, across reconnects.

mod common;

use std::time::Duration;

use common::{config_file, Client, Node};
use serde_json::{json, Value};
use tokio::net::TcpStream;

const APP: [(&str, &str); 3] = [
    ("HERALD_PUSHER_APP_ID", "7"),
    ("HERALD_PUSHER_APP_KEY", "app-key"),
    ("HERALD_PUSHER_APP_SECRET", "app-secret"),
];

async fn open(node: &Node, path_and_query: &str) -> Client {
    let tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
    let url = format!("ws://{}{path_and_query}", node.addr);
    Client::open_on(Box::new(tcp), &url, &[])
        .await
        .expect("ws handshake")
}

/// A connected Pusher client: returns it and its socket id.
async fn connected(node: &Node) -> (Client, String) {
    let mut c = open(node, "/app/app-key?protocol=7&client=raw&version=1").await;
    let m = c.next().await;
    assert_eq!(m["event"], "pusher:connection_established", "{m}");
    let data: Value = serde_json::from_str(m["data"].as_str().expect("data is a string")).unwrap();
    assert_eq!(data["activity_timeout"], 120);
    let socket_id = data["socket_id"].as_str().unwrap().to_owned();
    (c, socket_id)
}

async fn send(c: &mut Client, event: &str, data: Value) {
    c.send_raw(&json!({"event": event, "data": data}).to_string())
        .await;
}

/// The next message, which must be `event`.
async fn expect(c: &mut Client, event: &str) -> Value {
    let m = c.next().await;
    assert_eq!(m["event"], event, "expected {event}, got {m}");
    m
}

#[tokio::test]
async fn bad_input_gets_pusher_errors_and_the_connection_carries_on() {
    let node = Node::start(&["--dev"], &APP).await;
    let (mut c, _) = connected(&node).await;

    c.send_raw("{not json").await;
    let e = expect(&mut c, "pusher:error").await;
    assert!(e["data"]["message"].as_str().unwrap().contains("Invalid"));

    send(&mut c, "pusher:teleport", json!({})).await;
    expect(&mut c, "pusher:error").await;

    send(&mut c, "pusher:subscribe", json!("no channel here")).await;
    expect(&mut c, "pusher:error").await;

    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "presence-room", "auth": "app-key:00"}),
    )
    .await;
    let e = expect(&mut c, "pusher:subscription_error").await;
    assert_eq!(e["channel"], "presence-room");
    assert_eq!(e["data"]["status"], 401);
    assert!(e["data"]["error"]
        .as_str()
        .unwrap()
        .contains("channel_data"));

    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "private-x", "auth": "app-key:deadbeef"}),
    )
    .await;
    let e = expect(&mut c, "pusher:subscription_error").await;
    assert_eq!(e["data"]["type"], "AuthError");

    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "bad channel"}),
    )
    .await;
    let e = expect(&mut c, "pusher:subscription_error").await;
    assert_eq!(e["data"]["status"], 400);

    // A client event on a channel it is not subscribed to, and on a public one.
    c.send_raw(&json!({"event": "client-x", "channel": "news", "data": {}}).to_string())
        .await;
    expect(&mut c, "pusher:error").await;

    // A user's channel needs a sign-in as that user.
    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "#server-to-user-carol"}),
    )
    .await;
    let e = expect(&mut c, "pusher:subscription_error").await;
    assert_eq!(e["data"]["status"], 403);

    // Still fine: ping, subscribe.
    send(&mut c, "pusher:ping", json!({})).await;
    expect(&mut c, "pusher:pong").await;
    send(&mut c, "pusher:subscribe", json!({"channel": "news"})).await;
    let ok = expect(&mut c, "pusher_internal:subscription_succeeded").await;
    assert_eq!(ok["channel"], "news");
    assert_eq!(ok["data"], "{}", "data is a JSON string");
    assert!(c.next_within(Duration::from_millis(200)).await.is_none());
}

/// The `pusher:error` sent before the close, and the close code.
async fn refused(node: &Node, path: &str) -> (Value, u16) {
    let mut c = open(node, path).await;
    let e = expect(&mut c, "pusher:error").await;
    let closed = c.closed().await;
    (e["data"].clone(), closed.code.expect("a close frame"))
}

#[tokio::test]
async fn handshake_refusals_close_with_pusher_codes() {
    let config = config_file(
        "herald.toml",
        "[[pusher.apps]]\nid = \"one\"\nkey = \"one-key\"\nsecret = \"s\"\nmax_connections = 1\n",
    );
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let (data, code) = refused(&node, "/app/nobody?protocol=7").await;
    assert_eq!((data["code"].as_u64(), code), (Some(4001), 4001), "{data}");
    let (_, code) = refused(&node, "/app/one-key").await;
    assert_eq!(code, 4008, "no protocol version");
    let (_, code) = refused(&node, "/app/one-key?protocol=3").await;
    assert_eq!(code, 4007, "unsupported protocol version");

    let mut first = open(&node, "/app/one-key?protocol=7").await;
    expect(&mut first, "pusher:connection_established").await;
    let (data, code) = refused(&node, "/app/one-key?protocol=7").await;
    assert_eq!(code, 4100, "over capacity: {data}");

    // Draining tells clients to reconnect at once (4200).
    node.sigterm();
    let e = expect(&mut first, "pusher:error").await;
    assert_eq!(e["data"]["code"], 4200);
    assert_eq!(first.closed().await.code, Some(4200));
}

#[tokio::test]
async fn herald_clients_share_the_channel_through_the_pusher_namespace() {
    let config = config_file(
        "herald.toml",
        "[[namespaces]]\nname = \"pusher\"\nsubscribe = \"anonymous\"\n",
    );
    let node = Node::start(&["--dev", "--config", &config], &APP).await;
    let (mut p, socket_id) = connected(&node).await;
    send(&mut p, "pusher:subscribe", json!({"channel": "news"})).await;
    expect(&mut p, "pusher_internal:subscription_succeeded").await;
    let mut h = node.connected(&["pusher:7:news"]).await;

    // An envelope from the Herald API is a Pusher event; other data arrives as herald:publication.
    node.publish(
        "pusher:7:news",
        json!({"event": "headline", "data": "{\"t\":1}"}),
    )
    .await;
    let m = expect(&mut p, "headline").await;
    assert_eq!(
        (m["channel"].as_str(), m["data"].as_str()),
        (Some("news"), Some("{\"t\":1}"))
    );
    node.publish("pusher:7:news", json!({"text": "hi"})).await;
    let m = expect(&mut p, "herald:publication").await;
    assert_eq!(m["data"], json!({"text": "hi"}));

    // The Herald client sees both, and an event excluded for the Pusher socket reaches it only.
    node.publish(
        "pusher:7:news",
        json!({"event": "x", "data": "d", "exclude": socket_id}),
    )
    .await;
    for _ in 0..3 {
        h.push("pub").await;
    }
    assert!(p.next_within(Duration::from_millis(300)).await.is_none());
}

#[tokio::test]
async fn client_events_are_rate_limited_with_4301() {
    let mut env = APP.to_vec();
    env.push(("HERALD_PUSHER_APP_ENABLE_CLIENT_EVENTS", "true"));
    let node = Node::start(&["--dev"], &env).await;
    let (mut c, socket_id) = connected(&node).await;
    let sig = herald_server::pusher::auth::sign("app-secret", &format!("{socket_id}:private-chat"));
    let auth = format!("app-key:{sig}");
    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "private-chat", "auth": auth}),
    )
    .await;
    expect(&mut c, "pusher_internal:subscription_succeeded").await;
    // The default allows 10 a second with a burst of 20: 40 at once cannot all pass.
    for n in 0..40 {
        c.send_raw(
            &json!({"event": "client-n", "channel": "private-chat", "data": {"n": n}}).to_string(),
        )
        .await;
    }
    let mut limited = 0;
    while let Some(m) = c.next_within(Duration::from_millis(500)).await {
        assert_eq!(
            m["event"], "pusher:error",
            "the sender gets nothing else: {m}"
        );
        assert_eq!(m["data"]["code"], 4301);
        limited += 1;
    }
    assert!((10..=25).contains(&limited), "{limited} refused");
}

/// A signed Pusher HTTP API call (as the server SDKs sign them).
async fn signed(node: &Node, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    signed_with(node, method, path, &[], body).await
}

/// A signed Pusher HTTP API call with query parameters (plain values: not URL-encoded).
async fn signed_with(
    node: &Node,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    use herald_server::pusher::auth::{md5_hex, sign};
    let body = body.map(|b| b.to_string());
    let mut params = vec![
        ("auth_key".to_owned(), "app-key".to_owned()),
        ("auth_timestamp".to_owned(), common::now().to_string()),
        ("auth_version".to_owned(), "1.0".to_owned()),
    ];
    params.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    if let Some(b) = &body {
        params.push(("body_md5".to_owned(), md5_hex(b.as_bytes())));
    }
    params.sort();
    let query = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let signature = sign("app-secret", &format!("{method}\n{path}\n{query}"));
    let url = format!("{path}?{query}&auth_signature={signature}");
    node.http(method, &url, body, None).await
}

#[tokio::test]
async fn two_nodes_on_redis_share_events_and_presence() {
    let redis = herald_testkit::redis::RedisServer::start();
    two_nodes_share_events_and_presence(&redis.url()).await;
}

#[tokio::test]
async fn two_nodes_on_nats_share_events_and_presence() {
    let nats = herald_testkit::nats::NatsServer::start();
    two_nodes_share_events_and_presence(&nats.url()).await;
}

async fn two_nodes_share_events_and_presence(url: &str) {
    let mut env = APP.to_vec();
    env.push(("HERALD_BROKER_URL", url));
    let a = Node::start(&["--dev"], &env).await;
    let b = Node::start(&["--dev"], &env).await;

    let (mut on_a, socket_a) = connected(&a).await;
    let alice = r#"{"user_id":"alice"}"#;
    let sig = herald_server::pusher::auth::sign(
        "app-secret",
        &format!("{socket_a}:presence-room:{alice}"),
    );
    let auth = format!("app-key:{sig}");
    send(
        &mut on_a,
        "pusher:subscribe",
        json!({"channel": "presence-room", "auth": auth, "channel_data": alice}),
    )
    .await;
    expect(&mut on_a, "pusher_internal:subscription_succeeded").await;

    // Bob joins on node B: alice, on node A, sees him.
    let (mut on_b, socket_b) = connected(&b).await;
    let bob = r#"{"user_id":"bob","user_info":{"name":"Bob"}}"#;
    let sig =
        herald_server::pusher::auth::sign("app-secret", &format!("{socket_b}:presence-room:{bob}"));
    let auth = format!("app-key:{sig}");
    send(
        &mut on_b,
        "pusher:subscribe",
        json!({"channel": "presence-room", "auth": auth, "channel_data": bob}),
    )
    .await;
    let ok = expect(&mut on_b, "pusher_internal:subscription_succeeded").await;
    let members: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
    assert_eq!(members["presence"]["count"], 2, "{members}");
    let added = expect(&mut on_a, "pusher_internal:member_added").await;
    let added: Value = serde_json::from_str(added["data"].as_str().unwrap()).unwrap();
    assert_eq!(
        added,
        json!({"user_id": "bob", "user_info": {"name": "Bob"}})
    );

    // An event triggered through node B reaches the subscriber on node A.
    let (status, _) = signed(
        &b,
        "POST",
        "/apps/7/events",
        Some(json!({"name": "hello", "channel": "presence-room", "data": "{}"})),
    )
    .await;
    assert_eq!(status, 200);
    let m = expect(&mut on_a, "hello").await;
    assert_eq!(m["channel"], "presence-room");
    expect(&mut on_b, "hello").await;

    // Users are cluster-wide, asked on either node.
    let (status, users) = signed(&a, "GET", "/apps/7/channels/presence-room/users", None).await;
    assert_eq!(status, 200);
    let mut ids: Vec<&str> = users["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["alice", "bob"]);

    send(
        &mut on_b,
        "pusher:unsubscribe",
        json!({"channel": "presence-room"}),
    )
    .await;
    let removed = expect(&mut on_a, "pusher_internal:member_removed").await;
    assert_eq!(removed["data"], r#"{"user_id":"bob"}"#);
}

#[tokio::test]
async fn catch_up_extension_replays_what_a_reconnecting_client_missed() {
    let node = Node::start(&["--dev"], &APP).await;
    let trigger =
        |n: u64| json!({"name": "tick", "channel": "ticker", "data": format!("{{\"n\":{n}}}")});
    let (mut c, _) = connected(&node).await;
    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "ticker", "herald_positions": true}),
    )
    .await;
    let ok = expect(&mut c, "pusher_internal:subscription_succeeded").await;
    let data: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
    let epoch = data["herald"]["epoch"].as_str().unwrap().to_owned();
    assert_eq!(data["herald"]["offset"], 0);
    assert_eq!(
        signed(&node, "POST", "/apps/7/events", Some(trigger(1)))
            .await
            .0,
        200
    );
    let m = expect(&mut c, "tick").await;
    assert_eq!(m["herald_offset"], 1);
    drop(c);

    // Published while the client was away.
    for n in 2..=3 {
        assert_eq!(
            signed(&node, "POST", "/apps/7/events", Some(trigger(n)))
                .await
                .0,
            200
        );
    }
    let (mut c, _) = connected(&node).await;
    let since = json!({"epoch": epoch, "offset": 1});
    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "ticker", "herald_since": since}),
    )
    .await;
    let ok = expect(&mut c, "pusher_internal:subscription_succeeded").await;
    let data: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["herald"]["recovered"], true, "{data}");
    for n in 2..=3 {
        let m = expect(&mut c, "tick").await;
        assert_eq!(m["herald_offset"], n);
        assert_eq!(m["data"], format!("{{\"n\":{n}}}"));
    }
    assert_eq!(
        signed(&node, "POST", "/apps/7/events", Some(trigger(4)))
            .await
            .0,
        200
    );
    assert_eq!(expect(&mut c, "tick").await["herald_offset"], 4);

    // A stock subscription sees no extension fields; an unknown epoch cannot be recovered.
    let (mut plain, _) = connected(&node).await;
    send(&mut plain, "pusher:subscribe", json!({"channel": "ticker"})).await;
    assert_eq!(
        expect(&mut plain, "pusher_internal:subscription_succeeded").await["data"],
        "{}"
    );
    let stale = json!({"epoch": "not-the-epoch", "offset": 1});
    send(
        &mut c,
        "pusher:subscribe",
        json!({"channel": "ticker2", "herald_since": stale}),
    )
    .await;
    let ok = expect(&mut c, "pusher_internal:subscription_succeeded").await;
    let data: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["herald"]["recovered"], false, "{data}");
    assert_eq!(
        signed(&node, "POST", "/apps/7/events", Some(trigger(5)))
            .await
            .0,
        200
    );
    let m = expect(&mut plain, "tick").await;
    assert!(m.get("herald_offset").is_none(), "{m}");
}

#[tokio::test]
async fn a_silent_client_is_pinged_then_closed_with_4201() {
    let config = config_file(
        "herald.toml",
        "pong_timeout_s = 1\n[pusher]\nactivity_timeout_s = 1\n",
    );
    let node = Node::start(&["--dev", "--config", &config], &APP).await;
    let mut c = open(&node, "/app/app-key?protocol=7").await;
    let m = expect(&mut c, "pusher:connection_established").await;
    let data: Value = serde_json::from_str(m["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["activity_timeout"], 1);
    expect(&mut c, "pusher:ping").await;
    send(&mut c, "pusher:pong", json!({})).await;
    expect(&mut c, "pusher:ping").await; // answered: pinged again after the next silence
    let e = expect(&mut c, "pusher:error").await;
    assert_eq!(e["data"]["code"], 4201);
    assert_eq!(c.closed().await.code, Some(4201));
}

/// A webhook receiver: answers 200 and hands over each request's JSON body.
async fn webhook_receiver() -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    refusing_webhook_receiver(0).await
}

/// A webhook receiver that answers the first `refuse` requests with 500 and the rest with 200;
/// it hands over every request as `{valid, body, status}`.
async fn refusing_webhook_receiver(
    refuse: usize,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let seen = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&raw).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() < length {
                        continue;
                    }
                    let signature = head
                        .lines()
                        .find_map(|l| l.strip_prefix("x-pusher-signature: "))
                        .unwrap_or_default()
                        .to_owned();
                    let ok = herald_server::pusher::auth::verify("app-secret", body, &signature);
                    let status = if seen.fetch_add(1, Ordering::SeqCst) < refuse {
                        500
                    } else {
                        200
                    };
                    let _ = tx.send(json!({
                        "valid": ok,
                        "body": serde_json::from_str::<Value>(body).unwrap(),
                        "status": status,
                    }));
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                    return;
                }
            });
        }
    });
    (url, rx)
}

/// Webhook event names (and channels) received within `wait`.
async fn webhooks(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Value>,
    wait: Duration,
) -> Vec<String> {
    let mut names = Vec::new();
    while let Ok(Some(hook)) = tokio::time::timeout(wait, rx.recv()).await {
        assert_eq!(hook["valid"], true, "signed: {hook}");
        for e in hook["body"]["events"].as_array().unwrap() {
            names.push(format!(
                "{} {}",
                e["name"].as_str().unwrap(),
                e["channel"].as_str().unwrap()
            ));
        }
    }
    names
}

#[tokio::test]
async fn occupancy_webhooks_are_per_cluster_not_per_node_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    occupancy_webhooks_are_per_cluster(&redis.url()).await;
}

#[tokio::test]
async fn occupancy_webhooks_are_per_cluster_not_per_node_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    occupancy_webhooks_are_per_cluster(&nats.url()).await;
}

async fn occupancy_webhooks_are_per_cluster(url: &str) {
    let (hook_url, mut hooks) = webhook_receiver().await;
    let mut env = APP.to_vec();
    env.push(("HERALD_BROKER_URL", url));
    env.push(("HERALD_PUSHER_APP_WEBHOOK_URL", &hook_url));
    let a = Node::start(&["--dev"], &env).await;
    let b = Node::start(&["--dev"], &env).await;
    let wait = Duration::from_millis(600);

    let (mut on_a, _) = connected(&a).await;
    send(&mut on_a, "pusher:subscribe", json!({"channel": "room"})).await;
    expect(&mut on_a, "pusher_internal:subscription_succeeded").await;
    assert_eq!(webhooks(&mut hooks, wait).await, ["channel_occupied room"]);

    let (mut on_b, _) = connected(&b).await;
    send(&mut on_b, "pusher:subscribe", json!({"channel": "room"})).await;
    expect(&mut on_b, "pusher_internal:subscription_succeeded").await;
    assert!(
        webhooks(&mut hooks, wait).await.is_empty(),
        "already occupied"
    );

    send(&mut on_a, "pusher:unsubscribe", json!({"channel": "room"})).await;
    assert!(
        webhooks(&mut hooks, wait).await.is_empty(),
        "still occupied on B"
    );
    drop(on_b); // the last subscriber goes away with its connection
    assert_eq!(webhooks(&mut hooks, wait).await, ["channel_vacated room"]);
}

#[tokio::test]
async fn a_refused_webhook_is_retried_with_the_same_signed_body() {
    let (hook_url, mut hooks) = refusing_webhook_receiver(1).await;
    let mut env = APP.to_vec();
    env.push(("HERALD_PUSHER_APP_WEBHOOK_URL", &hook_url));
    let node = Node::start(&["--dev"], &env).await;
    let (mut c, _) = connected(&node).await;
    send(&mut c, "pusher:subscribe", json!({"channel": "room"})).await;
    expect(&mut c, "pusher_internal:subscription_succeeded").await;

    let wait = Duration::from_secs(5);
    let first = tokio::time::timeout(wait, hooks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first["status"], 500, "{first}");
    let sent_at = std::time::Instant::now();
    let retry = tokio::time::timeout(wait, hooks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(retry["status"], 200, "{retry}");
    assert_eq!(retry["valid"], true);
    assert_eq!(
        retry["body"], first["body"],
        "the same batch, the same signature"
    );
    assert_eq!(retry["body"]["events"][0]["name"], "channel_occupied");
    // The first retry waits its backoff (1 s), not a busy loop.
    assert!(
        sent_at.elapsed() >= Duration::from_millis(500),
        "{:?}",
        sent_at.elapsed()
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), hooks.recv())
            .await
            .is_err(),
        "delivered once, not again"
    );
}

/// Subscribe a presence member `user` on `c` (socket `socket`).
async fn join_presence(c: &mut Client, socket: &str, channel: &str, user: &str) {
    let data = json!({"user_id": user}).to_string();
    let sig =
        herald_server::pusher::auth::sign("app-secret", &format!("{socket}:{channel}:{data}"));
    send(
        c,
        "pusher:subscribe",
        json!({"channel": channel, "auth": format!("app-key:{sig}"), "channel_data": data}),
    )
    .await;
    expect(c, "pusher_internal:subscription_succeeded").await;
}

#[tokio::test]
async fn member_webhooks_are_per_cluster_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    let redis_url = redis.url();
    let (hook_url, mut hooks) = webhook_receiver().await;
    let mut env = APP.to_vec();
    env.push(("HERALD_BROKER_URL", &redis_url));
    env.push(("HERALD_PUSHER_APP_WEBHOOK_URL", &hook_url));
    let a = Node::start(&["--dev"], &env).await;
    let b = Node::start(&["--dev"], &env).await;
    let wait = Duration::from_millis(600);
    let room = "presence-room";

    // Alice's first socket anywhere: she is added (and the channel occupied).
    let (mut alice_a, socket) = connected(&a).await;
    join_presence(&mut alice_a, &socket, room, "alice").await;
    let mut got = webhooks(&mut hooks, wait).await;
    got.sort();
    assert_eq!(
        got,
        [
            "channel_occupied presence-room",
            "member_added presence-room"
        ]
    );

    // Her second socket, on the other node: she is already a member of the cluster's channel.
    let (mut alice_b, socket) = connected(&b).await;
    join_presence(&mut alice_b, &socket, room, "alice").await;
    assert!(
        webhooks(&mut hooks, wait).await.is_empty(),
        "alice already a member"
    );

    // Bob joins on B and leaves: added, then removed.
    let (mut bob_b, socket) = connected(&b).await;
    join_presence(&mut bob_b, &socket, room, "bob").await;
    assert_eq!(
        webhooks(&mut hooks, wait).await,
        ["member_added presence-room"]
    );
    send(&mut bob_b, "pusher:unsubscribe", json!({"channel": room})).await;
    assert_eq!(
        webhooks(&mut hooks, wait).await,
        ["member_removed presence-room"]
    );

    // Alice leaves A: her socket on B keeps her a member. Leaving B removes her for good.
    send(&mut alice_a, "pusher:unsubscribe", json!({"channel": room})).await;
    assert!(
        webhooks(&mut hooks, wait).await.is_empty(),
        "alice still on B"
    );
    send(&mut alice_b, "pusher:unsubscribe", json!({"channel": room})).await;
    let mut got = webhooks(&mut hooks, wait).await;
    got.sort();
    assert_eq!(
        got,
        [
            "channel_vacated presence-room",
            "member_removed presence-room"
        ]
    );
}

/// A signed `GET` on `node`, asked again until it answers `want`: another node's subscriptions
/// reach this node's answer within about a second (docs/pusher.md).
async fn eventually(node: &Node, path: &str, params: &[(&str, &str)], want: Value) {
    herald_testkit::eventually(
        Duration::from_secs(5),
        &format!("{path} {params:?} to answer {want}"),
        || async {
            let (status, got) = signed_with(node, "GET", path, params, None).await;
            assert_eq!(status, 200, "{path}: {got}");
            got == want
        },
    )
    .await
}

#[tokio::test]
async fn channel_queries_on_one_node_are_exact_at_once() {
    let node = Node::start(&["--dev"], &APP).await;
    let counts = [("info", "subscription_count")];
    let (mut c, _) = connected(&node).await;
    let (mut d, _) = connected(&node).await;
    for client in [&mut c, &mut d] {
        send(client, "pusher:subscribe", json!({"channel": "news"})).await;
        expect(client, "pusher_internal:subscription_succeeded").await;
    }
    let (status, got) = signed_with(&node, "GET", "/apps/7/channels", &counts, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        got,
        json!({"channels": {"news": {"subscription_count": 2}}})
    );
    send(&mut c, "pusher:unsubscribe", json!({"channel": "news"})).await;
    send(&mut d, "pusher:unsubscribe", json!({"channel": "news"})).await;
    // Unsubscribing has no reply: a ping answered after it means it was handled.
    send(&mut d, "pusher:ping", json!({})).await;
    expect(&mut d, "pusher:pong").await;
    send(&mut c, "pusher:ping", json!({})).await;
    expect(&mut c, "pusher:pong").await;
    let (_, got) = signed_with(&node, "GET", "/apps/7/channels/news", &counts, None).await;
    assert_eq!(got, json!({"occupied": false, "subscription_count": 0}));
    let (_, got) = signed(&node, "GET", "/apps/7/channels", None).await;
    assert_eq!(got, json!({"channels": {}}));
}

#[tokio::test]
async fn channel_queries_answer_for_the_cluster_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    channel_queries_answer_for_the_cluster(&redis.url()).await;
}

#[tokio::test]
async fn channel_queries_answer_for_the_cluster_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    channel_queries_answer_for_the_cluster(&nats.url()).await;
}

async fn channel_queries_answer_for_the_cluster(url: &str) {
    let mut env = APP.to_vec();
    env.push(("HERALD_BROKER_URL", url));
    env.push(("HERALD_DRAIN_MS", "200"));
    let a = Node::start(&["--dev"], &env).await;
    let b = Node::start(&["--dev"], &env).await;
    let counts = [("info", "subscription_count")];
    let room = "presence-room";

    // The answering node's own subscriptions count at once.
    let (mut news_a, socket) = connected(&a).await;
    send(&mut news_a, "pusher:subscribe", json!({"channel": "news"})).await;
    expect(&mut news_a, "pusher_internal:subscription_succeeded").await;
    join_presence(&mut news_a, &socket, room, "alice").await;
    let (status, got) = signed_with(&a, "GET", "/apps/7/channels/news", &counts, None).await;
    assert_eq!(status, 200);
    assert_eq!(got, json!({"occupied": true, "subscription_count": 1}));

    // Node B: news and sports on one socket, alice again and bob in the presence channel.
    let (mut news_b, _) = connected(&b).await;
    for channel in ["news", "sports"] {
        send(&mut news_b, "pusher:subscribe", json!({"channel": channel})).await;
        expect(&mut news_b, "pusher_internal:subscription_succeeded").await;
    }
    let (mut alice_b, socket) = connected(&b).await;
    join_presence(&mut alice_b, &socket, room, "alice").await;
    let (mut bob_b, socket) = connected(&b).await;
    join_presence(&mut bob_b, &socket, room, "bob").await;

    // Either node lists the same channels with the cluster's sums.
    let everything = json!({"channels": {
        "news": {"subscription_count": 2},
        "presence-room": {"subscription_count": 3},
        "sports": {"subscription_count": 1},
    }});
    for node in [&a, &b] {
        eventually(node, "/apps/7/channels", &counts, everything.clone()).await;
        eventually(
            node,
            "/apps/7/channels",
            &[("filter_by_prefix", "presence-"), ("info", "user_count")],
            json!({"channels": {"presence-room": {"user_count": 2}}}),
        )
        .await;
        eventually(
            node,
            "/apps/7/channels",
            &[("filter_by_prefix", "s")],
            json!({"channels": {"sports": {}}}),
        )
        .await;
        eventually(
            node,
            "/apps/7/channels/presence-room",
            &[("info", "user_count,subscription_count")],
            json!({"occupied": true, "user_count": 2, "subscription_count": 3}),
        )
        .await;
    }
    // Sports has its only subscriber on B; A answers for it.
    eventually(
        &a,
        "/apps/7/channels/sports",
        &[],
        json!({"occupied": true}),
    )
    .await;

    // Leaving is seen across nodes too: unsubscribe, and a connection that goes away.
    send(
        &mut news_b,
        "pusher:unsubscribe",
        json!({"channel": "sports"}),
    )
    .await;
    eventually(
        &a,
        "/apps/7/channels/sports",
        &counts,
        json!({"occupied": false, "subscription_count": 0}),
    )
    .await;
    drop(news_b);
    eventually(
        &a,
        "/apps/7/channels",
        &counts,
        json!({"channels": {
            "news": {"subscription_count": 1},
            "presence-room": {"subscription_count": 3},
        }}),
    )
    .await;

    // A node that shuts down takes its subscriptions with it (long before its entries expire),
    // also those it shared a moment before (its writer is then waiting out its gap).
    send(&mut bob_b, "pusher:subscribe", json!({"channel": "late"})).await;
    expect(&mut bob_b, "pusher_internal:subscription_succeeded").await;
    eventually(&a, "/apps/7/channels/late", &[], json!({"occupied": true})).await;
    b.sigterm();
    eventually(
        &a,
        "/apps/7/channels",
        &counts,
        json!({"channels": {
            "news": {"subscription_count": 1},
            "presence-room": {"subscription_count": 1},
        }}),
    )
    .await;
}

/// Subscribe `c` (socket `socket`) to the private or presence `channel`, signed as the server SDKs
/// sign it (`channel_data` for presence).
async fn subscribe_signed(c: &mut Client, socket: &str, channel: &str, channel_data: Option<&str>) {
    let signed = match channel_data {
        Some(d) => format!("{socket}:{channel}:{d}"),
        None => format!("{socket}:{channel}"),
    };
    let sig = herald_server::pusher::auth::sign("app-secret", &signed);
    let mut data = json!({"channel": channel, "auth": format!("app-key:{sig}")});
    if let Some(d) = channel_data {
        data["channel_data"] = json!(d);
    }
    send(c, "pusher:subscribe", data).await;
}

/// Issue 29, item 7: Laravel broadcasts `App\Events\OrderShipped` (a JSON escape on the wire);
/// such names, and presence user ids with escapes, must arrive decoded, and the sender's
/// exclusion (`toOthers()`) must hold.
#[tokio::test]
async fn escaped_event_names_and_user_ids_arrive_decoded_and_excluded() {
    let mut env = APP.to_vec();
    env.push(("HERALD_PUSHER_APP_ENABLE_CLIENT_EVENTS", "true"));
    let node = Node::start(&["--dev"], &env).await;
    let (mut a, a_id) = connected(&node).await;
    let (mut b, b_id) = connected(&node).await;
    for c in [&mut a, &mut b] {
        send(c, "pusher:subscribe", json!({"channel": "orders"})).await;
        expect(c, "pusher_internal:subscription_succeeded").await;
    }
    let name = "App\\Events\\OrderShipped";
    let (status, body) = signed(
        &node,
        "POST",
        "/apps/7/events",
        Some(json!({"name": name, "channel": "orders", "data": "{\"id\":1}", "socket_id": a_id})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let m = expect(&mut b, name).await;
    assert_eq!(
        (m["channel"].as_str(), m["data"].as_str()),
        (Some("orders"), Some("{\"id\":1}"))
    );
    assert!(
        a.next_within(Duration::from_millis(300)).await.is_none(),
        "the excluded socket (toOthers) gets nothing"
    );

    // Presence: a user id with a quote and a backslash, and a client event with an escaped name.
    let user = "a\"b\\c";
    let a_data = json!({"user_id": user}).to_string();
    subscribe_signed(&mut a, &a_id, "presence-room", Some(&a_data)).await;
    expect(&mut a, "pusher_internal:subscription_succeeded").await;
    let b_data = json!({"user_id": "bob"}).to_string();
    subscribe_signed(&mut b, &b_id, "presence-room", Some(&b_data)).await;
    let ok = expect(&mut b, "pusher_internal:subscription_succeeded").await;
    let members: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
    assert!(members["presence"]["hash"].get(user).is_some(), "{members}");
    let added = expect(&mut a, "pusher_internal:member_added").await;
    assert_eq!(
        added["data"],
        json!({"user_id": "bob", "user_info": null}).to_string()
    );
    let event = "client-App\\Typing\"";
    a.send_raw(&json!({"event": event, "channel": "presence-room", "data": {"x": 1}}).to_string())
        .await;
    let m = expect(&mut b, event).await;
    assert_eq!(
        (m["user_id"].as_str(), &m["data"]),
        (Some(user), &json!({"x": 1}))
    );
    assert!(
        a.next_within(Duration::from_millis(300)).await.is_none(),
        "not echoed to the sender"
    );
}

/// Issue 29, item 8: a retried webhook must not be overtaken by a later one of the same app
/// (a retried `channel_occupied` after the later `channel_vacated`).
#[tokio::test]
async fn a_retried_webhook_is_not_overtaken_by_a_later_one() {
    let (hook_url, mut hooks) = refusing_webhook_receiver(1).await;
    let mut env = APP.to_vec();
    env.push(("HERALD_PUSHER_APP_WEBHOOK_URL", &hook_url));
    let node = Node::start(&["--dev"], &env).await;
    let (mut c, _) = connected(&node).await;
    send(&mut c, "pusher:subscribe", json!({"channel": "room"})).await;
    expect(&mut c, "pusher_internal:subscription_succeeded").await;
    let wait = Duration::from_secs(5);
    let first = tokio::time::timeout(wait, hooks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first["status"], 500, "{first}");
    // The vacancy comes in a later batch, while the first one waits for its retry.
    send(&mut c, "pusher:unsubscribe", json!({"channel": "room"})).await;
    let mut accepted = Vec::new();
    while accepted.len() < 2 {
        let hook = tokio::time::timeout(wait, hooks.recv())
            .await
            .expect("two accepted webhooks within 5 s")
            .unwrap();
        assert_eq!(hook["status"], 200, "{hook}");
        for e in hook["body"]["events"].as_array().unwrap() {
            accepted.push(e["name"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(accepted, ["channel_occupied", "channel_vacated"]);
}

/// Issue 29, item 8: a frame over the codec's limit (16 × `limits.max_frame_bytes`, 1 MiB by
/// default) gets `pusher:error` and a close frame (1009), not a dropped TCP connection; a frame
/// over `max_frame_bytes` but under that limit gets `pusher:error` and the connection goes on.
#[tokio::test]
async fn an_oversized_frame_gets_pusher_error_and_a_close_code() {
    let node = Node::start(&["--dev"], &APP).await;
    let (mut c, _) = connected(&node).await;
    send(
        &mut c,
        "pusher:ping",
        json!({"pad": "a".repeat(100 * 1024)}),
    )
    .await;
    let e = expect(&mut c, "pusher:error").await;
    assert!(
        e["data"]["message"].as_str().unwrap().contains("too large"),
        "{e}"
    );
    send(&mut c, "pusher:ping", json!({})).await;
    expect(&mut c, "pusher:pong").await;

    send(&mut c, "pusher:ping", json!({"pad": "a".repeat(2 << 20)})).await;
    let e = expect(&mut c, "pusher:error").await;
    assert_eq!(e["data"]["code"], 1009, "{e}");
    assert_eq!(c.closed().await.code, Some(1009));
}

/// Issue 29, item 8: Pusher's limits: event names at most 200 characters, presence `user_info`
/// at most 1 KB; client events on `private-encrypted-` channels are refused (the server cannot
/// encrypt them). Each refusal is an error and the connection goes on.
#[tokio::test]
async fn pusher_limits_and_encrypted_client_events_are_refused() {
    let mut env = APP.to_vec();
    env.push(("HERALD_PUSHER_APP_ENABLE_CLIENT_EVENTS", "true"));
    let node = Node::start(&["--dev"], &env).await;
    let (mut a, a_id) = connected(&node).await;
    let (mut b, b_id) = connected(&node).await;
    for (c, id) in [(&mut a, &a_id), (&mut b, &b_id)] {
        for channel in ["private-chat", "private-encrypted-chat"] {
            subscribe_signed(c, id, channel, None).await;
            expect(c, "pusher_internal:subscription_succeeded").await;
        }
    }
    let long = format!("client-{}", "x".repeat(200));
    a.send_raw(&json!({"event": long, "channel": "private-chat", "data": {}}).to_string())
        .await;
    let e = expect(&mut a, "pusher:error").await;
    assert!(
        e["data"]["message"].as_str().unwrap().contains("200"),
        "{e}"
    );
    a.send_raw(
        &json!({"event": "client-x", "channel": "private-encrypted-chat", "data": {}}).to_string(),
    )
    .await;
    let e = expect(&mut a, "pusher:error").await;
    assert!(
        e["data"]["message"].as_str().unwrap().contains("encrypted"),
        "{e}"
    );
    assert!(
        b.next_within(Duration::from_millis(300)).await.is_none(),
        "neither reached the other client"
    );
    // The HTTP API's limit is the same.
    let (status, _) = signed(
        &node,
        "POST",
        "/apps/7/events",
        Some(json!({"name": "x".repeat(201), "channel": "private-chat", "data": "{}"})),
    )
    .await;
    assert_eq!(status, 400);

    let info = json!({"user_id": "u", "user_info": {"bio": "b".repeat(1100)}}).to_string();
    subscribe_signed(&mut a, &a_id, "presence-room", Some(&info)).await;
    let e = expect(&mut a, "pusher:subscription_error").await;
    assert_eq!(e["data"]["type"], "LimitReached", "{e}");
    // Still usable.
    let ok = format!("client-{}", "x".repeat(193));
    a.send_raw(&json!({"event": ok, "channel": "private-chat", "data": {}}).to_string())
        .await;
    expect(&mut b, &ok).await;
}

/// Issue 29, item 8: a draining node that still gets a Pusher upgrade (over a kept-alive
/// connection, or a proxy's pooled one) must make the client back off (4100), not reconnect at
/// once (4200), which would bring pusher-js straight back to it in a loop.
#[tokio::test]
async fn a_draining_node_makes_new_pusher_clients_back_off() {
    let node = Node::start(&["--dev"], &APP).await;
    // Held open and not read: the node waits for its closing handshake, so it is still there.
    let (_held, _) = connected(&node).await;
    let tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
    // The kept-alive connection's own answers show when the drain began: the node takes no new
    // connections then, so a fresh /health request cannot.
    let tcp = tokio::sync::Mutex::new(tcp);
    let first = health_on(&mut *tcp.lock().await).await;
    assert!(first.contains("\"ok\""), "{first}");
    node.sigterm();
    herald_testkit::eventually(
        Duration::from_secs(10),
        "/health (on the kept-alive connection) to say the node is draining after SIGTERM",
        || async {
            health_on(&mut *tcp.lock().await)
                .await
                .contains("\"draining\"")
        },
    )
    .await;
    let tcp = tcp.into_inner();
    let url = format!("ws://{}/app/app-key?protocol=7", node.addr);
    let mut c = Client::open_on(Box::new(tcp), &url, &[])
        .await
        .expect("ws handshake");
    let e = expect(&mut c, "pusher:error").await;
    assert_eq!(e["data"]["code"], 4100, "{e}");
    assert_eq!(c.closed().await.code, Some(4100));
}

/// `GET /health` on a kept-alive connection: the whole response (head and body), as text.
async fn health_on(tcp: &mut TcpStream) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tcp.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no content-length: {head}"));
            if body.len() >= length {
                return text;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no whole /health answer within 5 s: {text}"))
            .unwrap();
        assert!(n > 0, "closed early: {text}");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// The pusher-js catch-up scenario (clients/js test/integration/pusher.test.ts, "a client that
/// reconnects gets what it missed"), many times over: a client with positions beside a stock one
/// on the same channel (whose deliveries the fan-out writes directly), away while two events are
/// triggered, back with `herald_since`. Each time it gets what it missed and the next event, each
/// once, in order, with `herald_offset`; the stock client gets every event, plain.
#[tokio::test]
async fn catch_up_beside_direct_writes_gets_every_event_once_in_order() {
    let node = Node::start(&["--dev"], &APP).await;
    let trigger = |channel: &str, n: u64| json!({"name": "item", "channel": channel, "data": format!("{{\"n\":{n}}}")});
    let publish = |channel: String, n: u64| {
        let node = &node;
        async move {
            let (status, body) =
                signed(node, "POST", "/apps/7/events", Some(trigger(&channel, n))).await;
            assert_eq!(status, 200, "{body}");
        }
    };
    // Every message up to (and including) the one with `herald_offset` == `last`, then checks
    // that nothing more comes.
    async fn items(c: &mut Client, last: u64) -> Vec<(u64, Value)> {
        let mut got = Vec::new();
        while got.last().map(|(o, _)| *o) != Some(last) {
            let m = c
                .next_within(Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("no item up to offset {last}; got {got:?}"));
            assert_eq!(m["event"], "item", "{m}");
            let offset = m["herald_offset"]
                .as_u64()
                .unwrap_or_else(|| panic!("no herald_offset: {m}"));
            got.push((offset, m["data"].clone()));
            assert!(got.len() <= 4, "more than expected: {got:?}");
        }
        got
    }
    for round in 0..20 {
        let channel = format!("feed-{round}");
        let (mut stock, _) = connected(&node).await;
        send(&mut stock, "pusher:subscribe", json!({"channel": channel})).await;
        expect(&mut stock, "pusher_internal:subscription_succeeded").await;

        let (mut c, _) = connected(&node).await;
        send(
            &mut c,
            "pusher:subscribe",
            json!({"channel": channel, "herald_positions": true}),
        )
        .await;
        let ok = expect(&mut c, "pusher_internal:subscription_succeeded").await;
        let data: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
        let epoch = data["herald"]["epoch"].as_str().unwrap().to_owned();
        publish(channel.clone(), 1).await;
        let got = items(&mut c, 1).await;
        assert_eq!(got, vec![(1, json!("{\"n\":1}"))], "round {round}");
        drop(c);

        publish(channel.clone(), 2).await;
        publish(channel.clone(), 3).await;
        let (mut c, _) = connected(&node).await;
        let since = json!({"epoch": epoch, "offset": 1});
        send(
            &mut c,
            "pusher:subscribe",
            json!({"channel": channel, "herald_since": since}),
        )
        .await;
        let ok = expect(&mut c, "pusher_internal:subscription_succeeded").await;
        let data: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
        assert_eq!(data["herald"]["recovered"], true, "round {round}: {data}");
        publish(channel.clone(), 4).await;
        let got = items(&mut c, 4).await;
        let want: Vec<(u64, Value)> = (2..=4)
            .map(|n| (n, json!(format!("{{\"n\":{n}}}"))))
            .collect();
        assert_eq!(got, want, "round {round}");
        assert!(
            c.next_within(Duration::from_millis(50)).await.is_none(),
            "round {round}: a duplicate"
        );
        for n in 1..=4 {
            let m = expect(&mut stock, "item").await;
            assert_eq!(m["data"], format!("{{\"n\":{n}}}"), "round {round}");
            assert!(m.get("herald_offset").is_none(), "{m}");
        }
    }
}
