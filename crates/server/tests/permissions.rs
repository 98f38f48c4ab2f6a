//! One permission point, tried through the doors a client has: a client the subscribe hook
//! refused can neither read nor write the channel (history, presence, publish), over a WebSocket
//! and over WebSocket emulation; a client the hook allowed can, until it unsubscribes. The hook
//! is a real HTTP backend (tests/fixtures/proxy_backend.py: channels containing "deny" are
//! refused with 1403).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use herald_testkit::hooks::HookBackend;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Namespaces whose static rule would admit the client, with the subscribe hook deciding.
async fn node(backend: &HookBackend) -> (Node, ConfigFile) {
    let toml = format!(
        "[proxy]\nsubscribe_url = \"http://127.0.0.1:{}/subscribe\"\ntimeout_ms = 3000\n\
         [[namespaces]]\nname = \"members\"\nsubscribe = \"authenticated\"\nsubscribe_proxy = true\n\
         publish = true\npresence = true\nhistory_size = 10\n\
         [[namespaces]]\nname = \"lobby\"\nsubscribe = \"anonymous\"\nsubscribe_proxy = true\n\
         publish = true\npresence = true\nhistory_size = 10\n",
        backend.port
    );
    let cfg = config_file("herald.toml", &toml);
    let node = Node::start(&["--config", &cfg], &[]).await;
    (node, cfg)
}

fn error_code(reply: &Value) -> Option<u64> {
    reply["error"]["code"].as_u64()
}

/// The commands a client may try on a channel it is not subscribed to.
fn reads_and_writes(channel: &str) -> [(&'static str, Value); 3] {
    [
        ("history", json!({ "channel": channel })),
        ("presence", json!({ "channel": channel })),
        ("publish", json!({ "channel": channel, "data": {"n": 1} })),
    ]
}

#[tokio::test]
async fn a_client_the_subscribe_hook_refused_cannot_read_or_publish_over_websocket() {
    let backend = HookBackend::start().await;
    let (node, _cfg) = node(&backend).await;
    node.publish("members:deny-1", json!({"secret": 1})).await;

    for channel in ["members:deny-1", "lobby:deny-1"] {
        let mut alice = node.client().await;
        let t = token(json!({ "sub": "alice", "exp": now() + 600 }));
        let r = alice.call("connect", json!({ "token": t })).await;
        assert!(r.get("connect").is_some(), "{r}");
        let r = alice.call("subscribe", json!({ "channel": channel })).await;
        assert_eq!(error_code(&r), Some(1403), "the hook refuses: {r}");
        for (method, params) in reads_and_writes(channel) {
            let r = alice.call(method, params).await;
            assert_eq!(
                error_code(&r),
                Some(103),
                "{method} on {channel} after the hook refused: {r}"
            );
        }
        // The same in `connect`'s own `subs` is refused too.
        let mut bob = node.client().await;
        let t = token(json!({ "sub": "bob", "exp": now() + 600 }));
        let r = bob
            .call("connect", json!({ "token": t, "subs": { channel: {} } }))
            .await;
        assert_eq!(
            r["connect"]["subs"][channel]["error"]["code"],
            json!(1403),
            "{r}"
        );
        let r = bob.call("history", json!({ "channel": channel })).await;
        assert_eq!(error_code(&r), Some(103), "{r}");
    }

    // Nothing was published by the refused clients.
    let (status, h) = node
        .api("/api/history", Some(json!({"channel": "members:deny-1"})))
        .await;
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["publications"].as_array().map(Vec::len), Some(1), "{h}");
}

#[tokio::test]
async fn a_subscription_the_hook_allowed_reads_and_writes_until_it_ends() {
    let backend = HookBackend::start().await;
    let (node, _cfg) = node(&backend).await;
    let mut alice = node.client().await;
    let t = token(json!({ "sub": "alice", "exp": now() + 600 }));
    alice.call("connect", json!({ "token": t })).await;

    // Before subscribing, the hook has not spoken: no reading around it.
    let r = alice
        .call("history", json!({ "channel": "members:club" }))
        .await;
    assert_eq!(error_code(&r), Some(103), "{r}");

    let r = alice
        .call("subscribe", json!({ "channel": "members:club" }))
        .await;
    assert!(r.get("subscribe").is_some(), "the hook allows: {r}");
    for (method, params) in reads_and_writes("members:club") {
        let r = alice.call(method, params).await;
        assert!(r.get("error").is_none(), "{method} while subscribed: {r}");
    }
    let r = alice
        .call("unsubscribe", json!({ "channel": "members:club" }))
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let r = alice
        .call("presence", json!({ "channel": "members:club" }))
        .await;
    assert_eq!(error_code(&r), Some(103), "after unsubscribing: {r}");
}

/// The next protocol frame of an emulated connection's SSE stream, within 10 s; pings (`{}`)
/// are skipped (the test is short enough not to need answering them).
async fn next_frame(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("a frame within 10 s")
            .expect("read the stream")
            .expect("the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data).expect("JSON data");
            if v != json!({}) {
                return v;
            }
        }
    }
}

/// POST one message to an emulated session, asserting it was taken.
async fn post(url: &str, body: Value) {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-H", "Content-Type: text/plain", "--data-binary"])
            .arg(body.to_string())
            .arg(url)
            .output(),
    )
    .await
    .expect("POST answered within 10 s")
    .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "204", "POST {body}");
}

#[tokio::test]
async fn a_refused_client_cannot_read_or_publish_over_websocket_emulation() {
    let backend = HookBackend::start().await;
    let (node, _cfg) = node(&backend).await;
    let url = format!("http://{}/connection/emulation", node.addr);
    let mut child = Command::new("curl")
        .args(["-sN", "--no-buffer", "--max-time", "60", &url])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("curl");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let session = next_frame(&mut lines).await;
    let session = session["session"]
        .as_str()
        .expect("the session event")
        .to_owned();
    let post_url = format!("{url}?session={session}");

    let t = token(json!({ "sub": "alice", "exp": now() + 600 }));
    post(&post_url, json!({ "id": 1, "connect": { "token": t } })).await;
    let r = next_frame(&mut lines).await;
    assert!(r.get("connect").is_some(), "{r}");
    post(
        &post_url,
        json!({ "id": 2, "subscribe": { "channel": "members:deny-2" } }),
    )
    .await;
    let r = next_frame(&mut lines).await;
    assert_eq!(
        (r["id"].as_u64(), error_code(&r)),
        (Some(2), Some(1403)),
        "{r}"
    );
    for (i, (method, params)) in reads_and_writes("members:deny-2").into_iter().enumerate() {
        let id = 3 + i as u64;
        post(&post_url, json!({ "id": id, method: params })).await;
        let r = next_frame(&mut lines).await;
        assert_eq!(
            (r["id"].as_u64(), error_code(&r)),
            (Some(id), Some(103)),
            "{method} over emulation after the hook refused: {r}"
        );
    }
}
