//! Proxy hooks' answers beyond allow/deny, against the real binary and a real HTTP backend
//! served by this test: rights a subscription is granted (`allow`), per-subscription options
//! (`override`), the connect hook's server-side `subs` with options, and the connection's `meta`
//! sent back to later hooks.
//!
//! The backend answers what the client asks it to: the connect hook returns the `connect`
//! command's `data.result`, the subscribe hook the `subscribe` command's `data` as its result,
//! and the rpc hook the `meta` it was sent. Every request it gets is recorded.

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// One request the backend got.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    body: Value,
}

/// An HTTP backend on a free port, answering every hook as the module docs say.
struct Backend {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(path: &str, body: &Value) -> Value {
    match path {
        "/connect" => json!({"result": body["data"]["result"]}),
        "/subscribe" => json!({"result": body.get("data").cloned().unwrap_or(json!({}))}),
        "/rpc" => json!({"result": {"data": {"meta": body.get("meta")}}}),
        _ => json!({"error": {"code": 1404, "message": "no such hook"}}),
    }
}

impl Backend {
    async fn start() -> Backend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let record = record.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let bytes = req.into_body().collect().await.unwrap().to_bytes();
                            let body: Value = serde_json::from_slice(&bytes).unwrap();
                            let reply = answer(&path, &body);
                            record.lock().unwrap().push(Seen { path, body });
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                                reply.to_string(),
                            ))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Backend { port, seen, task }
    }

    fn url(&self, hook: &str) -> String {
        format!("http://127.0.0.1:{}/{hook}", self.port)
    }

    /// The requests to `path` so far.
    fn requests(&self, path: &str) -> Vec<Value> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.body.clone())
            .collect()
    }
}

/// `room` asks the subscribe hook and lets subscribers read history and presence (not publish);
/// `nohist` keeps no history.
async fn node(backend: &Backend) -> (Node, ConfigFile) {
    let cfg = config_file(
        "herald.toml",
        &format!(
            r#"
[proxy]
connect_url = {:?}
subscribe_url = {:?}
rpc_url = {:?}
timeout_ms = 3000

[[namespaces]]
name = "room"
subscribe = "token"
subscribe_proxy = true
publish = false
history_size = 10
presence = true
join_leave = true

[[namespaces]]
name = "nohist"
subscribe = "token"
subscribe_proxy = true
history_size = 0
"#,
            backend.url("connect"),
            backend.url("subscribe"),
            backend.url("rpc"),
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    (node, cfg)
}

/// A client the connect hook answered with `result`; returns it and the `connect` reply.
async fn connected(node: &Node, result: Value) -> (Client, Value) {
    let mut c = Client::open(node.addr, &[]).await;
    let r = c.call("connect", json!({"data": {"result": result}})).await;
    assert!(r.get("connect").is_some(), "connect failed: {r}");
    (c, r["connect"].clone())
}

/// Subscribe with the subscribe hook answering `result`.
async fn subscribe(c: &mut Client, channel: &str, result: Value) -> Value {
    c.call("subscribe", json!({"channel": channel, "data": result}))
        .await
}

/// Whether publish, history and presence succeed on `channel`.
async fn rights(c: &mut Client, channel: &str) -> [bool; 3] {
    let mut out = [false; 3];
    let calls = [
        ("publish", json!({"channel": channel, "data": {"n": 1}})),
        ("history", json!({"channel": channel})),
        ("presence", json!({"channel": channel})),
    ];
    for (i, (method, params)) in calls.into_iter().enumerate() {
        let r = c.call(method, params).await;
        out[i] = match r.get(method) {
            Some(_) => true,
            None => {
                assert_eq!(r["error"]["code"], 103, "{method} on {channel}: {r}");
                false
            }
        };
    }
    out
}

#[tokio::test]
async fn rights_listed_by_the_subscribe_hook_are_exactly_what_the_subscription_may_do() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend).await;
    let (mut alice, _) = connected(&node, json!({"user": "alice"})).await;

    // No list: the namespace's rules (subscribers read, nobody publishes).
    let r = subscribe(&mut alice, "room:plain", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(rights(&mut alice, "room:plain").await, [false, true, true]);

    // Centrifugo's short name: publish although the namespace says no, and nothing else.
    let r = subscribe(&mut alice, "room:writer", json!({"allow": ["pub"]})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(rights(&mut alice, "room:writer").await, [true, false, false]);

    let r = subscribe(
        &mut alice,
        "room:all",
        json!({"allow": ["publish", "history", "presence"]}),
    )
    .await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(rights(&mut alice, "room:all").await, [true, true, true]);

    // An empty list: receive only.
    let r = subscribe(&mut alice, "room:reader", json!({"allow": []})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(rights(&mut alice, "room:reader").await, [false, false, false]);

    // After unsubscribing, the grant is gone with the subscription.
    let r = alice
        .call("unsubscribe", json!({"channel": "room:writer"}))
        .await;
    assert!(r.get("unsubscribe").is_some(), "{r}");
    let r = alice
        .call("publish", json!({"channel": "room:writer", "data": {}}))
        .await;
    assert_eq!(r["error"]["code"], 103, "{r}");

    // What Herald does not know is a bad answer (error 100), never silently dropped.
    for (channel, result) in [
        ("room:sub", json!({"allow": ["sub"]})),
        ("room:caps", json!({"caps": []})),
        ("room:info", json!({"info": {"x": 1}})),
        (
            "room:positioning",
            json!({"override": {"force_positioning": {"value": true}}}),
        ),
    ] {
        let r = subscribe(&mut alice, channel, result).await;
        assert_eq!(r["error"]["code"], 100, "{channel}: {r}");
    }
}

#[tokio::test]
async fn the_subscribe_hook_overrides_presence_and_recovery_per_subscription() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend).await;
    let (mut alice, _) = connected(&node, json!({"user": "alice"})).await;
    let (mut ghost, _) = connected(&node, json!({"user": "ghost"})).await;

    // Not in presence, so no join either.
    let r = subscribe(&mut alice, "room:quiet", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = subscribe(
        &mut ghost,
        "room:quiet",
        json!({"override": {"presence": {"value": false}}}),
    )
    .await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = alice
        .call("presence", json!({"channel": "room:quiet"}))
        .await;
    let users: Vec<&Value> = r["presence"]["clients"]
        .as_object()
        .unwrap_or_else(|| panic!("{r}"))
        .values()
        .map(|c| &c["user"])
        .collect();
    assert_eq!(users, [&json!("alice")], "{r}");
    while let Some(m) = alice
        .next_within(std::time::Duration::from_millis(300))
        .await
    {
        assert!(
            !m.to_string().contains("ghost"),
            "a join for a subscription outside presence: {m}"
        );
    }

    // Recovery turned off for one subscription: its `since` is not honoured.
    let r = subscribe(&mut alice, "room:rec", json!({})).await;
    let epoch = r["subscribe"]["epoch"].clone();
    alice
        .call("unsubscribe", json!({"channel": "room:rec"}))
        .await;
    node.publish("room:rec", json!({"n": 1})).await;
    node.publish("room:rec", json!({"n": 2})).await;
    let since = json!({"epoch": epoch, "offset": 0});
    let r = alice
        .call(
            "subscribe",
            json!({"channel": "room:rec", "since": since,
                   "data": {"override": {"recovery": {"value": false}}}}),
        )
        .await;
    let sub = &r["subscribe"];
    assert!(sub.get("recovered").is_none(), "{r}");
    assert!(sub.get("publications").is_none(), "{r}");
    // The same `since` without the override recovers both.
    let r = ghost
        .call(
            "subscribe",
            json!({"channel": "room:rec", "since": since, "data": {}}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(
        r["subscribe"]["publications"].as_array().map(Vec::len),
        Some(2),
        "{r}"
    );

    // Overrides the namespace cannot honour are bad answers.
    let r = subscribe(
        &mut alice,
        "nohist:x",
        json!({"override": {"force_recovery": {"value": true}}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 100, "{r}");
    let r = subscribe(
        &mut alice,
        "nohist:y",
        json!({"override": {"join_leave": {"value": true}}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 100, "{r}");
}

#[tokio::test]
async fn connect_meta_travels_with_later_hook_calls_and_subs_carry_options() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend).await;
    let (mut alice, connect) = connected(
        &node,
        json!({
            "user": "alice",
            "meta": {"tenant": "t1", "plan": "pro"},
            "subs": {"room:srv": {"data": {"hello": 1}, "allow": ["history"]}},
        }),
    )
    .await;
    // Server-side subscription with the hook's data and rights.
    assert_eq!(connect["subs"]["room:srv"]["data"], json!({"hello": 1}));
    assert!(connect["subs"]["room:srv"]["epoch"].is_string(), "{connect}");
    assert_eq!(rights(&mut alice, "room:srv").await, [false, true, false]);
    // Meta is the backend's, not the client's.
    assert!(!connect.to_string().contains("tenant"), "{connect}");

    // Every later hook call carries it.
    let r = alice
        .call("rpc", json!({"method": "whoami", "data": {}}))
        .await;
    assert_eq!(
        r["rpc"]["data"]["meta"],
        json!({"tenant": "t1", "plan": "pro"}),
        "{r}"
    );
    subscribe(&mut alice, "room:later", json!({})).await;
    let subscribes = backend.requests("/subscribe");
    assert_eq!(subscribes.len(), 1, "{subscribes:?}");
    assert_eq!(subscribes[0]["meta"], json!({"tenant": "t1", "plan": "pro"}));
    // A connection without meta sends none.
    let (mut bob, _) = connected(&node, json!({"user": "bob"})).await;
    let r = bob.call("rpc", json!({"method": "whoami"})).await;
    assert_eq!(r["rpc"]["data"]["meta"], Value::Null, "{r}");

    // Meta that is not an object, or too big, is a bad answer: error 100, then close 4005.
    for meta in [json!([1]), json!({"big": "x".repeat(5000)})] {
        let mut c = Client::open(node.addr, &[]).await;
        let r = c
            .call(
                "connect",
                json!({"data": {"result": {"user": "carol", "meta": meta}}}),
            )
            .await;
        assert_eq!(r["error"]["code"], 100, "{r}");
        assert_eq!(c.closed().await.code, Some(4005));
    }
}
