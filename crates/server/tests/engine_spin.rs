//! A connection whose command waits (here on a slow rpc hook) while a control is queued for it
//! must wait, not spin: `Herald::dispatch_writing` woke on the queue, `drain_frames` handed it an
//! empty batch, and `written` woke it again for the control it may not touch yet, forever. Two
//! such connections took both of a 2-worker node's threads: nothing polled the sockets or the
//! timers any more, so the commands never ended and the node stopped answering for good (the NATS
//! chaos soak's "the cluster never came back").

use std::time::Duration;

use herald_testkit::hooks::HookBackend;
use herald_testkit::node::{config_file, token, Node};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_queued_during_slow_commands_do_not_starve_the_node() {
    let backend = HookBackend::start().await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            "[proxy]\nrpc_url = {:?}\ntimeout_ms = 5000\n",
            backend.url("rpc")
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let mut clients = Vec::new();
    for user in ["u1", "u2"] {
        let mut c = node.client().await;
        let r = c
            .call("connect", json!({"token": token(json!({"sub": user}))}))
            .await;
        assert!(r.get("connect").is_some(), "{r}");
        clients.push(c);
    }
    // Each connection's command now waits 2 s for the backend...
    let mut calls = Vec::new();
    for c in &mut clients {
        calls.push(c.send("rpc", json!({"method": "slow"})).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...while a control (a server-side subscription) is queued for each.
    for user in ["u1", "u2"] {
        let body = json!({"user": user, "channel": "news"});
        let answer = tokio::time::timeout(
            Duration::from_secs(1),
            node.try_http("POST", "/api/subscribe", Some(body)),
        )
        .await;
        assert!(
            matches!(answer, Ok(Ok((200, _)))),
            "API subscribe for {user} while the calls wait: {answer:?}"
        );
    }
    let health = tokio::time::timeout(
        Duration::from_secs(1),
        node.try_http("GET", "/health", None),
    )
    .await;
    assert!(
        matches!(health, Ok(Ok((200, _)))),
        "the node stopped answering while two commands waited with controls queued: {health:?}"
    );
    for (c, id) in clients.iter_mut().zip(calls) {
        let r = c.reply(id).await;
        assert_eq!(r["rpc"]["data"]["method"], "slow", "{r}");
    }
}
