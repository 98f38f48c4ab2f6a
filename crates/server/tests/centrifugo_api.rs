//! Centrifugo's server HTTP API on a real node (`/centrifugo/api/<method>`, and `/api/<method>`
//! for requests carrying Centrifugo's key headers): replies, error codes and statuses, over raw
//! HTTP. The Centrifugo SDK itself drives it in tests/centrifugo_sdk.rs.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw HTTP request with `headers`; (status, JSON body or the body as a string).
async fn http(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let wait = Duration::from_secs(15);
    let mut stream = tokio::time::timeout(wait, TcpStream::connect(node.addr))
        .await
        .expect("connect timeout")
        .expect("connect");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::time::timeout(wait, stream.write_all(req.as_bytes()))
        .await
        .expect("write timeout")
        .expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(wait, stream.read_to_end(&mut raw))
        .await
        .expect("no answer within 15 s")
        .expect("read");
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (status, value)
}

const KEY: (&str, &str) = ("X-API-Key", API_KEY);

async fn cent(node: &Node, method: &str, body: Value) -> (u16, Value) {
    http(
        node,
        "POST",
        &format!("/centrifugo/api/{method}"),
        &[KEY],
        &body.to_string(),
    )
    .await
}

#[tokio::test]
async fn publish_answers_centrifugo_shapes_and_reaches_subscribers() {
    let node = Node::dev().await;
    let mut sub = node.connected(&["cr"]).await;
    let (status, body) = cent(&node, "publish", json!({"channel": "cr", "data": {"a": 1}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["offset"], 1, "{body}");
    assert!(
        body["result"]["epoch"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    let p = loop {
        let m = sub.next().await;
        if let Some(p) = m.get("pub") {
            break p.clone();
        }
        assert!(m.get("join").is_some(), "unexpected {m}");
    };
    assert_eq!(
        (p["channel"].clone(), p["data"].clone()),
        (json!("cr"), json!({"a": 1}))
    );

    // Authorization: apikey, on Herald's /api path: answered in Centrifugo's shape.
    let auth = format!("apikey {API_KEY}");
    let (status, body) = http(
        &node,
        "POST",
        "/api/publish",
        &[("Authorization", &auth)],
        r#"{"channel":"cr","data":2,"skip_history":false,"tags":{},"delta":true}"#,
    )
    .await;
    assert_eq!(
        (status, body["result"]["offset"].clone()),
        (200, json!(2)),
        "{body}"
    );
    // Herald's own API on the same path is unchanged.
    let (status, body) = node
        .api("/api/publish", Some(json!({"channel": "cr", "data": 3})))
        .await;
    assert_eq!((status, body["offset"].clone()), (200, json!(3)), "{body}");
    assert!(body.get("result").is_none(), "{body}");

    // Broadcast: one response per channel, a bad one failing alone.
    let (status, body) = cent(
        &node,
        "broadcast",
        json!({"channels": ["cr", "nope:x"], "data": 4}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let r = &body["result"]["responses"];
    assert_eq!(r[0]["result"]["offset"], 4, "{body}");
    assert_eq!(r[1]["error"]["code"], 102, "{body}");

    // Idempotency: the same key answers the earlier position.
    let b = json!({"channel": "cr", "data": 5, "idempotency_key": "same"});
    let (_, first) = cent(&node, "publish", b.clone()).await;
    let (_, again) = cent(&node, "publish", b).await;
    assert_eq!(first["result"], again["result"]);
    let (_, h) = cent(&node, "history", json!({"channel": "cr", "limit": -1})).await;
    let offsets: Vec<u64> = h["result"]["publications"]
        .as_array()
        .unwrap_or_else(|| panic!("{h}"))
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [1, 2, 3, 4, 5], "{h}");

    // history_remove: the publications go, the stream's position stays and the next one
    // continues it; an unknown field or namespace is refused.
    let (status, body) = cent(&node, "history_remove", json!({"channel": "cr"})).await;
    assert_eq!((status, body["result"].clone()), (200, json!({})), "{body}");
    let (_, h) = cent(&node, "history", json!({"channel": "cr", "limit": -1})).await;
    assert_eq!(h["result"]["publications"], json!([]), "{h}");
    assert_eq!(h["result"]["offset"], 5, "{h}");
    let (_, body) = cent(&node, "publish", json!({"channel": "cr", "data": 6})).await;
    assert_eq!(body["result"]["offset"], 6, "{body}");
    let (_, body) = cent(&node, "history_remove", json!({"channel": "cr", "x": 1})).await;
    assert_eq!(body["error"]["code"], 107, "{body}");
    let (_, body) = cent(&node, "history_remove", json!({"channel": "nope:x"})).await;
    assert_eq!(body["error"]["code"], 102, "{body}");
}

#[tokio::test]
async fn errors_have_centrifugo_codes_and_statuses() {
    let node = Node::dev().await;
    let publish = r#"{"channel":"c","data":1}"#;

    // No key, a wrong key: 401.
    let (status, body) = http(&node, "POST", "/centrifugo/api/publish", &[], publish).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!(101)),
        "{body}"
    );
    let (status, _) = http(
        &node,
        "POST",
        "/centrifugo/api/publish",
        &[("X-API-Key", "wrong")],
        publish,
    )
    .await;
    assert_eq!(status, 401);
    let (status, body) = http(
        &node,
        "POST",
        "/api/publish",
        &[("Authorization", "apikey zqx-wrong")],
        publish,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!(101)),
        "{body}"
    );
    assert!(
        !body.to_string().contains("zqx"),
        "the key is echoed: {body}"
    );

    // Herald's Bearer key works on the compatibility path.
    let bearer = format!("Bearer {API_KEY}");
    let (status, body) = http(
        &node,
        "POST",
        "/centrifugo/api/publish",
        &[("Authorization", &bearer)],
        publish,
    )
    .await;
    assert_eq!(
        (status, body["result"]["offset"].clone()),
        (200, json!(1)),
        "{body}"
    );

    // Unknown method: 404, code 104. A Centrifugo method Herald lacks: 108 with the reason.
    let (status, body) = cent(&node, "frobnicate", json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!(104)),
        "{body}"
    );
    let (status, body) = cent(&node, "refresh", json!({"user": "u"})).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (200, json!(108)),
        "{body}"
    );

    // Malformed JSON: 400.
    let (status, body) = http(&node, "POST", "/centrifugo/api/publish", &[KEY], "{nope").await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (400, json!(107)),
        "{body}"
    );
    // GET: 405.
    let (status, _) = http(&node, "GET", "/centrifugo/api/info", &[KEY], "").await;
    assert_eq!(status, 405);

    // Fields Herald cannot honour, set: 107 naming them (HTTP 200, Centrifugo's default mode).
    for (body, field) in [
        (
            json!({"channel": "c", "data": 1, "tags": {"": "v"}}),
            "tags",
        ),
        (json!({"channel": "c", "data": 1, "version": 2}), "version"),
        (json!({"channel": "c", "b64data": "AAEC"}), "b64data"),
        (
            json!({"channel": "c", "data": 1, "colour": "red"}),
            "colour",
        ),
        (
            json!({"channel": "c", "data": 1, "idempotency_key": "has space"}),
            "idempotency_key",
        ),
    ] {
        let (status, reply) = cent(&node, "publish", body.clone()).await;
        assert_eq!(status, 200, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], 107, "{body}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {reply}");
    }
    let (_, reply) = cent(
        &node,
        "subscribe",
        json!({"user": "u", "channel": "c", "client": "x"}),
    )
    .await;
    assert_eq!(reply["error"]["code"], 107, "{reply}");
    let (_, reply) = cent(
        &node,
        "disconnect",
        json!({"user": "u", "whitelist": ["x"]}),
    )
    .await;
    assert_eq!(reply["error"]["code"], 107, "{reply}");

    // Unknown namespace: 102; with X-Centrifugo-Error-Mode: transport, a status and a bare error.
    let body = r#"{"channel":"nope:x","data":1}"#;
    let (status, reply) = http(&node, "POST", "/centrifugo/api/publish", &[KEY], body).await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (200, json!(102)),
        "{reply}"
    );
    let (status, reply) = http(
        &node,
        "POST",
        "/centrifugo/api/publish",
        &[KEY, ("X-Centrifugo-Error-Mode", "transport")],
        body,
    )
    .await;
    assert_eq!(
        (status, reply["code"].clone()),
        (404, json!(102)),
        "{reply}"
    );

    // History from a position no longer held: 112.
    let (_, reply) = cent(
        &node,
        "history",
        json!({"channel": "c", "limit": 5, "since": {"offset": 1, "epoch": "gone"}}),
    )
    .await;
    assert_eq!(reply["error"]["code"], 112, "{reply}");

    // A batch answers each command in order, errors in place.
    let (status, reply) = cent(
        &node,
        "batch",
        json!({"commands": [
            {"publish": {"channel": "c", "data": 9}},
            {"publish": {"channel": "nope:x", "data": 9}},
            {"info": {}},
        ], "parallel": true}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    // Not wrapped in "result": Centrifugo's batch reply is the replies themselves.
    let replies = &reply["replies"];
    assert_eq!(replies[0]["publish"]["offset"], 2, "{reply}");
    assert_eq!(replies[1]["error"]["code"], 102, "{reply}");
    let name = replies[2]["info"]["nodes"][0]["name"]
        .as_str()
        .unwrap_or_default();
    assert!(name.starts_with("herald-"), "{reply}");
}

#[tokio::test]
async fn disconnect_and_server_side_subscribe_reach_the_connections() {
    let node = Node::dev().await;
    let mut alice = node.client().await;
    let t = token(json!({"sub": "alice"}));
    let r = alice.call("connect", json!({"token": t})).await;
    assert!(r["connect"]["client"].is_string(), "{r}");
    let (_, reply) = cent(
        &node,
        "subscribe",
        json!({"user": "alice", "channel": "srv"}),
    )
    .await;
    assert_eq!(reply["result"], json!({}), "{reply}");
    let s = alice.push("subscribe").await;
    assert_eq!(s["channel"], "srv");
    let (_, reply) = cent(
        &node,
        "disconnect",
        json!({"user": "alice", "disconnect": {"code": 4501, "reason": "bye"}}),
    )
    .await;
    assert_eq!(reply["result"], json!({}), "{reply}");
    let closed = alice.closed().await;
    assert_eq!(closed.code, Some(4501), "{closed:?}");
    let (_, reply) = cent(
        &node,
        "disconnect",
        json!({"user": "a", "disconnect": {"code": 99}}),
    )
    .await;
    assert_eq!(reply["error"]["code"], 107, "{reply}");
}
