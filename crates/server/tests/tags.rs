//! Publication tags and subscription tag filters against the real binary: tags published on the
//! HTTP API (publish, broadcast, Centrifugo's API) reach subscribers in the `pub` push (absent
//! when empty) and come back from history; a subscriber's tag filter (`tf`) lets only matching
//! publications through, live and in recovery, its offsets moving on over the ones it did not
//! get. On the memory broker (one node), on real Redis and real NATS (published on one node,
//! received on another). A namespace without `allow_tags_filter` refuses filters; malformed
//! filters and tags are refused with the reason.

mod common;

use std::time::Duration;

use common::*;
use herald_testkit::nats::NatsServer;
use herald_testkit::redis::RedisServer;
use serde_json::{json, Value};

const ALLOW: (&str, &str) = ("HERALD_DEFAULT_NAMESPACE__ALLOW_TAGS_FILTER", "true");

/// Only goals of the home team, or anything from minute 90 on.
fn goal_filter() -> Value {
    json!({"op": "or", "nodes": [
        {"op": "and", "nodes": [
            {"key": "kind", "cmp": "eq", "val": "goal"},
            {"key": "team", "cmp": "in", "vals": ["home"]}
        ]},
        {"key": "minute", "cmp": "gte", "val": "90"}
    ]})
}

/// The `pub` pushes of `channel` until one with data `{"last": true}` (other pushes skipped;
/// panics after the harness's wait).
async fn pubs_until_last(c: &mut Client, channel: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let m = c.next().await;
        if m["pub"]["channel"] == channel {
            let last = m["pub"]["data"]["last"] == true;
            out.push(m["pub"].clone());
            if last {
                return out;
            }
        }
    }
}

fn datas(pubs: &[Value]) -> Vec<Value> {
    pubs.iter().map(|p| p["data"].clone()).collect()
}

async fn subscribe(node: &Node, params: Value) -> (Client, Value) {
    let mut c = node.client().await;
    c.call("connect", json!({})).await;
    let r = c.call("subscribe", params).await;
    (c, r)
}

/// Publish on `publisher`, receive on `subscriber` (the same node on the memory broker).
async fn tags_reach_subscribers_and_filters_select_them(publisher: &Node, subscriber: &Node) {
    let (mut plain, _) = subscribe(subscriber, json!({"channel": "match"})).await;
    let (mut goals, r) =
        subscribe(subscriber, json!({"channel": "match", "tf": goal_filter()})).await;
    assert!(r["subscribe"]["epoch"].is_string(), "{r}");
    let start = r["subscribe"].clone();

    let sent = [
        (
            json!({"i": 1}),
            json!({"kind": "goal", "team": "home", "minute": "12"}),
        ),
        (
            json!({"i": 2}),
            json!({"kind": "card", "team": "home", "minute": "30"}),
        ),
        (json!({"i": 3}), json!({})),
        (
            json!({"i": 4}),
            json!({"kind": "goal", "team": "away", "minute": "55"}),
        ),
    ];
    for (data, tags) in &sent {
        let (status, body) = publisher
            .api(
                "/api/publish",
                Some(json!({"channel": "match", "data": data, "tags": tags})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // Centrifugo's API takes the same tags.
    let (status, body) = publisher
        .api(
            "/centrifugo/api/publish",
            Some(json!({"channel": "match", "data": {"i": 5}, "tags": {"kind": "card", "minute": "91"}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = publisher
        .api(
            "/api/broadcast",
            Some(
                json!({"channels": ["match", "other"], "data": {"last": true},
                        "tags": {"kind": "goal", "team": "home"}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let all = pubs_until_last(&mut plain, "match").await;
    assert_eq!(all.len(), 6, "{all:?}");
    assert_eq!(all[0]["tags"], sent[0].1, "{all:?}");
    assert!(
        all[2].get("tags").is_none(),
        "no tags: no field, as before tags existed: {}",
        all[2]
    );
    assert_eq!(all[4]["tags"], json!({"kind": "card", "minute": "91"}));
    assert_eq!(all[5]["tags"], json!({"kind": "goal", "team": "home"}));

    let got = pubs_until_last(&mut goals, "match").await;
    assert_eq!(
        datas(&got),
        [json!({"i": 1}), json!({"i": 5}), json!({"last": true})],
        "only matching publications: {got:?}"
    );
    let offsets: Vec<u64> = got.iter().map(|p| p["offset"].as_u64().unwrap()).collect();
    let first = start["offset"].as_u64().unwrap();
    assert_eq!(
        offsets,
        [first + 1, first + 5, first + 6],
        "the stream's own offsets"
    );

    // History keeps the tags.
    let (status, h) = publisher
        .api("/api/history", Some(json!({"channel": "match"})))
        .await;
    assert_eq!(status, 200, "{h}");
    let pubs = h["publications"].as_array().expect("publications");
    assert_eq!(pubs.len(), 6, "{h}");
    assert_eq!(pubs[0]["tags"], sent[0].1, "{h}");
    assert!(pubs[2].get("tags").is_none(), "{h}");
    assert_eq!(pubs[3]["tags"], sent[3].1, "{h}");

    // Recovery from the filtered subscriber's start: only what the filter lets through, and the
    // reply's position is the stream's, past what was left out.
    let since = json!({"epoch": start["epoch"], "offset": first});
    let (_, r) = subscribe(
        subscriber,
        json!({"channel": "match", "since": since, "tf": goal_filter()}),
    )
    .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    let recovered = r["subscribe"]["publications"]
        .as_array()
        .expect("publications");
    assert_eq!(
        datas(recovered),
        [json!({"i": 1}), json!({"i": 5}), json!({"last": true})],
        "{r}"
    );
    assert_eq!(recovered[0]["tags"], sent[0].1, "{r}");
    assert_eq!(r["subscribe"]["offset"], first + 6, "{r}");
    // Unfiltered recovery gets everything.
    let (_, r) = subscribe(subscriber, json!({"channel": "match", "since": since})).await;
    assert_eq!(
        r["subscribe"]["publications"].as_array().map(Vec::len),
        Some(6),
        "{r}"
    );
}

#[tokio::test]
async fn tags_and_filters_on_the_memory_broker() {
    let node = Node::start(&["--dev"], &[ALLOW]).await;
    tags_reach_subscribers_and_filters_select_them(&node, &node).await;
}

#[tokio::test]
async fn tags_and_filters_across_two_nodes_on_redis() {
    let redis = RedisServer::start();
    let a = Node::on_broker_with("a", &redis.url(), &[ALLOW]).await;
    let b = Node::on_broker_with("b", &redis.url(), &[ALLOW]).await;
    tags_reach_subscribers_and_filters_select_them(&a, &b).await;
}

#[tokio::test]
async fn tags_and_filters_across_two_nodes_on_nats() {
    let nats = NatsServer::start();
    let a = Node::on_broker_with("a", &nats.url(), &[ALLOW]).await;
    let b = Node::on_broker_with("b", &nats.url(), &[ALLOW]).await;
    tags_reach_subscribers_and_filters_select_them(&a, &b).await;
}

/// A client's own publication carries tags too; a filter on it selects as on API publications.
#[tokio::test]
async fn client_publications_carry_tags() {
    let node = Node::start(
        &["--dev"],
        &[ALLOW, ("HERALD_DEFAULT_NAMESPACE__PUBLISH", "true")],
    )
    .await;
    let (mut filtered, _) = subscribe(
        &node,
        json!({"channel": "room", "tf": {"key": "to", "cmp": "eq", "val": "me"}}),
    )
    .await;
    let mut publisher = node.client().await;
    publisher.call("connect", json!({})).await;
    for (data, tags) in [
        (json!({"i": 1}), json!({"to": "you"})),
        (json!({"last": true}), json!({"to": "me"})),
    ] {
        let r = publisher
            .call(
                "publish",
                json!({"channel": "room", "data": data, "tags": tags}),
            )
            .await;
        assert!(r.get("error").is_none(), "{r}");
    }
    let got = pubs_until_last(&mut filtered, "room").await;
    assert_eq!(datas(&got), [json!({"last": true})], "{got:?}");
    assert_eq!(got[0]["tags"], json!({"to": "me"}));
    let r = publisher
        .call(
            "publish",
            json!({"channel": "room", "data": 1, "tags": {"": "x"}}),
        )
        .await;
    assert_eq!(r["error"]["code"], 107, "{r}");
}

#[tokio::test]
async fn filters_are_refused_where_not_allowed_and_when_malformed() {
    let cfg = config_file(
        "herald.toml",
        r#"
        [default_namespace]
        allow_tags_filter = true
        [[namespaces]]
        name = "plain"
        subscribe = "anonymous"
        "#,
    );
    let node = Node::start(&["--dev", "--config", &cfg], &[]).await;
    let (_, r) = subscribe(
        &node,
        json!({"channel": "plain:x", "tf": {"key": "k", "cmp": "ex"}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 108, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allow_tags_filter"),
        "{r}"
    );
    let mut deep = json!({"key": "k", "cmp": "ex"});
    for _ in 0..8 {
        deep = json!({"op": "not", "nodes": [deep]});
    }
    for (tf, reason) in [
        (
            json!({"key": "k", "cmp": "like", "val": "x"}),
            "unknown cmp",
        ),
        (json!({"op": "xor", "nodes": []}), "unknown op"),
        (
            json!({"key": "k", "cmp": "lt", "val": "ten"}),
            "needs a number",
        ),
        (
            json!({"key": "k", "cmp": "in", "val": "x"}),
            "takes \"vals\"",
        ),
        (deep, "deeper"),
    ] {
        let (_, r) = subscribe(&node, json!({"channel": "x", "tf": tf})).await;
        assert_eq!(r["error"]["code"], 107, "{r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message}");
    }
    // A field the filter grammar does not have is a bad request too.
    let (_, r) = subscribe(
        &node,
        json!({"channel": "x", "tf": {"key": "k", "cmp": "ex", "value": "x"}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 107, "{r}");
    // Where allowed and well formed, the subscription stands.
    let (_, r) = subscribe(
        &node,
        json!({"channel": "x", "tags_filter": {"key": "k", "cmp": "ex"}}),
    )
    .await;
    assert!(r["subscribe"]["epoch"].is_string(), "{r}");

    // Tags over the bounds, or not string→string, are refused on the API.
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    for tags in [Value::Object(many), json!({"k": 1}), json!({"": "v"})] {
        let (status, body) = node
            .api(
                "/api/publish",
                Some(json!({"channel": "plain:x", "data": 1, "tags": tags})),
            )
            .await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (400, &json!(107)),
            "{body}"
        );
    }
    // Nothing was published by the refused requests.
    let (_, h) = node
        .api("/api/history", Some(json!({"channel": "plain:x"})))
        .await;
    assert_eq!(h["offset"], 0, "{h}");
}

/// With no subscriber's filter set, fan-out is unchanged: a filter on one subscriber does not
/// hold back another's publications (both get them promptly, in order).
#[tokio::test]
async fn a_filtered_subscriber_beside_plain_ones_changes_nothing_for_them() {
    let node = Node::start(&["--dev"], &[ALLOW]).await;
    let (mut plain, _) = subscribe(&node, json!({"channel": "c"})).await;
    let (mut none_match, _) = subscribe(
        &node,
        json!({"channel": "c", "tf": {"key": "never", "cmp": "ex"}}),
    )
    .await;
    for i in 0..20 {
        node.publish("c", json!({ "i": i })).await;
    }
    node.publish("c", json!({"last": true})).await;
    assert_eq!(pubs_until_last(&mut plain, "c").await.len(), 21);
    while let Some(m) = none_match.next_within(Duration::from_millis(300)).await {
        assert!(
            m.get("pub").is_none(),
            "a filter that matches nothing gets nothing: {m}"
        );
    }
}

/// `skip_history` on a channel with history: the publication reaches live subscribers (its push
/// has no offset), the API answers no position, history does not hold it, and the stream's
/// offsets run on without a hole, so recovery and a plain subscriber's order are unaffected.
/// `ordered`: the broker keeps it in publish order with stored ones (not NATS, where it travels
/// outside the stream).
async fn skip_history_is_live_only(publisher: &Node, subscriber: &Node, ordered: bool) {
    let (mut live, r) = subscribe(subscriber, json!({"channel": "room"})).await;
    let start = r["subscribe"].clone();
    let first = start["offset"].as_u64().unwrap();
    publisher.publish("room", json!({"i": 1})).await;
    let (status, body) = publisher
        .api(
            "/api/publish",
            Some(
                json!({"channel": "room", "data": {"typing": true}, "skip_history": true,
                        "tags": {"kind": "typing"}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"epoch": "", "offset": 0}), "no position");
    // Centrifugo's API and its field name: the same.
    let (status, body) = publisher
        .api(
            "/centrifugo/api/publish",
            Some(json!({"channel": "room", "data": {"typing": false}, "skip_history": true})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("error").is_none(), "{body}");
    publisher.publish("room", json!({"last": true})).await;

    let mut got = pubs_until_last(&mut live, "room").await;
    if !ordered {
        // The unstored ones may overtake; wait for any still missing, then compare as sets.
        while got.iter().filter(|p| p.get("offset").is_none()).count() < 2 {
            let m = live.next().await;
            if m["pub"]["channel"] == "room" {
                got.push(m["pub"].clone());
            }
        }
    }
    let unstored: Vec<&Value> = got.iter().filter(|p| p.get("offset").is_none()).collect();
    assert_eq!(unstored.len(), 2, "{got:?}");
    assert_eq!(unstored[0]["tags"], json!({"kind": "typing"}), "{got:?}");
    let stored: Vec<u64> = got.iter().filter_map(|p| p["offset"].as_u64()).collect();
    assert_eq!(
        stored,
        [first + 1, first + 2],
        "no hole in the stream: {got:?}"
    );
    if ordered {
        assert_eq!(
            datas(&got),
            [
                json!({"i": 1}),
                json!({"typing": true}),
                json!({"typing": false}),
                json!({"last": true})
            ]
        );
    }

    let (_, h) = publisher
        .api("/api/history", Some(json!({"channel": "room"})))
        .await;
    assert_eq!(
        datas(h["publications"].as_array().expect("publications")),
        [json!({"i": 1}), json!({"last": true})],
        "{h}"
    );
    assert_eq!(h["offset"], first + 2, "{h}");
    let since = json!({"epoch": start["epoch"], "offset": first});
    let (_, r) = subscribe(subscriber, json!({"channel": "room", "since": since})).await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(
        datas(r["subscribe"]["publications"].as_array().unwrap()),
        [json!({"i": 1}), json!({"last": true})],
        "{r}"
    );
    // The live subscriber is still subscribed and in order: the next stored one arrives.
    publisher
        .publish("room", json!({"last": true, "n": 2}))
        .await;
    let next = pubs_until_last(&mut live, "room").await;
    assert_eq!(next.last().unwrap()["offset"], first + 3, "{next:?}");
}

#[tokio::test]
async fn skip_history_is_live_only_on_the_memory_broker() {
    let node = Node::dev().await;
    skip_history_is_live_only(&node, &node, true).await;
}

#[tokio::test]
async fn skip_history_is_live_only_across_two_nodes_on_redis() {
    let redis = RedisServer::start();
    let a = Node::on_broker("a", &redis.url()).await;
    let b = Node::on_broker("b", &redis.url()).await;
    skip_history_is_live_only(&a, &b, true).await;
}

#[tokio::test]
async fn skip_history_is_live_only_across_two_nodes_on_nats() {
    let nats = NatsServer::start();
    let a = Node::on_broker("a", &nats.url()).await;
    let b = Node::on_broker("b", &nats.url()).await;
    skip_history_is_live_only(&a, &b, false).await;
}
