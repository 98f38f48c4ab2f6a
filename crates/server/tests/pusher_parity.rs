//! Pusher / Soketi parity features against the real binary, with raw WebSocket frames and
//! signed HTTP API calls: cache channels (last event or `pusher:cache_miss`, in memory and
//! across two nodes on Redis and on NATS), `pusher_internal:subscription_count` (opt-in per app),
//! `info` attributes answered by `POST /events` and `/batch_events`, and the per-app limits.
//! (pusher-js and the `pusher` Node SDK drive the same features in
//! clients/js/test/integration/pusher-parity.test.ts.)

mod common;

use std::time::Duration;

use common::{config_file, Client, Node};
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// An app of the tests: id, key, secret.
#[derive(Clone, Copy)]
struct App {
    id: &'static str,
    key: &'static str,
    secret: &'static str,
}

const MAIN: App = App {
    id: "7",
    key: "app-key",
    secret: "app-secret",
};

const OTHER: App = App {
    id: "8",
    key: "other-key",
    secret: "other-secret",
};

/// `[[pusher.apps]]` for `app`, with `extra` TOML lines.
fn app_toml(app: App, extra: &str) -> String {
    format!(
        "[[pusher.apps]]\nid = \"{}\"\nkey = \"{}\"\nsecret = \"{}\"\n{extra}\n",
        app.id, app.key, app.secret
    )
}

/// A connected Pusher client of `app`: returns it and its socket id.
async fn connected(node: &Node, app: App) -> (Client, String) {
    let tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
    let url = format!(
        "ws://{}/app/{}?protocol=7&client=raw&version=1",
        node.addr, app.key
    );
    let mut c = Client::open_on(Box::new(tcp), &url, &[])
        .await
        .expect("ws handshake");
    let m = c.next().await;
    assert_eq!(m["event"], "pusher:connection_established", "{m}");
    let data: Value = serde_json::from_str(m["data"].as_str().expect("data is a string")).unwrap();
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

/// Nothing more arrives within 300 ms.
async fn quiet(c: &mut Client, what: &str) {
    if let Some(m) = c.next_within(Duration::from_millis(300)).await {
        panic!("{what}: nothing more expected, got {m}");
    }
}

/// Subscribe to a public channel and wait for `subscription_succeeded`.
async fn subscribe(c: &mut Client, channel: &str) {
    send(c, "pusher:subscribe", json!({"channel": channel})).await;
    let ok = expect(c, "pusher_internal:subscription_succeeded").await;
    assert_eq!(ok["channel"], channel);
}

/// Subscribe with a signature of `app` (private, or presence with `channel_data`): the reply.
async fn subscribe_signed(
    c: &mut Client,
    app: App,
    socket: &str,
    channel: &str,
    channel_data: Option<&str>,
) -> Value {
    use herald_server::pusher::auth::sign;
    let signed = match channel_data {
        Some(d) => format!("{socket}:{channel}:{d}"),
        None => format!("{socket}:{channel}"),
    };
    let auth = format!("{}:{}", app.key, sign(app.secret, &signed));
    let mut data = json!({"channel": channel, "auth": auth});
    if let Some(d) = channel_data {
        data["channel_data"] = json!(d);
    }
    send(c, "pusher:subscribe", data).await;
    c.next().await
}

/// A signed Pusher HTTP API call of `app` (as the server SDKs sign them): status and body.
async fn signed(
    node: &Node,
    app: App,
    method: &str,
    route: &str,
    extra: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    use herald_server::pusher::auth::{md5_hex, sign};
    let path = format!("/apps/{}/{route}", app.id);
    let body = body.map(|b| b.to_string());
    let mut params = vec![
        ("auth_key".to_owned(), app.key.to_owned()),
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
    let signature = sign(app.secret, &format!("{method}\n{path}\n{query}"));
    let url = format!("{path}?{query}&auth_signature={signature}");
    node.http(method, &url, body, None).await
}

/// Trigger `name` with `data` on `channel` of `app`; must answer 200.
async fn trigger(node: &Node, app: App, channel: &str, name: &str, data: &str) {
    let body = json!({"name": name, "data": data, "channel": channel});
    let (status, answer) = signed(node, app, "POST", "events", &[], Some(body)).await;
    assert_eq!(status, 200, "trigger {name} on {channel}: {answer}");
}

/// A webhook receiver: answers 200 and hands over each request as `{"headers": {lowercased
/// name: value}, "body": JSON body}`.
async fn webhook_receiver() -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
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
                    let headers: serde_json::Map<String, Value> = head
                        .lines()
                        .skip(1)
                        .filter_map(|l| l.split_once(':'))
                        .map(|(k, v)| (k.trim().to_ascii_lowercase(), json!(v.trim())))
                        .collect();
                    let body = serde_json::from_str::<Value>(body).unwrap();
                    let _ = tx.send(json!({"headers": headers, "body": body}));
                    let answer =
                        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = stream.write_all(answer.as_bytes()).await;
                    return;
                }
            });
        }
    });
    (url, rx)
}

/// The first webhook event named `name` within 10 s.
async fn webhook_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Value>, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Ok(Some(request)) = tokio::time::timeout(left, rx.recv()).await else {
            panic!("no {name} webhook within 10 s");
        };
        if let Some(e) = request["body"]["events"]
            .as_array()
            .and_then(|events| events.iter().find(|e| e["name"] == name))
        {
            return e.clone();
        }
    }
}

// ---- cache channels ----

#[tokio::test]
async fn cache_channels_send_the_last_event_or_a_cache_miss() {
    let (hook_url, mut hooks) = webhook_receiver().await;
    let config = config_file(
        "herald.toml",
        &app_toml(
            MAIN,
            &format!("webhooks = [{{ url = \"{hook_url}\", event_types = [\"cache_miss\"] }}]"),
        ),
    );
    let node = Node::start(&["--dev", "--config", &config], &[]).await;

    // Nothing cached yet: subscription_succeeded, then pusher:cache_miss, and the webhook.
    let (mut first, _) = connected(&node, MAIN).await;
    subscribe(&mut first, "cache-score").await;
    let miss = expect(&mut first, "pusher:cache_miss").await;
    assert_eq!(miss["channel"], "cache-score");
    let hook = webhook_event(&mut hooks, "cache_miss").await;
    assert_eq!(hook["channel"], "cache-score");

    // Two events: the subscriber gets both live; a new subscriber gets only the last, once.
    trigger(&node, MAIN, "cache-score", "score", "1-0").await;
    trigger(&node, MAIN, "cache-score", "score", "2-0").await;
    for want in ["1-0", "2-0"] {
        assert_eq!(expect(&mut first, "score").await["data"], want);
    }
    let (mut late, _) = connected(&node, MAIN).await;
    subscribe(&mut late, "cache-score").await;
    let cached = expect(&mut late, "score").await;
    assert_eq!(
        (cached["channel"].as_str(), cached["data"].as_str()),
        (Some("cache-score"), Some("2-0"))
    );
    quiet(&mut late, "one cached event").await;
    // And it is live from there.
    trigger(&node, MAIN, "cache-score", "score", "3-0").await;
    assert_eq!(expect(&mut late, "score").await["data"], "3-0");

    // Other channels are not cache channels: neither an event nor a miss.
    trigger(&node, MAIN, "news", "headline", "old").await;
    subscribe(&mut late, "news").await;
    quiet(&mut late, "a plain channel").await;

    // private-cache- (signed) and presence-cache- (members first, then the miss).
    trigger(&node, MAIN, "private-cache-door", "state", "open").await;
    let (mut p, socket) = connected(&node, MAIN).await;
    let ok = subscribe_signed(&mut p, MAIN, &socket, "private-cache-door", None).await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    assert_eq!(expect(&mut p, "state").await["data"], "open");
    let alice = r#"{"user_id":"alice"}"#;
    let ok = subscribe_signed(&mut p, MAIN, &socket, "presence-cache-lobby", Some(alice)).await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    assert!(ok["data"].as_str().unwrap().contains("alice"), "{ok}");
    assert_eq!(
        expect(&mut p, "pusher:cache_miss").await["channel"],
        "presence-cache-lobby"
    );
}

#[tokio::test]
async fn cache_channels_answer_across_two_nodes_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    cache_channels_answer_across_two_nodes(&redis.url()).await;
}

#[tokio::test]
async fn cache_channels_answer_across_two_nodes_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    cache_channels_answer_across_two_nodes(&nats.url()).await;
}

async fn cache_channels_answer_across_two_nodes(url: &str) {
    let config = config_file("herald.toml", &app_toml(MAIN, ""));
    let env = [("HERALD_BROKER_URL", url)];
    let a = Node::start(&["--dev", "--config", &config], &env).await;
    let b = Node::start(&["--dev", "--config", &config], &env).await;

    // Triggered through node A while nobody anywhere is subscribed; a subscriber on B gets it.
    trigger(&a, MAIN, "cache-price", "tick", "100").await;
    trigger(&a, MAIN, "cache-price", "tick", "101").await;
    let (mut on_b, _) = connected(&b, MAIN).await;
    subscribe(&mut on_b, "cache-price").await;
    assert_eq!(expect(&mut on_b, "tick").await["data"], "101");
    quiet(&mut on_b, "one cached event").await;

    // A channel that was never triggered is a miss on either node.
    let (mut on_a, _) = connected(&a, MAIN).await;
    subscribe(&mut on_a, "cache-empty").await;
    expect(&mut on_a, "pusher:cache_miss").await;
}

// ---- subscription_count ----

/// The count in a `pusher_internal:subscription_count` message.
fn count_of(m: &Value) -> u64 {
    let data: Value = serde_json::from_str(m["data"].as_str().expect("data is a string")).unwrap();
    data["subscription_count"].as_u64().expect("a count")
}

/// The next subscription_count on `channel` (other messages are not expected meanwhile).
async fn next_count(c: &mut Client, channel: &str) -> u64 {
    let m = expect(c, "pusher_internal:subscription_count").await;
    assert_eq!(m["channel"], channel);
    count_of(&m)
}

#[tokio::test]
async fn subscription_count_events_follow_the_count_when_the_app_enables_them() {
    let config = config_file(
        "herald.toml",
        &format!(
            "{}{}",
            app_toml(MAIN, "enable_subscription_count = true"),
            app_toml(OTHER, "")
        ),
    );
    let node = Node::start(&["--dev", "--config", &config], &[]).await;

    let (mut one, _) = connected(&node, MAIN).await;
    subscribe(&mut one, "room").await;
    assert_eq!(next_count(&mut one, "room").await, 1);

    let (mut two, socket_two) = connected(&node, MAIN).await;
    subscribe(&mut two, "room").await;
    assert_eq!(next_count(&mut two, "room").await, 2, "a new subscriber");
    assert_eq!(next_count(&mut one, "room").await, 2, "the others");

    // Private channels count too; the channel API agrees.
    let ok = subscribe_signed(&mut two, MAIN, &socket_two, "private-desk", None).await;
    assert_eq!(ok["event"], "pusher_internal:subscription_succeeded");
    assert_eq!(next_count(&mut two, "private-desk").await, 1);
    let (status, body) = signed(
        &node,
        MAIN,
        "GET",
        "channels/room",
        &[("info", "subscription_count")],
        None,
    )
    .await;
    assert_eq!(
        (status, &body["subscription_count"]),
        (200, &json!(2)),
        "{body}"
    );

    send(&mut two, "pusher:unsubscribe", json!({"channel": "room"})).await;
    assert_eq!(
        next_count(&mut one, "room").await,
        1,
        "after an unsubscribe"
    );
    drop(two);
    quiet(&mut one, "room's count did not change again").await;

    // Presence channels have member events instead.
    let (mut p, socket) = connected(&node, MAIN).await;
    let ok = subscribe_signed(
        &mut p,
        MAIN,
        &socket,
        "presence-x",
        Some(r#"{"user_id":"u"}"#),
    )
    .await;
    assert_eq!(ok["event"], "pusher_internal:subscription_succeeded");
    quiet(&mut p, "no count on presence channels").await;

    // An app without the setting: no count events.
    let (mut other, _) = connected(&node, OTHER).await;
    subscribe(&mut other, "room").await;
    quiet(&mut other, "an app without subscription counting").await;
}

#[tokio::test]
async fn subscription_counts_are_for_the_cluster_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    let config = config_file(
        "herald.toml",
        &app_toml(MAIN, "enable_subscription_count = true"),
    );
    let env = [("HERALD_BROKER_URL", redis.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Node::start(&["--dev", "--config", &config], &env).await;
    let b = Node::start(&["--dev", "--config", &config], &env).await;

    let (mut on_a, _) = connected(&a, MAIN).await;
    subscribe(&mut on_a, "room").await;
    assert_eq!(next_count(&mut on_a, "room").await, 1);
    // A subscriber on node B: both nodes' subscribers see 2 (A's within its next look, ~1 s
    // plus the census's gap).
    let (mut on_b, _) = connected(&b, MAIN).await;
    subscribe(&mut on_b, "room").await;
    let mut seen_b = next_count(&mut on_b, "room").await;
    if seen_b == 1 {
        // B's census had not heard of A's subscriber yet: the correction follows.
        seen_b = next_count(&mut on_b, "room").await;
    }
    assert_eq!(seen_b, 2, "node B counts node A's subscriber");
    assert_eq!(
        next_count(&mut on_a, "room").await,
        2,
        "node A counts node B's"
    );
    drop(on_b);
    assert_eq!(
        next_count(&mut on_a, "room").await,
        1,
        "B's subscriber left"
    );
}

#[tokio::test]
async fn subscription_count_webhooks_carry_the_count() {
    let (hook_url, mut hooks) = webhook_receiver().await;
    let extra = format!(
        "enable_subscription_count = true\n\
         webhooks = [{{ url = \"{hook_url}\", event_types = [\"subscription_count\"] }}]"
    );
    let config = config_file("herald.toml", &app_toml(MAIN, &extra));
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let (mut one, _) = connected(&node, MAIN).await;
    subscribe(&mut one, "room").await;
    let first = webhook_event(&mut hooks, "subscription_count").await;
    assert_eq!(
        (&first["channel"], &first["subscription_count"]),
        (&json!("room"), &json!(1))
    );
    let (mut two, _) = connected(&node, MAIN).await;
    subscribe(&mut two, "room").await;
    let second = webhook_event(&mut hooks, "subscription_count").await;
    assert_eq!(second["subscription_count"], 2, "{second}");
    send(&mut two, "pusher:unsubscribe", json!({"channel": "room"})).await;
    let third = webhook_event(&mut hooks, "subscription_count").await;
    assert_eq!(third["subscription_count"], 1, "{third}");
    // Presence channels are not counted.
    let (mut three, socket) = connected(&node, MAIN).await;
    let ok = subscribe_signed(
        &mut three,
        MAIN,
        &socket,
        "presence-x",
        Some(r#"{"user_id":"u"}"#),
    )
    .await;
    assert_eq!(ok["event"], "pusher_internal:subscription_succeeded");
    let (rest, _) = webhook_requests(&mut hooks, Duration::from_millis(500)).await;
    assert!(
        rest.is_empty(),
        "no webhook for the presence channel: {rest:?}"
    );
}

// ---- info on trigger ----

#[tokio::test]
async fn trigger_answers_the_info_attributes_asked_for() {
    let config = config_file("herald.toml", &app_toml(MAIN, ""));
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let (mut c, socket) = connected(&node, MAIN).await;
    let ok = subscribe_signed(
        &mut c,
        MAIN,
        &socket,
        "presence-room",
        Some(r#"{"user_id":"alice"}"#),
    )
    .await;
    assert_eq!(ok["event"], "pusher_internal:subscription_succeeded");
    subscribe(&mut c, "news").await;
    let (mut d, _) = connected(&node, MAIN).await;
    subscribe(&mut d, "news").await;

    let body = json!({
        "name": "e", "data": "x", "channels": ["presence-room", "news", "empty"],
        "info": "user_count,subscription_count",
    });
    let (status, answer) = signed(&node, MAIN, "POST", "events", &[], Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"channels": {
            "presence-room": {"user_count": 1, "subscription_count": 1},
            "news": {"subscription_count": 2},
            "empty": {"subscription_count": 0},
        }})
    );
    // user_count alone: asked of a non-presence channel, it is left out.
    let body = json!({"name": "e", "data": "x", "channel": "news", "info": "user_count"});
    let (_, answer) = signed(&node, MAIN, "POST", "events", &[], Some(body)).await;
    assert_eq!(answer, json!({"channels": {"news": {}}}));
    // Without info: {}.
    let body = json!({"name": "e", "data": "x", "channel": "news"});
    let (_, answer) = signed(&node, MAIN, "POST", "events", &[], Some(body)).await;
    assert_eq!(answer, json!({}));

    // Batches answer per event.
    let body = json!({"batch": [
        {"name": "e", "data": "x", "channel": "news", "info": "subscription_count"},
        {"name": "e", "data": "x", "channel": "presence-room", "info": "user_count"},
        {"name": "e", "data": "x", "channel": "news"},
    ]});
    let (status, answer) = signed(&node, MAIN, "POST", "batch_events", &[], Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"batch": [{"subscription_count": 2}, {"user_count": 1}, {}]})
    );
}

// ---- per-app limits ----

const LIMITED: App = App {
    id: "9",
    key: "limited-key",
    secret: "limited-secret",
};

const RATED: App = App {
    id: "10",
    key: "rated-key",
    secret: "rated-secret",
};

#[tokio::test]
async fn per_app_limits_answer_pusher_errors() {
    let limited = "enable_client_events = true
max_event_name_length = 10
max_event_payload_in_kb = 1
max_event_channels_at_once = 2
max_event_batch_size = 2
max_presence_members_per_channel = 2
max_presence_member_size_in_kb = 2";
    let rated = "max_backend_events_per_second = 3\nmax_read_requests_per_second = 2";
    let config = config_file(
        "herald.toml",
        &format!("{}{}", app_toml(LIMITED, limited), app_toml(RATED, rated)),
    );
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let event = |name: &str, data: &str, channels: &[&str]| json!({"name": name, "data": data, "channels": channels});
    let post = |body: Value| signed(&node, LIMITED, "POST", "events", &[], Some(body));

    let (status, why) = post(event("eleven-char", "x", &["a"])).await;
    assert_eq!(status, 400, "event name over max_event_name_length: {why}");
    assert!(why.as_str().unwrap().contains("1 to 10"), "{why}");
    assert_eq!(post(event("ten-chars!", "x", &["a"])).await.0, 200);

    let (status, why) = post(event("e", &"d".repeat(1025), &["a"])).await;
    assert_eq!(status, 413, "data over max_event_payload_in_kb: {why}");
    assert_eq!(post(event("e", &"d".repeat(1024), &["a"])).await.0, 200);

    let (status, why) = post(event("e", "x", &["a", "b", "c"])).await;
    assert_eq!(status, 400, "over max_event_channels_at_once: {why}");
    assert_eq!(post(event("e", "x", &["a", "b"])).await.0, 200);

    let one = json!({"name": "e", "data": "x", "channel": "a"});
    let batch = |n: usize| json!({"batch": vec![one.clone(); n]});
    let (status, why) = signed(&node, LIMITED, "POST", "batch_events", &[], Some(batch(3))).await;
    assert_eq!(status, 400, "over max_event_batch_size: {why}");
    let (status, _) = signed(&node, LIMITED, "POST", "batch_events", &[], Some(batch(2))).await;
    assert_eq!(status, 200);

    // Client events: the app's name length applies too.
    let (mut c, socket) = connected(&node, LIMITED).await;
    let ok = subscribe_signed(&mut c, LIMITED, &socket, "private-chat", None).await;
    assert_eq!(ok["event"], "pusher_internal:subscription_succeeded");
    c.send_raw(
        &json!({"event": "client-too-long", "channel": "private-chat", "data": {}}).to_string(),
    )
    .await;
    let e = expect(&mut c, "pusher:error").await;
    assert!(
        e["data"]["message"].as_str().unwrap().contains("1 to 10"),
        "{e}"
    );

    // Presence: member info up to the app's 2 KiB (over Pusher's default 1 KiB), two users.
    let info = format!(
        r#"{{"user_id":"alice","user_info":{{"bio":"{}"}}}}"#,
        "a".repeat(1500)
    );
    let ok = subscribe_signed(&mut c, LIMITED, &socket, "presence-room", Some(&info)).await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    let big = format!(
        r#"{{"user_id":"zed","user_info":{{"bio":"{}"}}}}"#,
        "a".repeat(2100)
    );
    let (mut z, z_socket) = connected(&node, LIMITED).await;
    let e = subscribe_signed(&mut z, LIMITED, &z_socket, "presence-room", Some(&big)).await;
    assert_eq!(e["event"], "pusher:subscription_error", "{e}");
    assert_eq!(e["data"]["status"], 400);
    let (mut b, b_socket) = connected(&node, LIMITED).await;
    let ok = subscribe_signed(
        &mut b,
        LIMITED,
        &b_socket,
        "presence-room",
        Some(r#"{"user_id":"bob"}"#),
    )
    .await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    let e = subscribe_signed(
        &mut z,
        LIMITED,
        &z_socket,
        "presence-room",
        Some(r#"{"user_id":"carol"}"#),
    )
    .await;
    assert_eq!(e["event"], "pusher:subscription_error", "a third user: {e}");
    assert_eq!(
        (e["data"]["type"].as_str(), e["data"]["status"].as_u64()),
        (Some("LimitReached"), Some(4004)),
        "{e}"
    );
    // Another connection of a user already there is no new member.
    let (mut b2, b2_socket) = connected(&node, LIMITED).await;
    let ok = subscribe_signed(
        &mut b2,
        LIMITED,
        &b2_socket,
        "presence-room",
        Some(r#"{"user_id":"bob"}"#),
    )
    .await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    // The refused connection is not in the channel: an event does not reach it.
    trigger(&node, LIMITED, "presence-room", "hello", "x").await;
    quiet(&mut z, "refused from the full channel").await;

    // Rates: 3 events a second (a batch counts its events), 2 reads a second.
    let nd = &node;
    let rated_post = |n: usize| {
        let body = match n {
            1 => json!({"name": "e", "data": "x", "channel": "a"}),
            n => json!({"batch": vec![one.clone(); n]}),
        };
        let route = if n == 1 { "events" } else { "batch_events" };
        async move { signed(nd, RATED, "POST", route, &[], Some(body)).await }
    };
    assert_eq!(rated_post(2).await.0, 200);
    assert_eq!(rated_post(1).await.0, 200);
    let (status, why) = rated_post(1).await;
    assert_eq!(status, 429, "over max_backend_events_per_second: {why}");
    let read = || signed(&node, RATED, "GET", "channels", &[], None);
    let statuses = [read().await.0, read().await.0, read().await.0];
    assert_eq!(statuses[..2], [200, 200]);
    assert_eq!(statuses[2], 429, "over max_read_requests_per_second");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(rated_post(1).await.0, 200, "a second later");
    assert_eq!(read().await.0, 200, "a second later");
}

// ---- webhook filters and headers, CORS ----

/// `name channel` of every webhook event received within `wait`, and the requests' headers.
async fn webhook_requests(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Value>,
    wait: Duration,
) -> (Vec<String>, Vec<Value>) {
    let mut events = Vec::new();
    let mut headers = Vec::new();
    while let Ok(Some(request)) = tokio::time::timeout(wait, rx.recv()).await {
        for e in request["body"]["events"].as_array().unwrap() {
            events.push(format!(
                "{} {}",
                e["name"].as_str().unwrap(),
                e["channel"].as_str().unwrap()
            ));
        }
        headers.push(request["headers"].clone());
    }
    (events, headers)
}

#[tokio::test]
async fn webhooks_filter_by_channel_name_and_send_their_own_headers() {
    let (all_url, mut all) = webhook_receiver().await;
    let (orders_url, mut orders) = webhook_receiver().await;
    let hooks = format!(
        "webhooks = [\n  {{ url = \"{all_url}\", event_types = [\"channel_occupied\"] }},\n  \
         {{ url = \"{orders_url}\", event_types = [\"channel_occupied\"], \
         filter = {{ channel_name_starts_with = \"orders-\" }}, \
         headers = {{ \"X-Api-Token\" = \"t0ken\" }} }},\n]"
    );
    let config = config_file("herald.toml", &app_toml(MAIN, &hooks));
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let (mut c, _) = connected(&node, MAIN).await;
    for channel in ["chat-1", "orders-1", "orders-2-eu"] {
        subscribe(&mut c, channel).await;
    }
    let (mut seen, _) = webhook_requests(&mut all, Duration::from_secs(3)).await;
    seen.sort();
    assert_eq!(
        seen,
        [
            "channel_occupied chat-1",
            "channel_occupied orders-1",
            "channel_occupied orders-2-eu"
        ]
    );
    let (mut filtered, headers) = webhook_requests(&mut orders, Duration::from_millis(500)).await;
    filtered.sort();
    assert_eq!(
        filtered,
        ["channel_occupied orders-1", "channel_occupied orders-2-eu"]
    );
    for h in &headers {
        assert_eq!(h["x-api-token"], "t0ken", "the webhook's own header: {h}");
        assert!(h["x-pusher-signature"].is_string(), "still signed: {h}");
    }
}

/// A raw HTTP/1.1 request (`connection: close`): status and lowercased headers.
async fn raw_http(node: &Node, request: &str) -> (u16, Vec<(String, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut raw))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let head = text.split("\r\n\r\n").next().unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn the_http_api_answers_cors_for_listed_origins() {
    let toml = format!(
        "[pusher]\ncors_allowed_origins = [\"https://app.example\"]\n\n{}",
        app_toml(MAIN, "")
    );
    let config = config_file("herald.toml", &toml);
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let preflight = |origin: &str| {
        format!(
            "OPTIONS /apps/7/events HTTP/1.1\r\nhost: localhost\r\norigin: {origin}\r\n\
             access-control-request-method: POST\r\naccess-control-request-headers: content-type\r\n\
             connection: close\r\n\r\n"
        )
    };
    let (status, headers) = raw_http(&node, &preflight("https://app.example")).await;
    assert_eq!(status, 204, "{headers:?}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(header(&headers, "access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    assert!(header(&headers, "access-control-allow-headers")
        .unwrap()
        .contains("content-type"));
    let (status, headers) = raw_http(&node, &preflight("https://evil.example")).await;
    assert_eq!(status, 403, "an origin not listed");
    assert_eq!(header(&headers, "access-control-allow-origin"), None);

    // A signed call from the listed origin is served and names the origin.
    use herald_server::pusher::auth::sign;
    let query = format!(
        "auth_key=app-key&auth_timestamp={}&auth_version=1.0",
        common::now()
    );
    let signature = sign("app-secret", &format!("GET\n/apps/7/channels\n{query}"));
    let get = format!(
        "GET /apps/7/channels?{query}&auth_signature={signature} HTTP/1.1\r\nhost: localhost\r\n\
         origin: https://app.example\r\nconnection: close\r\n\r\n"
    );
    let (status, headers) = raw_http(&node, &get).await;
    assert_eq!(status, 200, "{headers:?}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some("https://app.example")
    );
    // Without an Origin (a backend), nothing changes.
    let (status, _) = signed(&node, MAIN, "GET", "channels", &[], None).await;
    assert_eq!(status, 200);
}
