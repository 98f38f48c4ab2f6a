//! Pusher watchlist events against the real binary, with raw WebSocket frames: a connection
//! signed in (`pusher:signin`) with a `watchlist` in its `user_data` is told which watched users
//! are online, then as each comes online (first signed-in connection) or goes offline (last one
//! gone), in `pusher_internal:watchlist_events`; on one node and across two nodes on Redis; only
//! for an app with `enable_watchlist_events`; a watchlist over 100 users is refused. (pusher-js
//! drives the same through `pusher.user.watchlist` in
//! clients/js/test/integration/pusher-parity.test.ts.)

mod common;

use std::time::Duration;

use common::{config_file, Client, Node};
use herald_server::pusher::auth::sign;
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// An app of the tests: id, key, secret.
#[derive(Clone, Copy)]
struct App {
    id: &'static str,
    key: &'static str,
    secret: &'static str,
}

/// The app with watchlist events.
const WATCHING: App = App {
    id: "7",
    key: "app-key",
    secret: "app-secret",
};

/// An app without them (Pusher's default).
const PLAIN: App = App {
    id: "8",
    key: "plain-key",
    secret: "plain-secret",
};

fn config() -> common::ConfigFile {
    config_file(
        "herald.toml",
        &format!(
            "[[pusher.apps]]\nid = \"{}\"\nkey = \"{}\"\nsecret = \"{}\"\n\
             enable_watchlist_events = true\n\n\
             [[pusher.apps]]\nid = \"{}\"\nkey = \"{}\"\nsecret = \"{}\"\n",
            WATCHING.id, WATCHING.key, WATCHING.secret, PLAIN.id, PLAIN.key, PLAIN.secret
        ),
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

/// Send `pusher:signin` with `user_data`, signed as the app's auth endpoint would.
async fn send_signin(c: &mut Client, app: App, socket: &str, user_data: &Value) {
    let user_data = user_data.to_string();
    let signature = sign(app.secret, &format!("{socket}::user::{user_data}"));
    let data = json!({"auth": format!("{}:{signature}", app.key), "user_data": user_data});
    c.send_raw(&json!({"event": "pusher:signin", "data": data}).to_string())
        .await;
}

/// A client of `app` signed in as `user` watching `watchlist` (none: no watchlist), and its
/// socket id.
async fn signed_in(
    node: &Node,
    app: App,
    user: &str,
    watchlist: Option<&[&str]>,
) -> (Client, String) {
    let (mut c, socket) = connected(node, app).await;
    let mut user_data = json!({"id": user});
    if let Some(w) = watchlist {
        user_data["watchlist"] = json!(w);
    }
    send_signin(&mut c, app, &socket, &user_data).await;
    expect(&mut c, "pusher:signin_success").await;
    (c, socket)
}

/// The next message, which must be `pusher_internal:watchlist_events`: its events as
/// (name, sorted user ids).
async fn watchlist_events(c: &mut Client) -> Vec<(String, Vec<String>)> {
    let m = expect(c, "pusher_internal:watchlist_events").await;
    assert!(m.get("channel").is_none(), "not on a channel: {m}");
    let data: Value = serde_json::from_str(m["data"].as_str().expect("data is a JSON string"))
        .expect("data is JSON");
    data["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            let mut ids: Vec<String> = e["user_ids"]
                .as_array()
                .expect("user_ids")
                .iter()
                .map(|id| id.as_str().expect("a string id").to_owned())
                .collect();
            ids.sort();
            (e["name"].as_str().expect("name").to_owned(), ids)
        })
        .collect()
}

/// One event: `name` with `ids`.
fn one(name: &str, ids: &[&str]) -> Vec<(String, Vec<String>)> {
    vec![(name.to_owned(), ids.iter().map(|s| s.to_string()).collect())]
}

#[tokio::test]
async fn watchers_see_watched_users_come_online_and_go_offline() {
    let config = config();
    let node = Node::start(&["--dev", "--config", &config], &[]).await;

    // Alice is online before the watcher signs in: the first event says so.
    let (alice, _) = signed_in(&node, WATCHING, "alice", None).await;
    let (mut w, _) = signed_in(&node, WATCHING, "watcher", Some(&["alice", "bob"])).await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["alice"]));
    quiet(&mut w, "bob is offline").await;

    // Bob's first connection: online. Anyone else signing in: nothing.
    let (mut bob, bob_socket) = signed_in(&node, WATCHING, "bob", None).await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["bob"]));
    let _carol = signed_in(&node, WATCHING, "carol", None).await;
    quiet(&mut w, "carol is not watched").await;

    // A second connection of Alice changes nothing; she is offline when the last one goes.
    let (alice_2, _) = signed_in(&node, WATCHING, "alice", None).await;
    quiet(&mut w, "alice was online already").await;
    drop(alice);
    quiet(&mut w, "alice is still online on her second connection").await;
    drop(alice_2);
    assert_eq!(watchlist_events(&mut w).await, one("offline", &["alice"]));

    // Bob's connection signs in again as someone else: bob is offline.
    send_signin(&mut bob, WATCHING, &bob_socket, &json!({"id": "dave"})).await;
    expect(&mut bob, "pusher:signin_success").await;
    assert_eq!(watchlist_events(&mut w).await, one("offline", &["bob"]));
    quiet(&mut w, "all told").await;
}

#[tokio::test]
async fn a_watcher_signing_in_again_watches_its_new_list() {
    let config = config();
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let _alice = signed_in(&node, WATCHING, "alice", None).await;
    let _bob = signed_in(&node, WATCHING, "bob", None).await;
    let (mut w, socket) = signed_in(&node, WATCHING, "watcher", Some(&["alice"])).await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["alice"]));

    send_signin(
        &mut w,
        WATCHING,
        &socket,
        &json!({"id": "watcher", "watchlist": ["bob", "erin"]}),
    )
    .await;
    expect(&mut w, "pusher:signin_success").await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["bob"]));
    // Alice is no longer watched: her coming and going is not told.
    let (alice_2, _) = signed_in(&node, WATCHING, "alice", None).await;
    drop(alice_2);
    let (_erin, _) = signed_in(&node, WATCHING, "erin", None).await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["erin"]));
    quiet(&mut w, "alice is not watched any more").await;
}

#[tokio::test]
async fn bad_watchlists_are_refused_with_4009() {
    let config = config();
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let too_many: Vec<String> = (0..101).map(|i| format!("user-{i}")).collect();
    let cases = [
        (json!({"id": "w", "watchlist": too_many}), "at most 100"),
        (json!({"id": "w", "watchlist": "alice"}), "must be an array"),
        (json!({"id": "w", "watchlist": [7]}), "non-empty strings"),
    ];
    for (user_data, why) in cases {
        let (mut c, socket) = connected(&node, WATCHING).await;
        send_signin(&mut c, WATCHING, &socket, &user_data).await;
        let e = expect(&mut c, "pusher:error").await;
        assert_eq!(e["data"]["code"], 4009, "{e}");
        let message = e["data"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{why}: {message}");
        assert_eq!(c.closed().await.code, Some(4009));
    }

    // Exactly 100 is fine.
    let hundred: Vec<&str> = too_many[..100].iter().map(String::as_str).collect();
    let (mut c, _) = signed_in(&node, WATCHING, "w", Some(&hundred)).await;
    quiet(&mut c, "nobody watched is online").await;
}

#[tokio::test]
async fn apps_without_watchlist_events_send_none() {
    let config = config();
    let node = Node::start(&["--dev", "--config", &config], &[]).await;
    let _alice = signed_in(&node, PLAIN, "alice", None).await;
    // The watchlist is the app's signed data there, not checked or acted on (as with Pusher).
    let (mut w, _) = signed_in(&node, PLAIN, "watcher", Some(&["alice", "bob"])).await;
    let _bob = signed_in(&node, PLAIN, "bob", None).await;
    quiet(&mut w, "watchlist events are off for this app").await;
}

#[tokio::test]
async fn watchlists_follow_users_on_other_nodes_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    let config = config();
    let url = redis.url();
    let env = [("HERALD_BROKER_URL", url.as_str())];
    let a = Node::start(&["--dev", "--config", &config], &env).await;
    let b = Node::start(&["--dev", "--config", &config], &env).await;

    // Alice on node A is online for a watcher on node B.
    let (alice, _) = signed_in(&a, WATCHING, "alice", None).await;
    let (mut w, _) = signed_in(&b, WATCHING, "watcher", Some(&["alice", "bob"])).await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["alice"]));
    // Bob signs in on A, then on B too: online once.
    let (bob_a, _) = signed_in(&a, WATCHING, "bob", None).await;
    assert_eq!(watchlist_events(&mut w).await, one("online", &["bob"]));
    let (bob_b, _) = signed_in(&b, WATCHING, "bob", None).await;
    quiet(&mut w, "bob was online already").await;
    // Offline once the last connection anywhere is gone.
    drop(bob_a);
    quiet(&mut w, "bob is still online on node B").await;
    drop(bob_b);
    assert_eq!(watchlist_events(&mut w).await, one("offline", &["bob"]));
    drop(alice);
    assert_eq!(watchlist_events(&mut w).await, one("offline", &["alice"]));
}
