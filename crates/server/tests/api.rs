//! Every row of the HTTP API table and its errors, against the real binary.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A dev node (API key `testkey`, HS256 secret set), so both anonymous and token users connect.
async fn node() -> Node {
    Node::dev().await
}

/// Connect as `user`, subscribed to `channels`; returns the client and its client id.
async fn user(node: &Node, user: &str, channels: &[&str]) -> (Client, String) {
    let mut c = node.client().await;
    let subs: serde_json::Map<String, Value> = channels
        .iter()
        .map(|ch| (ch.to_string(), json!({})))
        .collect();
    let t = token(json!({"sub": user, "info": {"name": user.to_uppercase()}}));
    let r = c.call("connect", json!({"token": t, "subs": subs})).await;
    let id = r["connect"]["client"]
        .as_str()
        .unwrap_or_else(|| panic!("connect failed: {r}"))
        .to_owned();
    (c, id)
}

/// The next `pub` push, skipping presence pushes.
async fn next_pub(c: &mut Client) -> Value {
    loop {
        let m = c.next().await;
        if let Some(p) = m.get("pub") {
            return p.clone();
        }
        assert!(
            m.get("join").is_some() || m.get("leave").is_some(),
            "unexpected {m}"
        );
    }
}

/// Nothing but presence pushes for a while.
async fn no_pub(c: &mut Client, wait: Duration) {
    while let Some(m) = c.next_within(wait).await {
        assert!(m.get("pub").is_none(), "unexpected publication {m}");
    }
}

fn offsets(v: &Value) -> Vec<u64> {
    v["publications"]
        .as_array()
        .unwrap_or_else(|| panic!("no publications in {v}"))
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn publish_returns_the_position_and_idempotency_key_dedupes() {
    let node = node().await;
    let (mut sub, _) = user(&node, "alice", &["news"]).await;
    let (status, first) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "news", "data": {"text": "hi"}})),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert!(first["epoch"].as_str().is_some_and(|e| !e.is_empty()));
    assert_eq!(first["offset"], 1);
    let p = next_pub(&mut sub).await;
    assert_eq!(
        p,
        json!({"channel": "news", "offset": 1, "data": {"text": "hi"}})
    );

    let body = json!({"channel": "news", "data": "once", "idempotency_key": "k-1"});
    let (status, a) = node.api("/api/publish", Some(body.clone())).await;
    assert_eq!(status, 200, "{a}");
    let (status, b) = node.api("/api/publish", Some(body)).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(a, b, "the same key gets the same position");
    assert_eq!(a, json!({"epoch": first["epoch"], "offset": 2}));
    let (_, c) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "news", "data": "other", "idempotency_key": "k-2"})),
        )
        .await;
    assert_eq!(c["offset"], 3);
    // Subscribers see the deduplicated publication once.
    assert_eq!(next_pub(&mut sub).await["data"], "once");
    assert_eq!(next_pub(&mut sub).await["data"], "other");
    no_pub(&mut sub, Duration::from_millis(200)).await;

    // Any JSON value is carried as it is.
    for data in [
        json!(null),
        json!(42),
        json!([1, "two", {"3": 3.5}]),
        json!("ünï"),
    ] {
        node.publish("news", data.clone()).await;
        assert_eq!(next_pub(&mut sub).await["data"], data);
    }
    // A bad channel name is a bad request.
    let (status, e) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "no spaces", "data": 1})),
        )
        .await;
    assert_eq!(
        (status, e["error"]["code"].clone()),
        (400, json!(107)),
        "{e}"
    );
}

#[tokio::test]
async fn broadcast_reports_each_channel() {
    let node = node().await;
    let (mut a, _) = user(&node, "alice", &["b1"]).await;
    let (mut b, _) = user(&node, "bob", &["b2"]).await;
    node.publish("b2", json!("earlier")).await;
    assert_eq!(next_pub(&mut b).await["offset"], 1);
    let (status, r) = node
        .api(
            "/api/broadcast",
            Some(json!({"channels": ["b1", "b2", "ghost:x", "bad name"], "data": {"n": 1}})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let results = r["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{r}");
    assert_eq!(results[0]["offset"], 1);
    assert!(results[0]["epoch"].is_string());
    assert_eq!(results[1]["offset"], 2);
    assert_eq!(results[2]["error"]["code"], 102, "{r}");
    assert!(results[2]["error"]["message"].is_string());
    assert_eq!(results[3]["error"]["code"], 107, "{r}");
    assert_eq!(
        next_pub(&mut a).await,
        json!({"channel": "b1", "offset": 1, "data": {"n": 1}})
    );
    assert_eq!(
        next_pub(&mut b).await,
        json!({"channel": "b2", "offset": 2, "data": {"n": 1}})
    );
    // An empty list is fine and does nothing.
    let (status, r) = node
        .api("/api/broadcast", Some(json!({"channels": [], "data": 1})))
        .await;
    assert_eq!(
        (status, r),
        (200, json!({"results": [], "published": 0, "failed": 0}))
    );
}

#[tokio::test]
async fn a_broadcast_retried_with_its_key_publishes_each_channel_once() {
    let node = node().await;
    let (mut a, _) = user(&node, "alice", &["k1"]).await;
    let body = json!({"channels": ["k1", "k2", "ghost:x"], "data": "hi", "idempotency_key": "m-1"});
    let (status, first) = node.api("/api/broadcast", Some(body.clone())).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        (&first["published"], &first["failed"]),
        (&json!(2), &json!(1))
    );
    // The retry answers the same positions and publishes nothing new.
    let (status, again) = node.api("/api/broadcast", Some(body)).await;
    assert_eq!((status, &again), (200, &first));
    node.publish("k1", json!("after")).await;
    assert_eq!(next_pub(&mut a).await["data"], "hi");
    assert_eq!(
        next_pub(&mut a).await["data"],
        "after",
        "the retry delivered twice"
    );
    // A bad key is refused whole.
    let (status, r) = node
        .api(
            "/api/broadcast",
            Some(json!({"channels": ["k1"], "data": 1, "idempotency_key": ""})),
        )
        .await;
    assert_eq!((status, &r["error"]["code"]), (400, &json!(107)), "{r}");
}

#[tokio::test]
async fn history_with_since_and_limit() {
    let node = node().await;
    let mut epoch = Value::Null;
    for i in 1..=5 {
        epoch = node.publish("h", json!({"i": i})).await["epoch"].clone();
    }
    let history = |body: Value| {
        let api = node.api_handle();
        async move {
            let (status, r) = api.api("/api/history", Some(body)).await;
            assert_eq!(status, 200, "{r}");
            r
        }
    };
    let all = history(json!({"channel": "h"})).await;
    assert_eq!(all["epoch"], epoch);
    assert_eq!(all["offset"], 5);
    assert_eq!(offsets(&all), vec![1, 2, 3, 4, 5]);
    assert_eq!(all["publications"][0]["data"], json!({"i": 1}));
    // Without since, limit takes the newest.
    assert_eq!(
        offsets(&history(json!({"channel": "h", "limit": 2})).await),
        vec![4, 5]
    );
    // With since, what follows it; with a limit, the oldest of those.
    let since = json!({"epoch": epoch, "offset": 2});
    assert_eq!(
        offsets(&history(json!({"channel": "h", "since": since})).await),
        vec![3, 4, 5]
    );
    assert_eq!(
        offsets(&history(json!({"channel": "h", "since": since, "limit": 1})).await),
        vec![3]
    );
    let top = history(json!({"channel": "h", "limit": 0})).await;
    assert_eq!((top["offset"].clone(), offsets(&top)), (json!(5), vec![]));
    // A channel never published to: an epoch, offset 0, nothing.
    let empty = history(json!({"channel": "fresh"})).await;
    assert_eq!(empty["offset"], 0);
    assert!(empty["epoch"].is_string());
    assert_eq!(offsets(&empty), Vec::<u64>::new());
}

#[tokio::test]
async fn presence_lists_clients_with_user_and_info() {
    let node = node().await;
    let (_alice, alice_id) = user(&node, "alice", &["room"]).await;
    let mut anon = node.connected(&["room"]).await;
    let (status, r) = node
        .api("/api/presence", Some(json!({"channel": "room"})))
        .await;
    assert_eq!(status, 200, "{r}");
    let clients = r["clients"].as_object().expect("clients");
    assert_eq!(clients.len(), 2, "{r}");
    assert_eq!(
        clients[&alice_id],
        json!({"user": "alice", "info": {"name": "ALICE"}})
    );
    let anon_entry = clients
        .iter()
        .find(|(id, _)| **id != alice_id)
        .unwrap()
        .1
        .clone();
    assert_eq!(anon_entry, json!({"user": ""}));
    // Leaving removes the entry.
    anon.call("unsubscribe", json!({"channel": "room"})).await;
    let (_, r) = node
        .api("/api/presence", Some(json!({"channel": "room"})))
        .await;
    assert_eq!(r["clients"].as_object().unwrap().len(), 1, "{r}");
    let (_, r) = node
        .api("/api/presence", Some(json!({"channel": "empty"})))
        .await;
    assert_eq!(r, json!({"clients": {}}));
}

#[tokio::test]
async fn subscribe_pushes_to_every_connection_of_the_user() {
    let node = node().await;
    node.publish("news", json!("before")).await;
    let (mut a1, _) = user(&node, "alice", &[]).await;
    let (mut a2, _) = user(&node, "alice", &[]).await;
    let (mut bob, _) = user(&node, "bob", &[]).await;
    let (status, r) = node
        .api(
            "/api/subscribe",
            Some(json!({"user": "alice", "channel": "news"})),
        )
        .await;
    assert_eq!((status, r), (200, json!({})));
    for c in [&mut a1, &mut a2] {
        let s = c.push("subscribe").await;
        assert_eq!(s["channel"], "news", "{s}");
        assert!(s["epoch"].is_string(), "{s}");
        assert_eq!(s["offset"], 1, "{s}");
        assert_eq!(s["recoverable"], true, "{s}");
    }
    node.publish("news", json!("after")).await;
    for c in [&mut a1, &mut a2] {
        let p = next_pub(c).await;
        assert_eq!(
            (p["offset"].clone(), p["data"].clone()),
            (json!(2), json!("after"))
        );
    }
    assert!(bob.next_within(Duration::from_millis(200)).await.is_none());
    // The subscription is a real one: the client can leave it, and subscribing again is 105.
    let r = a1.call("subscribe", json!({"channel": "news"})).await;
    assert_eq!(r["error"]["code"], 105, "{r}");
    // A user with no connection here: nothing happens, still {}.
    let (status, r) = node
        .api(
            "/api/subscribe",
            Some(json!({"user": "nobody", "channel": "news"})),
        )
        .await;
    assert_eq!((status, r), (200, json!({})));
    // Unknown namespace.
    let (status, r) = node
        .api(
            "/api/subscribe",
            Some(json!({"user": "alice", "channel": "ghost:x"})),
        )
        .await;
    assert_eq!((status, r["error"]["code"].clone()), (404, json!(102)));
}

#[tokio::test]
async fn unsubscribe_pushes_unsub_and_stops_publications() {
    let node = node().await;
    let (mut alice, _) = user(&node, "alice", &["news", "other"]).await;
    let (mut bob, _) = user(&node, "bob", &["news"]).await;
    let (status, r) = node
        .api(
            "/api/unsubscribe",
            Some(json!({"user": "alice", "channel": "news"})),
        )
        .await;
    assert_eq!((status, r), (200, json!({})));
    let u = loop {
        let m = alice.next().await;
        if let Some(u) = m.get("unsub") {
            break u.clone();
        }
        assert!(m.get("join").is_some(), "unexpected {m}");
    };
    assert_eq!(u["channel"], "news");
    assert_eq!(u["code"], 2000);
    assert!(u["reason"].is_string(), "{u}");
    node.publish("news", json!(1)).await;
    assert_eq!(next_pub(&mut bob).await["data"], 1);
    no_pub(&mut alice, Duration::from_millis(300)).await;
    // Other subscriptions of the connection are untouched.
    node.publish("other", json!(2)).await;
    assert_eq!(next_pub(&mut alice).await["channel"], "other");
    // The client may subscribe again.
    let r = alice.call("subscribe", json!({"channel": "news"})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
}

#[tokio::test]
async fn disconnect_by_user_and_by_client() {
    let node = node().await;
    let (mut a1, _) = user(&node, "alice", &[]).await;
    let (mut a2, _) = user(&node, "alice", &[]).await;
    let (mut bob, bob_id) = user(&node, "bob", &["room"]).await;
    let (mut carol, _) = user(&node, "carol", &["room"]).await;

    let (status, r) = node
        .api("/api/disconnect", Some(json!({"user": "alice"})))
        .await;
    assert_eq!((status, r), (200, json!({})));
    for c in [&mut a1, &mut a2] {
        let closed = c.closed().await;
        assert_eq!(closed.code, Some(4502), "{closed:?}");
        let d = closed.disconnect.expect("disconnect push");
        assert_eq!(d["code"], 4502);
        assert_eq!(d["reconnect"], false);
    }

    // By client id, with a custom (reconnecting) code.
    let (status, r) = node
        .api(
            "/api/disconnect",
            Some(json!({"client": bob_id, "code": 4100})),
        )
        .await;
    assert_eq!((status, r), (200, json!({})));
    let closed = bob.closed().await;
    assert_eq!(closed.code, Some(4100), "{closed:?}");
    let d = closed.disconnect.expect("disconnect push");
    assert_eq!(
        (d["code"].clone(), d["reconnect"].clone()),
        (json!(4100), json!(true))
    );

    // Carol was never touched.
    node.publish("room", json!("still here")).await;
    assert_eq!(next_pub(&mut carol).await["data"], "still here");

    // Bad requests.
    for body in [
        json!({}),
        json!({"user": "carol", "code": 1000}),
        json!({"user": "carol", "code": 5000}),
        json!({"user": "carol", "extra": 1}),
    ] {
        let (status, r) = node.api("/api/disconnect", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {r}");
        assert_eq!(r["error"]["code"], 107, "{body}: {r}");
    }
    let r = carol.call("presence", json!({"channel": "room"})).await;
    assert!(r.get("presence").is_some(), "carol unaffected: {r}");
}

#[tokio::test]
async fn channels_and_info() {
    let node = node().await;
    let (_a, _) = user(&node, "alice", &["room", "news"]).await;
    let (mut b, _) = user(&node, "bob", &["room"]).await;
    let _idle = node.connected(&[]).await;
    let (status, r) = node.api("/api/channels", None).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r,
        json!({"channels": {"room": {"subscribers": 2}, "news": {"subscribers": 1}}})
    );
    let (status, r) = node.api("/api/info", None).await;
    assert_eq!(status, 200, "{r}");
    let me = &r["nodes"][0];
    assert!(
        me["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("herald-")),
        "{r}"
    );
    assert_eq!(me["connections"], 3, "{r}");
    assert_eq!(me["subscriptions"], 3, "{r}");
    // The name is the one connect replies carry.
    let mut c = node.client().await;
    let reply = c.call("connect", json!({})).await;
    assert_eq!(reply["connect"]["node"], me["name"]);

    b.call("unsubscribe", json!({"channel": "room"})).await;
    let (_, r) = node.api("/api/channels", None).await;
    assert_eq!(r["channels"]["room"]["subscribers"], 1, "{r}");
}

#[tokio::test]
async fn api_errors() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIMITS__MAX_API_BODY_BYTES", "1024"),
            ("HERALD_LIMITS__MAX_BROADCAST_CHANNELS", "3"),
        ],
    )
    .await;
    let publish = json!({"channel": "a", "data": 1}).to_string();
    let code = |r: &Value| r["error"]["code"].clone();

    // Authentication.
    let (status, r) = node
        .http("POST", "/api/publish", Some(publish.clone()), None)
        .await;
    assert_eq!((status, code(&r)), (401, json!(101)), "{r}");
    assert!(r["error"]["message"].is_string(), "{r}");
    let (status, r) = node
        .http("POST", "/api/publish", Some(publish.clone()), Some("wrong"))
        .await;
    assert_eq!((status, code(&r)), (401, json!(101)), "{r}");
    let (status, r) = node
        .http(
            "POST",
            "/api/publish",
            Some(publish.clone()),
            Some("testkey-and-more"),
        )
        .await;
    assert_eq!((status, code(&r)), (401, json!(101)), "{r}");
    let (status, r) = node.http("GET", "/api/info", None, None).await;
    assert_eq!(
        (status, code(&r)),
        (401, json!(101)),
        "GET needs the key too: {r}"
    );

    // Bodies.
    let (status, r) = node
        .http(
            "POST",
            "/api/publish",
            Some("{not json".into()),
            Some(API_KEY),
        )
        .await;
    assert_eq!((status, code(&r)), (400, json!(107)), "{r}");
    let (status, r) = node
        .http("POST", "/api/publish", Some(String::new()), Some(API_KEY))
        .await;
    assert_eq!((status, code(&r)), (400, json!(107)), "empty body: {r}");
    let (status, r) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "a", "data": 1, "colour": "red"})),
        )
        .await;
    assert_eq!((status, code(&r)), (400, json!(107)), "unknown field: {r}");
    let (status, r) = node
        .api("/api/publish", Some(json!({"channel": "a"})))
        .await;
    assert_eq!((status, code(&r)), (400, json!(107)), "missing field: {r}");
    let (status, r) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "ghost:a", "data": 1})),
        )
        .await;
    assert_eq!((status, code(&r)), (404, json!(102)), "{r}");
    let (status, r) = node
        .api("/api/history", Some(json!({"channel": "ghost:a"})))
        .await;
    assert_eq!((status, code(&r)), (404, json!(102)), "{r}");
    let (status, r) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "a", "data": "x".repeat(2000)})),
        )
        .await;
    assert_eq!(status, 413, "{r}");
    assert!(r["error"]["code"].is_u64(), "{r}");
    let (status, r) = node
        .api(
            "/api/broadcast",
            Some(json!({"channels": ["a", "b", "c", "d"], "data": 1})),
        )
        .await;
    assert_eq!(status, 413, "too many broadcast channels: {r}");

    // Routes.
    let (status, r) = node.api("/api/nope", None).await;
    assert_eq!(status, 404, "{r}");
    assert!(r["error"]["code"].is_u64(), "{r}");
    let (status, r) = node.http("GET", "/nope", None, None).await;
    assert_eq!(status, 404, "{r}");
    let (status, r) = node.api("/api/publish", None).await;
    assert_eq!(status, 405, "GET /api/publish: {r}");
    let (status, r) = node.api("/api/channels", Some(json!({}))).await;
    assert_eq!(status, 405, "POST /api/channels: {r}");
    let (status, r) = node.http("DELETE", "/api/info", None, Some(API_KEY)).await;
    assert_eq!(status, 405, "{r}");

    // Still fine after all that.
    let (status, r) = node
        .api("/api/publish", Some(json!({"channel": "a", "data": 1})))
        .await;
    assert_eq!(status, 200, "{r}");
}

#[tokio::test]
async fn history_and_presence_where_the_namespace_has_none() {
    let cfg = config_file(
        "herald.toml",
        r#"
        [[namespaces]]
        name = "bare"
        history_size = 0
        "#,
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let (status, r) = node
        .api("/api/history", Some(json!({"channel": "bare:x"})))
        .await;
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (404, json!(108)),
        "{r}"
    );
    let (status, r) = node
        .api("/api/presence", Some(json!({"channel": "bare:x"})))
        .await;
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (404, json!(108)),
        "{r}"
    );
    // Publishing still works (no offsets kept beyond the epoch's position).
    let (status, r) = node
        .api(
            "/api/publish",
            Some(json!({"channel": "bare:x", "data": 1})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
}
