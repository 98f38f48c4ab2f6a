//! Every row of the protocol tables, against the real binary.

mod common;

use common::*;
use herald_testkit::redis::{RedisOptions, RedisServer};
use serde_json::json;

#[tokio::test]
async fn connect_reply_has_client_node_ping_and_subs() {
    let node = Node::dev().await;
    let mut c = node.client().await;
    let r = c
        .call(
            "connect",
            json!({"name": "test", "version": "1", "subs": {"a": {}, "b": {}}}),
        )
        .await;
    let res = &r["connect"];
    assert!(res["client"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(res["node"].as_str().is_some());
    assert_eq!(res["ping_interval"], 25);
    assert!(res.get("expires_in").is_none());
    for ch in ["a", "b"] {
        let sub = &res["subs"][ch];
        assert!(sub["epoch"].as_str().is_some(), "{r}");
        assert_eq!(sub["offset"], 0);
        assert_eq!(sub["recoverable"], true);
    }
}

#[tokio::test]
async fn subscribe_publish_unsubscribe_round_trip() {
    let node = Node::dev().await;
    let mut c = node.connected(&[]).await;
    let r = c.call("subscribe", json!({"channel": "news"})).await;
    assert_eq!(r["subscribe"]["offset"], 0);
    assert_eq!(r["subscribe"]["recoverable"], true);
    let epoch = r["subscribe"]["epoch"].clone();

    node.publish("news", json!({"n": 1})).await;
    // The subscriber's own join push comes first (dev namespace has join/leave).
    let join = c.push("join").await;
    assert_eq!(join["channel"], "news");
    let p = c.push("pub").await;
    assert_eq!(p, json!({"channel": "news", "offset": 1, "data": {"n": 1}}));

    let r = c
        .call("publish", json!({"channel": "news", "data": "from client"}))
        .await;
    assert_eq!(r["publish"], json!({"epoch": epoch, "offset": 2}));
    let p = c.push("pub").await;
    assert_eq!(p["data"], "from client");
    assert!(
        p["info"]["client"].as_str().is_some(),
        "client publications carry info: {p}"
    );

    let r = c.call("unsubscribe", json!({"channel": "news"})).await;
    assert_eq!(r["unsubscribe"], json!({}));
    node.publish("news", json!(3)).await;
    assert!(
        c.next_within(std::time::Duration::from_millis(300))
            .await
            .is_none(),
        "no publication after unsubscribe"
    );
}

#[tokio::test]
async fn history_and_presence_commands() {
    let node = Node::dev().await;
    for i in 1..=5 {
        node.publish("h", json!(i)).await;
    }
    let mut c = node.connected(&["h"]).await;
    let r = c.call("history", json!({"channel": "h", "limit": 2})).await;
    let h = &r["history"];
    assert_eq!(h["offset"], 5);
    let offsets: Vec<_> = h["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![4, 5]);
    let since = json!({"epoch": h["epoch"], "offset": 3});
    let r = c
        .call("history", json!({"channel": "h", "since": since}))
        .await;
    assert_eq!(r["history"]["publications"].as_array().unwrap().len(), 2);

    let r = c.call("presence", json!({"channel": "h"})).await;
    let clients = r["presence"]["clients"].as_object().unwrap();
    assert_eq!(clients.len(), 1);
    assert_eq!(clients.values().next().unwrap()["user"], "");
}

#[tokio::test]
async fn join_and_leave_pushes() {
    let node = Node::dev().await;
    let mut a = node.connected(&["room"]).await;
    assert_eq!(a.push("join").await["channel"], "room");
    let mut b = node.connected(&["room"]).await;
    let b_client = b.push("join").await["info"]["client"].clone();
    let join = a.push("join").await;
    assert_eq!(join["info"]["client"], b_client);
    drop(b);
    let leave = a.push("leave").await;
    assert_eq!(
        leave,
        json!({"channel": "room", "info": {"user": "", "client": b_client}})
    );
}

#[tokio::test]
async fn newline_batched_commands_are_all_answered() {
    let node = Node::dev().await;
    let mut c = node.connected(&[]).await;
    c.send_raw("{\"id\":10,\"subscribe\":{\"channel\":\"x\"}}\n{\"id\":11,\"subscribe\":{\"channel\":\"y\"}}\n{}").await;
    assert!(c.reply(10).await.get("subscribe").is_some());
    assert!(c.reply(11).await.get("subscribe").is_some());
}

#[tokio::test]
async fn server_pings_and_closes_silent_clients_with_4002() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_PING_INTERVAL", "1"),
            ("HERALD_PONG_TIMEOUT_S", "1"),
        ],
    )
    .await;
    let mut c = node.connected(&[]).await;
    c.auto_pong = false;
    assert_eq!(c.next().await, json!({}), "ping is an empty object");
    let closed = c.closed().await;
    assert_eq!(closed.code, Some(4002));
    assert_eq!(closed.disconnect.unwrap()["reconnect"], true);

    // A client that answers stays.
    let mut ok = node.connected(&[]).await;
    assert!(ok
        .next_within(std::time::Duration::from_millis(3500))
        .await
        .is_none());
    let r = ok.call("presence", json!({"channel": "z"})).await;
    assert!(r.get("presence").is_some());
}

#[tokio::test]
async fn error_codes_for_bad_commands() {
    let node = Node::dev().await;
    let mut c = node.connected(&["dup"]).await;
    let code = |r: serde_json::Value| {
        r["error"]["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("not an error: {r}"))
    };
    assert_eq!(code(c.call("explode", json!({})).await), 104);
    assert_eq!(
        code(c.call("subscribe", json!({"channel": "dup"})).await),
        105
    );
    assert_eq!(code(c.call("subscribe", json!({"nope": 1})).await), 107);
    assert_eq!(
        code(
            c.call("subscribe", json!({"channel": "bad channel!"}))
                .await
        ),
        107
    );
    assert_eq!(
        code(c.call("subscribe", json!({"channel": "ghost:x"})).await),
        102
    );
    assert_eq!(code(c.call("connect", json!({})).await), 107);
    // Still usable after errors.
    assert!(c
        .call("presence", json!({"channel": "dup"}))
        .await
        .get("presence")
        .is_some());
}

#[tokio::test]
async fn subprotocol_negotiation() {
    let node = Node::dev().await;
    let mut ok = Client::open(node.addr, &[("Sec-WebSocket-Protocol", "herald.v1.json")]).await;
    assert!(ok.call("connect", json!({})).await.get("connect").is_some());
    let tcp = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let refused = Client::open_on(
        Box::new(tcp),
        &node.ws_url(),
        &[("Sec-WebSocket-Protocol", "mqtt")],
    )
    .await;
    assert!(refused.is_err(), "unknown subprotocol must be refused");
}

/// A node where anonymous clients subscribe to and publish on any channel, with history and
/// without presence; keep the config file as long as the node.
async fn open_node() -> (Node, ConfigFile) {
    open_node_on(None, &[]).await
}

/// [`open_node`] on a broker (`broker_url`), or in memory.
async fn open_node_on(broker_url: Option<&str>, env: &[(&str, &str)]) -> (Node, ConfigFile) {
    let broker = broker_url
        .map(|url| format!("broker_url = \"{url}\"\n"))
        .unwrap_or_default();
    let cfg = config_file(
        "herald.toml",
        &format!(
            r#"
        {broker}
        allow_anonymous = true
        [default_namespace]
        subscribe = "anonymous"
        publish = true
        history = true
        history_size = 1000
        presence = false
        join_leave = false
        "#
        ),
    );
    let node = Node::start(&["--config", &cfg], env).await;
    (node, cfg)
}

/// The fan-out writes a large channel's publications to the sockets itself, in pieces spread over
/// the node's workers, while each connection's task writes its replies: every subscriber still
/// gets every publication once and in order, and its replies, whatever raced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_channel_gets_every_publication_in_order_with_replies_between() {
    let (node, _cfg) = open_node().await;
    // More than one piece of direct writes (256 connections each).
    let mut clients = Vec::new();
    for _ in 0..300 {
        clients.push(node.connected(&["big"]).await);
    }
    const N: u64 = 60;
    let mut asked = Vec::new();
    for i in 1..=N {
        node.publish("big", json!(i)).await;
        if i % 10 == 0 {
            // A reply and a subscription change in the middle of the stream.
            let id = clients[0]
                .send("history", json!({"channel": "big", "limit": 1}))
                .await;
            asked.push(id);
            let ch = format!("side{i}");
            clients[1].send("subscribe", json!({"channel": ch})).await;
        }
    }
    for (n, c) in clients.iter_mut().enumerate() {
        let mut offsets = Vec::new();
        let mut replies = Vec::new();
        while offsets.len() < N as usize || (n == 0 && replies.len() < asked.len()) {
            let m = c
                .next_within(std::time::Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("client {n}: stalled after offsets {offsets:?}"));
            if m["pub"]["channel"] == "big" {
                offsets.push(m["pub"]["offset"].as_u64().unwrap());
            } else if let Some(id) = m["id"].as_u64() {
                assert!(m.get("error").is_none(), "client {n}: {m}");
                replies.push(id);
            }
        }
        assert_eq!(offsets, (1..=N).collect::<Vec<_>>(), "client {n}");
        if n == 0 {
            assert_eq!(replies, asked);
        }
    }
}

/// Broadcasts to hundreds of personal channels: the node gathers their direct writes across
/// channels and writes them in pieces (and the rest when the broadcast is done). Every client gets
/// every publication once and in order, one subscribed to channels in different pieces too, and
/// a publish right after a broadcast comes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasts_to_many_channels_reach_every_subscriber_in_order() {
    let (node, _cfg) = open_node().await;
    broadcasts_reach_every_subscriber_in_order(&node).await;
}

/// The same through Redis, where a broadcast stores up to 64 channels per script call: every
/// call's channels, and each channel's publications, arrive in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasts_through_redis_reach_every_subscriber_in_order() {
    let redis = RedisServer::start();
    let (node, _cfg) = open_node_on(Some(&redis.url()), &[]).await;
    broadcasts_reach_every_subscriber_in_order(&node).await;
}

/// A broadcast while Redis is down fails every channel with 111 (a call's channels fail
/// together); sent again with its key once Redis is back (with its data: a persistent Redis, so
/// the subscribers keep their streams), it publishes each channel once, and a further retry
/// answers the same positions and publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_while_redis_is_down_fails_each_channel_and_its_retry_completes_them() {
    let mut redis = RedisServer::start_with(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    });
    let (node, _cfg) = open_node_on(
        Some(&redis.url()),
        // This Redis keeps every write (appendfsync always): its operator may declare it, and
        // the restart then keeps the channel's epoch.
        &[("HERALD_REDIS__SYNCHRONOUS_PERSISTENCE", "true")],
    )
    .await;
    let channels: Vec<String> = (0..150).map(|i| format!("down{i}")).collect();
    let mut client = node.connected(&["down0", "down149"]).await;
    let body = json!({"channels": channels, "data": "hi", "idempotency_key": "b-1"});
    redis.stop();
    let (status, r) = node.api("/api/broadcast", Some(body.clone())).await;
    assert_eq!((status, &r["failed"]), (200, &json!(150)), "{r}");
    for result in r["results"].as_array().expect("results") {
        assert_eq!(result["error"]["code"], 111, "{r}");
    }
    redis.restart();
    let done = herald_testkit::eventually_some(
        std::time::Duration::from_secs(30),
        "the broadcast's retry to publish all 150 channels once Redis is back",
        || async {
            let (status, r) = node.api("/api/broadcast", Some(body.clone())).await;
            assert_eq!(status, 200, "{r}");
            (r["published"] == 150).then_some(r)
        },
    )
    .await;
    let (_, again) = node.api("/api/broadcast", Some(body)).await;
    assert_eq!(again, done, "a retry publishes nothing new");
    for result in done["results"].as_array().expect("results") {
        assert_eq!(result["offset"], 1, "{done}");
    }
    node.publish("down0", json!("after")).await;
    let mut got = Vec::new();
    while got.len() < 3 {
        let m = client.next_within(std::time::Duration::from_secs(10)).await;
        let m = m.unwrap_or_else(|| panic!("the client got only {got:?}"));
        if m.get("pub").is_some() {
            got.push((m["pub"]["channel"].clone(), m["pub"]["data"].clone()));
        }
    }
    got.sort_by_key(|(c, d)| (c.to_string(), d.to_string()));
    assert_eq!(
        got,
        vec![
            (json!("down0"), json!("after")),
            (json!("down0"), json!("hi")),
            (json!("down149"), json!("hi")),
        ]
    );
}

/// Three broadcasts to 600 personal channels of one client each, then a publish to one of them.
async fn broadcasts_reach_every_subscriber_in_order(node: &Node) {
    const CHANNELS: usize = 600;
    let channels: Vec<String> = (0..CHANNELS).map(|i| format!("own{i}")).collect();
    let mut clients = Vec::new();
    for ch in &channels {
        clients.push(node.connected(&[ch.as_str()]).await);
    }
    let spread = ["own0", "own300", "own599"];
    let mut wide = node.connected(&spread).await;
    const N: u64 = 3;
    for i in 1..=N {
        let (status, r) = node
            .api(
                "/api/broadcast",
                Some(json!({"channels": channels, "data": i})),
            )
            .await;
        assert_eq!((status, &r["published"]), (200, &json!(CHANNELS)), "{r}");
    }
    node.publish("own0", json!("after")).await;
    let next = |m: &serde_json::Value| (m["pub"]["channel"].clone(), m["pub"]["data"].clone());
    for (n, c) in clients.iter_mut().enumerate() {
        for i in 1..=N {
            let m = c.next_within(std::time::Duration::from_secs(10)).await;
            let m = m.unwrap_or_else(|| panic!("client {n}: nothing for broadcast {i}"));
            assert_eq!(next(&m), (json!(channels[n]), json!(i)), "client {n}");
        }
    }
    let m = clients[0]
        .next_within(std::time::Duration::from_secs(10))
        .await;
    assert_eq!(
        next(&m.expect("the publish")),
        (json!("own0"), json!("after"))
    );
    let mut got: Vec<(serde_json::Value, serde_json::Value)> = Vec::new();
    while got.len() < spread.len() * N as usize + 1 {
        let m = wide.next_within(std::time::Duration::from_secs(10)).await;
        got.push(next(
            &m.unwrap_or_else(|| panic!("the wide client got only {got:?}")),
        ));
    }
    for ch in spread {
        let data: Vec<serde_json::Value> = got
            .iter()
            .filter(|(c, _)| c == ch)
            .map(|(_, d)| d.clone())
            .collect();
        let mut want: Vec<serde_json::Value> = (1..=N).map(|i| json!(i)).collect();
        if ch == "own0" {
            want.push(json!("after"));
        }
        assert_eq!(data, want, "the wide client on {ch}");
    }
}
