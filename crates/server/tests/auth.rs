//! Tokens (HS256, RS256, ES256; expiry at connect and during the connection; refresh) and
//! permissions (namespace policies, subscription tokens, user-limited channels, publish, history
//! and presence switches), against the real binary.

mod common;

use std::time::Duration;

use common::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// A node with tokens required, and namespaces for every permission rule.
const PERMISSIONS: &str = r#"
allow_anonymous = true

[default_namespace]
subscribe = "authenticated"
publish = true
presence = true

[[namespaces]]
name = "priv"
subscribe = "token"
publish = true

[[namespaces]]
name = "members"
subscribe = "authenticated"

[[namespaces]]
name = "dm"
subscribe = "authenticated"

[[namespaces]]
name = "ro"
subscribe = "anonymous"
publish = false
history = false
presence = false
"#;

async fn permissions_node() -> Node {
    let cfg = config_file("herald.toml", PERMISSIONS);
    Node::start(&["--config", &cfg], &[]).await
}

/// A node that requires a token (no `--dev`, no anonymous access).
async fn strict_node() -> Node {
    Node::start(&[], &[]).await
}

fn error_code(r: &Value) -> u64 {
    r["error"]["code"]
        .as_u64()
        .unwrap_or_else(|| panic!("not an error reply: {r}"))
}

/// Connect with a token; panics unless it succeeds. Returns the client and the connect result.
async fn connect_with(node: &Node, token: &str, extra: Value) -> (Client, Value) {
    let mut c = node.client().await;
    let mut params = json!({ "token": token });
    if let Value::Object(m) = extra {
        params.as_object_mut().unwrap().extend(m);
    }
    let r = c.call("connect", params).await;
    assert!(r.get("connect").is_some(), "connect failed: {r}");
    let result = r["connect"].clone();
    (c, result)
}

/// Send `connect` with these params and expect an error reply followed by the close code.
async fn refused(node: &Node, params: Value, reply_code: u64, close_code: u16) {
    let mut c = node.client().await;
    let r = c.call("connect", params.clone()).await;
    assert_eq!(error_code(&r), reply_code, "{params} → {r}");
    let closed = c.closed().await;
    assert_eq!(closed.code, Some(close_code), "{params}: {closed:?}");
    let d = closed.disconnect.expect("disconnect push before the close");
    assert_eq!(d["code"], close_code);
    assert_eq!(d["reconnect"], close_code < 4500, "{d}");
}

/// A working connection (checks that refusals elsewhere left it alone).
async fn assert_usable(c: &mut Client, channel: &str) {
    let r = c
        .call("history", json!({"channel": channel, "limit": 0}))
        .await;
    assert!(r.get("history").is_some(), "connection unusable: {r}");
}

#[tokio::test]
async fn a_token_is_required_without_anonymous_access() {
    let node = strict_node().await;
    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    refused(&node, json!({}), 101, 4501).await;
    refused(&node, json!({"token": ""}), 101, 4501).await;
    assert_usable(&mut alice, "news").await;
}

#[tokio::test]
async fn forged_and_garbage_tokens_close_with_4501() {
    let node = strict_node().await;
    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice"}),
        &EncodingKey::from_secret(b"not the server's secret"),
    )
    .unwrap();
    refused(&node, json!({"token": forged}), 101, 4501).await;
    refused(&node, json!({"token": "garbage"}), 101, 4501).await;
    refused(&node, json!({"token": "a.b.c"}), 101, 4501).await;
    // Tampered payload: the signature no longer matches.
    let good = token(json!({"sub": "bob"}));
    let mut parts: Vec<&str> = good.split('.').collect();
    let evil = {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"sub":"admin"}"#)
    };
    parts[1] = &evil;
    refused(&node, json!({"token": parts.join(".")}), 101, 4501).await;
    // An algorithm the node has no key for.
    let rs = encode(
        &Header::new(Algorithm::RS256),
        &json!({"sub": "alice"}),
        &EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa_private.pem")).unwrap()).unwrap(),
    )
    .unwrap();
    refused(&node, json!({"token": rs}), 101, 4501).await;
    assert_usable(&mut alice, "news").await;
}

#[tokio::test]
async fn expired_token_at_connect_is_109_then_4004() {
    let node = strict_node().await;
    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let expired = token(json!({"sub": "alice", "exp": now() - 10}));
    refused(&node, json!({"token": expired}), 109, 4004).await;
    assert_usable(&mut alice, "news").await;
}

#[tokio::test]
async fn connect_result_has_expires_in() {
    let node = strict_node().await;
    let (_, r) = connect_with(
        &node,
        &token(json!({"sub": "alice", "exp": now() + 120})),
        json!({}),
    )
    .await;
    let secs = r["expires_in"].as_u64().expect("expires_in");
    assert!((118..=120).contains(&secs), "expires_in {secs}");
    let (_, r) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    assert!(r.get("expires_in").is_none(), "no exp, no expires_in: {r}");
}

#[tokio::test]
async fn token_expiring_during_the_connection_closes_with_4004() {
    let node = strict_node().await;
    let (mut forever, _) = connect_with(&node, &token(json!({"sub": "bob"})), json!({})).await;
    let (mut c, r) = connect_with(
        &node,
        &token(json!({"sub": "alice", "exp": now() + 2})),
        json!({}),
    )
    .await;
    assert!(r["expires_in"].as_u64().unwrap() <= 2, "{r}");
    let started = std::time::Instant::now();
    let closed = c.closed().await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "closed after {:?}",
        started.elapsed()
    );
    assert_eq!(closed.code, Some(4004), "{closed:?}");
    let d = closed.disconnect.expect("disconnect push");
    assert_eq!(d["code"], 4004);
    assert_eq!(d["reconnect"], true);
    assert_usable(&mut forever, "news").await;
}

#[tokio::test]
async fn refresh_extends_the_connection_and_refuses_another_user() {
    let node = strict_node().await;
    let (mut c, _) = connect_with(
        &node,
        &token(json!({"sub": "alice", "exp": now() + 2})),
        json!({}),
    )
    .await;
    // A token for another user is refused and changes nothing.
    let r = c
        .call(
            "refresh",
            json!({"token": token(json!({"sub": "bob", "exp": now() + 60}))}),
        )
        .await;
    assert_eq!(error_code(&r), 101, "{r}");
    // An expired one is 109; a forged one is 101.
    let r = c
        .call(
            "refresh",
            json!({"token": token(json!({"sub": "alice", "exp": now() - 5}))}),
        )
        .await;
    assert_eq!(error_code(&r), 109, "{r}");
    let r = c.call("refresh", json!({"token": "garbage"})).await;
    assert_eq!(error_code(&r), 101, "{r}");

    let r = c
        .call(
            "refresh",
            json!({"token": token(json!({"sub": "alice", "exp": now() + 60}))}),
        )
        .await;
    let secs = r["refresh"]["expires_in"].as_u64().expect("expires_in");
    assert!((58..=60).contains(&secs), "{r}");
    // Past the old expiry the connection is still there.
    assert!(c.next_within(Duration::from_millis(3000)).await.is_none());
    assert_usable(&mut c, "news").await;
}

#[tokio::test]
async fn refused_refresh_keeps_the_old_expiry() {
    let node = strict_node().await;
    let (mut c, _) = connect_with(
        &node,
        &token(json!({"sub": "alice", "exp": now() + 2})),
        json!({}),
    )
    .await;
    let r = c
        .call(
            "refresh",
            json!({"token": token(json!({"sub": "bob", "exp": now() + 60}))}),
        )
        .await;
    assert_eq!(error_code(&r), 101);
    assert_eq!(c.closed().await.code, Some(4004));
}

fn r_alice_client(connect: &Value) -> &str {
    connect["client"].as_str().expect("client id")
}

fn rsa_token(claims: Value) -> String {
    let pem = std::fs::read(fixture("rsa_private.pem")).unwrap();
    encode(
        &Header::new(Algorithm::RS256),
        &claims,
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
    )
    .unwrap()
}

fn ec_token(claims: Value) -> String {
    let pem = std::fs::read(fixture("ec_private.pem")).unwrap();
    encode(
        &Header::new(Algorithm::ES256),
        &claims,
        &EncodingKey::from_ec_pem(&pem).unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn rs256_and_es256_connection_tokens() {
    let cfg = config_file(
        "herald.toml",
        &format!(
            "token_rsa_public_key_file = {:?}\ntoken_ecdsa_public_key_file = {:?}\n",
            fixture("rsa_public.pem"),
            fixture("ec_public.pem")
        ),
    );
    // No HMAC secret: only the public keys verify.
    let node = Node::start(&["--config", &cfg], &[("HERALD_TOKEN_HMAC_SECRET", "")]).await;
    let (mut rs, r) = connect_with(
        &node,
        &rsa_token(json!({"sub": "rsa-user", "exp": now() + 60, "channels": ["news"]})),
        json!({}),
    )
    .await;
    assert!(r["expires_in"].as_u64().is_some(), "{r}");
    assert!(r["subs"]["news"]["epoch"].is_string(), "{r}");
    let (mut es, r) = connect_with(
        &node,
        &ec_token(json!({"sub": "ec-user", "exp": now() + 60})),
        json!({}),
    )
    .await;
    assert!(r["client"].is_string());
    assert_usable(&mut rs, "news").await;
    assert_usable(&mut es, "news").await;
    // Expiry applies to them as to HS256.
    refused(
        &node,
        json!({"token": ec_token(json!({"sub": "x", "exp": now() - 5}))}),
        109,
        4004,
    )
    .await;
    // HS256 has no key here.
    refused(
        &node,
        json!({"token": token(json!({"sub": "hs"}))}),
        101,
        4501,
    )
    .await;
    // A token signed by another RSA key (the EC key in an RS256 header cannot even be used, so
    // re-sign with the right algorithm but swap the signature of another valid token).
    let a = rsa_token(json!({"sub": "a"}));
    let b = rsa_token(json!({"sub": "b"}));
    let forged = format!(
        "{}.{}",
        a.rsplit_once('.').unwrap().0,
        b.rsplit_once('.').unwrap().1
    );
    refused(&node, json!({"token": forged}), 101, 4501).await;
}

#[tokio::test]
async fn token_channels_are_subscribed_at_connect_and_info_shows_in_presence() {
    let node = permissions_node().await;
    let t = token(json!({
        "sub": "alice",
        "channels": ["lobby", "priv:granted"],
        "info": {"name": "Alice", "role": "admin"}
    }));
    let (mut alice, r) = connect_with(&node, &t, json!({"subs": {"other": {}}})).await;
    let alice_connect = r.clone();
    let subs = r["subs"].as_object().unwrap();
    for ch in ["lobby", "priv:granted", "other"] {
        assert!(subs[ch]["epoch"].is_string(), "{ch} not subscribed: {r}");
    }
    assert_eq!(subs.len(), 3, "{r}");

    // The token channel is live: an API publication arrives.
    node.publish("lobby", json!("hello")).await;
    let p = alice.push("pub").await;
    assert_eq!(p["channel"], "lobby");
    assert_eq!(p["data"], "hello");
    node.publish("priv:granted", json!(1)).await;
    assert_eq!(alice.push("pub").await["channel"], "priv:granted");

    // Presence shows user and info.
    let (mut bob, _) = connect_with(&node, &token(json!({"sub": "bob"})), json!({})).await;
    let r = bob.call("presence", json!({"channel": "lobby"})).await;
    let clients = r["presence"]["clients"].as_object().expect("clients");
    assert_eq!(clients.len(), 1, "{r}");
    let (client, entry) = clients.iter().next().unwrap();
    assert_eq!(client, r_alice_client(&alice_connect));
    assert_eq!(entry["user"], "alice");
    assert_eq!(entry["info"], json!({"name": "Alice", "role": "admin"}));
    let (status, api) = node
        .api("/api/presence", Some(json!({"channel": "lobby"})))
        .await;
    assert_eq!(status, 200);
    assert_eq!(api["clients"][client]["info"]["name"], "Alice");
}

#[tokio::test]
async fn token_namespace_needs_a_subscription_token_for_that_channel_and_user() {
    let node = permissions_node().await;
    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let r = alice.call("subscribe", json!({"channel": "priv:x"})).await;
    assert_eq!(error_code(&r), 103, "plain subscribe: {r}");

    let wrong_channel = token(json!({"sub": "alice", "channel": "priv:y", "exp": now() + 60}));
    let r = alice
        .call(
            "subscribe",
            json!({"channel": "priv:x", "token": wrong_channel}),
        )
        .await;
    assert_eq!(error_code(&r), 103, "token for another channel: {r}");

    let wrong_user = token(json!({"sub": "bob", "channel": "priv:x", "exp": now() + 60}));
    let r = alice
        .call(
            "subscribe",
            json!({"channel": "priv:x", "token": wrong_user}),
        )
        .await;
    assert_eq!(error_code(&r), 103, "token for another user: {r}");

    let forged = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice", "channel": "priv:x"}),
        &EncodingKey::from_secret(b"wrong"),
    )
    .unwrap();
    let r = alice
        .call("subscribe", json!({"channel": "priv:x", "token": forged}))
        .await;
    assert_eq!(error_code(&r), 103, "forged subscription token: {r}");

    let expired = token(json!({"sub": "alice", "channel": "priv:x", "exp": now() - 5}));
    let r = alice
        .call("subscribe", json!({"channel": "priv:x", "token": expired}))
        .await;
    assert_eq!(error_code(&r), 109, "expired subscription token: {r}");

    let good = token(json!({"sub": "alice", "channel": "priv:x", "exp": now() + 60}));
    let r = alice
        .call("subscribe", json!({"channel": "priv:x", "token": good}))
        .await;
    assert!(r["subscribe"]["epoch"].is_string(), "{r}");
    node.publish("priv:x", json!("secret")).await;
    assert_eq!(alice.push("pub").await["data"], "secret");

    // In connect.subs too.
    let (mut c, r) = connect_with(
        &node,
        &token(json!({"sub": "alice"})),
        json!({"subs": {
            "priv:x": {"token": token(json!({"sub": "alice", "channel": "priv:x"}))},
            "priv:z": {}
        }}),
    )
    .await;
    assert!(r["subs"]["priv:x"]["epoch"].is_string(), "{r}");
    assert_eq!(r["subs"]["priv:z"]["error"]["code"], 103, "{r}");
    assert_usable(&mut c, "news").await;
}

#[tokio::test]
async fn a_subscription_ends_when_its_token_expires_unless_refreshed() {
    let node = permissions_node().await;
    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let sub_token = |channel: &str, secs: u64| {
        token(json!({"sub": "alice", "channel": channel, "exp": now() + secs}))
    };
    for channel in ["priv:short", "priv:kept"] {
        let r = alice
            .call(
                "subscribe",
                json!({"channel": channel, "token": sub_token(channel, 2)}),
            )
            .await;
        assert!(r["subscribe"]["epoch"].is_string(), "{r}");
        let expires_in = r["subscribe"]["expires_in"].as_u64().expect("expires_in");
        assert!(expires_in <= 2, "{r}");
    }
    // Refusals: a token for another channel, an expired one, a channel without an expiring token.
    let r = alice
        .call(
            "sub_refresh",
            json!({"channel": "priv:kept", "token": sub_token("priv:other", 60)}),
        )
        .await;
    assert_eq!(error_code(&r), 103, "{r}");
    let expired = token(json!({"sub": "alice", "channel": "priv:kept", "exp": now() - 5}));
    let r = alice
        .call(
            "sub_refresh",
            json!({"channel": "priv:kept", "token": expired}),
        )
        .await;
    assert_eq!(error_code(&r), 109, "{r}");
    let r = alice
        .call(
            "sub_refresh",
            json!({"channel": "news", "token": sub_token("news", 60)}),
        )
        .await;
    assert_eq!(error_code(&r), 107, "{r}");
    // A good refresh extends one of them.
    let r = alice
        .call(
            "sub_refresh",
            json!({"channel": "priv:kept", "token": sub_token("priv:kept", 60)}),
        )
        .await;
    let expires_in = r["sub_refresh"]["expires_in"].as_u64().expect("expires_in");
    assert!((58..=60).contains(&expires_in), "{r}");

    // The other ends at its token's expiry, alone: unsub 4004, the connection stays.
    let unsub = alice.push("unsub").await;
    assert_eq!(unsub["channel"], "priv:short", "{unsub}");
    assert_eq!(unsub["code"], 4004, "{unsub}");
    node.publish("priv:short", json!("gone")).await;
    node.publish("priv:kept", json!("still here")).await;
    let p = alice.push("pub").await;
    assert_eq!(
        (p["channel"].as_str(), &p["data"]),
        (Some("priv:kept"), &json!("still here"))
    );
    assert_usable(&mut alice, "news").await;
}

#[tokio::test]
async fn authenticated_namespace_refuses_anonymous() {
    let node = permissions_node().await;
    let mut anon = node.client().await;
    let r = anon.call("connect", json!({})).await;
    assert!(r.get("connect").is_some(), "anonymous connect allowed: {r}");
    let r = anon
        .call("subscribe", json!({"channel": "members:x"}))
        .await;
    assert_eq!(error_code(&r), 103, "{r}");
    let r = anon.call("subscribe", json!({"channel": "news"})).await;
    assert_eq!(
        error_code(&r),
        103,
        "default namespace is authenticated: {r}"
    );
    // Reading what one may not subscribe to is refused as well.
    let r = anon.call("history", json!({"channel": "members:x"})).await;
    assert_eq!(error_code(&r), 103, "{r}");
    let r = anon.call("subscribe", json!({"channel": "ro:x"})).await;
    assert!(r.get("subscribe").is_some(), "anonymous namespace: {r}");

    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let r = alice
        .call("subscribe", json!({"channel": "members:x"}))
        .await;
    assert!(r.get("subscribe").is_some(), "{r}");
}

#[tokio::test]
async fn user_limited_channels_admit_only_their_users() {
    let node = permissions_node().await;
    let channel = "dm:chat#alice,bob";
    let (mut alice, _) = connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let (mut bob, _) = connect_with(&node, &token(json!({"sub": "bob"})), json!({})).await;
    let (mut eve, _) = connect_with(&node, &token(json!({"sub": "eve"})), json!({})).await;
    for c in [&mut alice, &mut bob] {
        let r = c.call("subscribe", json!({"channel": channel})).await;
        assert!(r.get("subscribe").is_some(), "{r}");
    }
    let r = eve.call("subscribe", json!({"channel": channel})).await;
    assert_eq!(error_code(&r), 103, "{r}");
    // Not even through the connection token's channels.
    let (_, r) = connect_with(
        &node,
        &token(json!({"sub": "eve", "channels": [channel]})),
        json!({}),
    )
    .await;
    assert_eq!(r["subs"][channel]["error"]["code"], 103, "{r}");
    // Nor anonymously.
    let mut anon = node.client().await;
    anon.call("connect", json!({})).await;
    let r = anon.call("subscribe", json!({"channel": channel})).await;
    assert_eq!(error_code(&r), 103, "{r}");

    node.publish(channel, json!("psst")).await;
    assert_eq!(alice.push("pub").await["data"], "psst");
    assert_eq!(bob.push("pub").await["data"], "psst");
    assert!(eve.next_within(Duration::from_millis(200)).await.is_none());
}

#[tokio::test]
async fn publish_history_and_presence_switches() {
    let node = permissions_node().await;
    let (mut alice, connected) =
        connect_with(&node, &token(json!({"sub": "alice"})), json!({})).await;
    let alice_id = connected["client"].clone();
    let r = alice.call("subscribe", json!({"channel": "ro:x"})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = alice
        .call("publish", json!({"channel": "ro:x", "data": 1}))
        .await;
    assert_eq!(error_code(&r), 103, "publish = false: {r}");
    let r = alice.call("history", json!({"channel": "ro:x"})).await;
    assert_eq!(error_code(&r), 108, "history = false: {r}");
    let r = alice.call("presence", json!({"channel": "ro:x"})).await;
    assert_eq!(error_code(&r), 108, "presence = false: {r}");

    // Where they are on, the same connection may; its publications name it.
    let r = alice.call("subscribe", json!({"channel": "news"})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = alice
        .call("publish", json!({"channel": "news", "data": 1}))
        .await;
    assert_eq!(r["publish"]["offset"], 1, "{r}");
    let p = alice.push("pub").await;
    assert_eq!(
        p["info"],
        json!({"user": "alice", "client": alice_id}),
        "{p}"
    );
    let r = alice.call("presence", json!({"channel": "news"})).await;
    assert!(r.get("presence").is_some(), "{r}");
    // members: publish is off by default.
    let r = alice
        .call("publish", json!({"channel": "members:x", "data": 1}))
        .await;
    assert_eq!(error_code(&r), 103, "{r}");
    // The API may publish anywhere.
    let (status, body) = node
        .api("/api/publish", Some(json!({"channel": "ro:x", "data": 2})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(alice.push("pub").await["data"], 2);
}
