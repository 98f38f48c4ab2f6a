//! Hostile input that once crashed a handler, wedged a channel or leaked internals: each case
//! gets a clear error, and the node keeps serving everyone else.

mod common;

use common::*;
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
