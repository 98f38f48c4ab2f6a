//! Issue 29 item 5: a broker that comes back from an older snapshot while one node's link is
//! down, and a second node that never saw the channel publishes first. No node may continue the
//! rolled-back stream in its old epoch, so the live subscriber on the first node is told and a
//! client recovering from the newest position it got is told `recovered: false`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::proxy::Proxy;
use super::{unique, BrokerProcess};
use crate::eventually_ok;
use crate::node::Node;

/// Publish through `node`, retrying while it answers 503 (its broker link is reconnecting).
async fn publish_when_back(node: &Node, ch: &str, data: Value) -> Value {
    eventually_ok(
        Duration::from_secs(20),
        &format!("a publication on {} accepted (the broker back)", node.name),
        || async {
            let (status, body) = node.try_publish(ch, data.clone(), None).await;
            if status == 200 {
                return Ok(body);
            }
            assert_eq!(status, 503, "only 'unavailable' while reconnecting: {body}");
            Err(format!("{status}: {body}"))
        },
    )
    .await
}

/// Node A (through a cuttable proxy) publishes offsets 1–10; the broker is killed and started
/// from a snapshot taken at offset 5 while A's link is down; node B, which never saw the channel,
/// publishes 8 more; A's link comes back 3 s later. `extra_env` goes to both nodes.
pub async fn rollback_with_a_second_node_is_never_continued_in_the_old_epoch(
    broker: &mut dyn BrokerProcess,
    extra_env: &[(&str, &str)],
) {
    let proxy = Proxy::start(broker.addr()).await;
    let a = Node::on_broker_with("a", &broker.url_via(proxy.addr), extra_env).await;
    let b = Node::on_broker_with("b", &broker.url(), extra_env).await;
    let ch = unique("rolled");
    let mut live = a.subscriber(json!({ &ch: {} })).await;
    let epoch = live.connect_reply["subs"][&ch]["epoch"].clone();
    for i in 1..=5 {
        let p = a.publish(&ch, json!(i)).await;
        assert_eq!((&p["epoch"], &p["offset"]), (&epoch, &json!(i)), "{p}");
    }
    assert!(broker.snapshot(), "this broker keeps no snapshots");
    for i in 6..=10 {
        let p = a.publish(&ch, json!(i)).await;
        assert_eq!((&p["epoch"], &p["offset"]), (&epoch, &json!(i)), "{p}");
    }
    assert_eq!(
        live.offsets(&ch, 10, Duration::from_secs(5)).await,
        (1..=10).collect::<Vec<_>>()
    );

    // A's link goes down; the broker comes back holding offset 5 as the channel's top.
    proxy.cut();
    broker.restart_from_snapshot();
    let mut from_b = Vec::new();
    for i in 11..=18 {
        from_b.push(publish_when_back(&b, &ch, json!(i)).await);
    }
    for p in &from_b {
        assert_ne!(
            p["epoch"], epoch,
            "B continued the rolled-back stream in its old epoch: {from_b:?}"
        );
    }
    // A stays cut off for 3 s (the scenario): its link comes back well after B has published in
    // the new epoch, its reconnect attempts refused meanwhile; no state of A's marks that point.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.restore();

    // The live subscriber on A is told (unsub 4003, or a close 4003), never handed B's
    // publications as if nothing was missing.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let Some(m) = live.next_within(Duration::from_millis(200)).await else {
            if let Some(code) = live.close_code {
                assert_eq!(code, 4003, "closed, but not with 4003");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the subscriber on A was never told"
            );
            continue;
        };
        if m["pub"]["channel"] == ch.as_str() {
            panic!("a publication after the rollback without being told first: {m}");
        }
        if m["unsub"]["channel"] == ch.as_str() {
            assert_eq!(m["unsub"]["code"], 4003, "{m}");
            break;
        }
    }

    // A client that holds (E, 10) recovers on either node: it is told it cannot.
    // A node whose subscription link is still reconnecting answers 111 (retryable); a real
    // client retries, so the test does too.
    for node in [&a, &b] {
        let c = eventually_ok(
            Duration::from_secs(15),
            &format!(
                "a recovery on {} answered other than 111 (its link back)",
                node.name
            ),
            || async {
                let c = node
                    .subscriber(json!({ &ch: {"since": {"epoch": epoch, "offset": 10}} }))
                    .await;
                if c.connect_reply["subs"][&ch]["error"]["code"] != 111 {
                    Ok(c)
                } else {
                    Err(c.connect_reply.to_string())
                }
            },
        )
        .await;
        let sub = &c.connect_reply["subs"][&ch];
        assert_eq!(sub["recovered"], false, "on {}: {sub}", node.name);
        assert_eq!(sub["epoch"], from_b[0]["epoch"], "on {}: {sub}", node.name);
    }
}
