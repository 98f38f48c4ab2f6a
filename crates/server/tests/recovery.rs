//! The guarantee: every publication exactly once, in order, across drops and while publications
//! race the subscribe; or a plain `recovered: false`.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Collect the offsets of `pub` pushes for `channel` from a subscribe result and what follows,
/// until `last` is seen.
async fn offsets_until(c: &mut Client, channel: &str, mut seen: Vec<u64>, last: u64) -> Vec<u64> {
    while seen.last().copied().unwrap_or(0) < last {
        let m = c.next().await;
        if let Some(p) = m.get("pub") {
            if p["channel"] == channel {
                seen.push(p["offset"].as_u64().unwrap());
            }
        }
    }
    seen
}

fn recovered_offsets(sub: &Value) -> Vec<u64> {
    sub["publications"]
        .as_array()
        .map(|a| a.iter().map(|p| p["offset"].as_u64().unwrap()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn dropped_client_recovers_everything_exactly_once() {
    let node = Node::dev().await;
    let total = 300u64;
    let publisher = {
        let api = node.api_handle();
        tokio::spawn(async move {
            for i in 1..=total {
                api.publish("stream", json!({"i": i})).await;
                // Paced: publications keep coming while the client is away and back.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let mut received: Vec<u64> = Vec::new();
    let mut position: Option<(Value, u64)> = None;
    for round in 0..3 {
        let mut c = node.client().await;
        let subs = match &position {
            None => json!({"stream": {}}),
            Some((epoch, offset)) => {
                json!({"stream": {"since": {"epoch": epoch, "offset": offset}}})
            }
        };
        let r = c.call("connect", json!({ "subs": subs })).await;
        let sub = r["connect"]["subs"]["stream"].clone();
        if position.is_some() {
            assert_eq!(sub["recovered"], true, "round {round}: {sub}");
            received.extend(recovered_offsets(&sub));
        } else {
            received.extend(1..=sub["offset"].as_u64().unwrap());
        }
        // Read live publications for a while, then drop the TCP connection for over 2 s.
        let until = tokio::time::Instant::now() + Duration::from_millis(700);
        while tokio::time::Instant::now() < until {
            if let Some(m) = c.next_within(Duration::from_millis(50)).await {
                if let Some(p) = m.get("pub") {
                    received.push(p["offset"].as_u64().unwrap());
                }
            }
        }
        position = Some((sub["epoch"].clone(), *received.last().unwrap_or(&0)));
        drop(c);
        // Away for over 2 s (the point): publications pile up for the recovery to bring back.
        tokio::time::sleep(Duration::from_millis(2100)).await;
    }
    herald_testkit::joined(publisher, Duration::from_secs(120), "the publisher").await;
    let (epoch, offset) = position.unwrap();
    let mut c = node.client().await;
    let r = c
        .call(
            "connect",
            json!({"subs": {"stream": {"since": {"epoch": epoch, "offset": offset}}}}),
        )
        .await;
    let sub = &r["connect"]["subs"]["stream"];
    assert_eq!(sub["recovered"], true);
    received.extend(recovered_offsets(sub));
    assert_eq!(
        received,
        (1..=total).collect::<Vec<_>>(),
        "every publication exactly once, in order"
    );
}

#[tokio::test]
async fn publications_racing_the_subscribe_are_neither_lost_nor_doubled() {
    let node = Node::dev().await;
    let total = 400u64;
    let addr = node.addr;
    let api = node.api_handle();
    let publisher = tokio::spawn(async move {
        for i in 1..=total {
            api.publish("race", json!(i)).await;
        }
    });
    // Subscribers join at different moments, half fresh, half recovering from a recent offset.
    let mut joins = Vec::new();
    for k in 0..12u64 {
        let node_addr = addr;
        joins.push(tokio::spawn(async move {
            // Staggered on purpose: each joins at another point of the publishing.
            tokio::time::sleep(Duration::from_millis(15 * k)).await;
            let mut c = Client::open(node_addr, &[]).await;
            c.call("connect", json!({})).await;
            let mut params = json!({"channel": "race"});
            if k % 2 == 1 {
                // Learn the epoch and a recent offset, then recover from there.
                let h = c
                    .call("history", json!({"channel": "race", "limit": 0}))
                    .await;
                let from = h["history"]["offset"].as_u64().unwrap().saturating_sub(3);
                params["since"] = json!({"epoch": h["history"]["epoch"], "offset": from});
            }
            let r = c.call("subscribe", params.clone()).await;
            let sub = r["subscribe"].clone();
            let start: Vec<u64> = match params.get("since") {
                Some(s) => {
                    assert_eq!(sub["recovered"], true, "{sub}");
                    let mut v: Vec<u64> = (1..=s["offset"].as_u64().unwrap()).collect();
                    v.extend(recovered_offsets(&sub));
                    v
                }
                None => (1..=sub["offset"].as_u64().unwrap()).collect(),
            };
            offsets_until(&mut c, "race", start, total).await
        }));
    }
    herald_testkit::joined(publisher, Duration::from_secs(120), "the publisher").await;
    for j in joins {
        let got = herald_testkit::joined(j, Duration::from_secs(120), "a subscriber").await;
        assert_eq!(got, (1..=total).collect::<Vec<_>>());
    }
}

#[tokio::test]
async fn recovery_is_refused_when_history_lost_the_gap_or_the_epoch_differs() {
    let cfg = config_file(
        "herald.toml",
        r#"
        allow_anonymous = true
        [default_namespace]
        subscribe = "anonymous"
        history_size = 3
        "#,
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let mut epoch = Value::Null;
    for i in 1..=10 {
        epoch = node.publish("small", json!(i)).await["epoch"].clone();
    }
    let mut c = node.client().await;
    c.call("connect", json!({})).await;
    let r = c
        .call(
            "subscribe",
            json!({"channel": "small", "since": {"epoch": epoch, "offset": 2}}),
        )
        .await;
    let sub = &r["subscribe"];
    assert_eq!(sub["recovered"], false);
    assert_eq!(sub["publications"], json!([]), "never partial");
    assert_eq!(sub["offset"], 10);

    c.call("unsubscribe", json!({"channel": "small"})).await;
    let r = c
        .call(
            "subscribe",
            json!({"channel": "small", "since": {"epoch": epoch, "offset": 7}}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true);
    assert_eq!(recovered_offsets(&r["subscribe"]), vec![8, 9, 10]);

    c.call("unsubscribe", json!({"channel": "small"})).await;
    let r = c
        .call(
            "subscribe",
            json!({"channel": "small", "since": {"epoch": "other", "offset": 9}}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], false);
}

/// A recovery the node allows is delivered, however close it comes to the outbound queue's
/// bound: with join/leave on (as in `--dev`) the client's own join push lands right behind a
/// reply of 1.2 MB (the queue holds 1 MiB), and that once closed the connection as a slow
/// consumer (4001) on every reconnect, forever.
#[tokio::test]
async fn a_large_recovery_with_join_leave_on_is_delivered_not_closed_4001() {
    let node = Node::dev().await;
    let channels = ["big1", "big2", "big3"];
    let mut c = node.client().await;
    let subs: serde_json::Map<String, Value> = channels
        .iter()
        .map(|ch| (ch.to_string(), json!({})))
        .collect();
    let r = c.call("connect", json!({ "subs": subs })).await;
    let epochs: Vec<Value> = channels
        .iter()
        .map(|ch| r["connect"]["subs"][ch]["epoch"].clone())
        .collect();
    drop(c);

    // 40 publications of 10 KB on each channel: 1.2 MB missed in all, under the 4 MiB budget.
    let blob = "x".repeat(10_000);
    for ch in channels {
        for i in 0..40 {
            node.publish(ch, json!({ "i": i, "blob": blob })).await;
        }
    }
    for round in 0..3u64 {
        let mut c = node.client().await;
        let subs: serde_json::Map<String, Value> = channels
            .iter()
            .zip(&epochs)
            .map(|(ch, e)| {
                (
                    ch.to_string(),
                    json!({ "since": { "epoch": e, "offset": 0 } }),
                )
            })
            .collect();
        let id = c.send("connect", json!({ "subs": subs })).await;
        let r = c.reply(id).await;
        for ch in channels {
            let sub = &r["connect"]["subs"][ch];
            assert_eq!(sub["recovered"], true, "round {round}, {ch}: {sub}");
            // Each round's live publication on big1 joins the history the next one recovers.
            let last = if ch == "big1" { 40 + round } else { 40 };
            assert_eq!(recovered_offsets(sub), (1..=last).collect::<Vec<u64>>());
        }
        // Still open: a live publication arrives after the joins.
        node.publish("big1", json!({ "live": round })).await;
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), c.next_or_closed())
                .await
                .unwrap_or_else(|_| panic!("round {round}: no live publication in 10 s"));
            let Some(m) = m else {
                panic!(
                    "round {round}: closed after the recovery, code {:?}",
                    c.closed().await.code
                );
            };
            if m["pub"]["data"]["live"] == round {
                break;
            }
        }
    }
}
