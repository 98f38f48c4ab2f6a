//! Publish options users migrate with: `/api/batch` (many different commands in one request,
//! answered in order, in sequence or in parallel, with its limits), the same batch as a
//! PostgreSQL outbox row and a Kafka record, `b64data` on Herald's own API, and
//! `idempotency_key` honoured on every path (the API's publish, broadcast and batch, on the
//! memory broker, real Redis and real NATS). The real `herald` binary, WebSocket subscribers.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{config_file, token, Client, Node};
use herald_testkit::eventually_ok;
use herald_testkit::kafka::KafkaServer;
use herald_testkit::nats::NatsServer;
use herald_testkit::postgres::PostgresServer;
use herald_testkit::redis::RedisServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(60);

/// Publications received, data by channel, until `total` arrived (panics at the deadline).
async fn received(client: &mut Client, total: usize) -> BTreeMap<String, Vec<Value>> {
    let mut seen: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while seen.values().map(Vec::len).sum::<usize>() < total {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "not everything arrived in time: {seen:?}");
        let Some(m) = client.next_within(left.min(Duration::from_secs(1))).await else {
            continue;
        };
        if let Some(p) = m.get("pub") {
            let channel = p["channel"].as_str().expect("channel").to_owned();
            seen.entry(channel).or_default().push(p["data"].clone());
        }
    }
    seen
}

/// No publication within `quiet`.
async fn nothing_more(client: &mut Client, quiet: Duration) {
    while let Some(m) = client.next_within(quiet).await {
        assert!(m.get("pub").is_none(), "unexpected publication {m}");
    }
}

/// A connection of user `user` (its client id checked).
async fn user(node: &Node, user: &str) -> Client {
    let mut c = node.client().await;
    let r = c
        .call("connect", json!({"token": token(json!({"sub": user}))}))
        .await;
    assert!(r["connect"]["client"].is_string(), "{r}");
    c
}

fn offset(reply: &Value) -> u64 {
    reply["result"]["offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("no offset in {reply}"))
}

fn code(reply: &Value) -> u64 {
    reply["error"]["code"]
        .as_u64()
        .unwrap_or_else(|| panic!("no error in {reply}"))
}

#[tokio::test]
async fn a_batch_runs_different_commands_in_order_with_errors_in_place() {
    let node = Node::dev().await;
    let mut sub = node.connected(&["b1", "b2"]).await;
    let mut alice = user(&node, "alice").await;
    let (status, body) = node
        .api(
            "/api/batch",
            Some(json!({"commands": [
                {"method": "publish", "payload": {"channel": "b1", "data": {"i": 1}}},
                // Centrifugo's command shape is taken too.
                {"broadcast": {"channels": ["b1", "b2"], "data": {"i": 2}}},
                // {"i":3}, base64.
                {"method": "publish", "payload": {"channel": "b2", "b64data": "eyJpIjozfQ=="}},
                {"method": "publish", "payload": {"channel": "nope:x", "data": 0}},
                {"method": "publish", "payload": {"channel": "b1", "data": 0, "colour": 1}},
                {"method": "history", "payload": {"channel": "b1"}},
                {"method": "subscribe", "payload": {"user": "alice", "channel": "b3"}},
                {"method": "frobnicate", "payload": {}},
                {"publish": {}, "broadcast": {}},
                {"batch": {"commands": []}},
            ]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = body["replies"].as_array().expect("replies");
    assert_eq!(r.len(), 10, "{body}");
    assert_eq!(offset(&r[0]), 1, "{body}");
    let results = r[1]["result"]["results"].as_array().expect("broadcast");
    assert_eq!(results[0]["offset"], 2, "{body}");
    assert_eq!(results[1]["offset"], 1, "{body}");
    assert_eq!(offset(&r[2]), 2, "{body}");
    assert_eq!(code(&r[3]), 102, "unknown namespace: {body}");
    assert_eq!(code(&r[4]), 107, "unknown field: {body}");
    assert!(r[4]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("colour"));
    // The history command ran after the publications before it.
    let kept = r[5]["result"]["publications"].as_array().expect("history");
    assert_eq!(kept.len(), 2, "{body}");
    assert_eq!(r[6]["result"], json!({}), "{body}");
    assert_eq!(code(&r[7]), 104, "unknown method: {body}");
    assert_eq!(code(&r[8]), 107, "two methods: {body}");
    assert_eq!(code(&r[9]), 107, "nested batch: {body}");
    assert!(r[9]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cannot hold a batch"));

    let seen = received(&mut sub, 4).await;
    assert_eq!(seen["b1"], [json!({"i": 1}), json!({"i": 2})], "{seen:?}");
    assert_eq!(seen["b2"], [json!({"i": 2}), json!({"i": 3})], "{seen:?}");
    nothing_more(&mut sub, Duration::from_millis(300)).await;
    let m = alice.next().await;
    assert_eq!(m["subscribe"]["channel"], "b3", "{m}");

    // In parallel: every command runs, the replies still in the commands' order.
    let commands: Vec<Value> = (0..20)
        .map(|i| json!({"publish": {"channel": format!("p{i}"), "data": i}}))
        .chain([json!({"method": "disconnect", "payload": {"user": "alice", "code": 4510}})])
        .collect();
    let (status, body) = node
        .api(
            "/api/batch",
            Some(json!({"commands": commands, "parallel": true})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = body["replies"].as_array().expect("replies");
    assert_eq!(r.len(), 21, "{body}");
    for reply in &r[..20] {
        assert_eq!(offset(reply), 1, "{body}");
    }
    let closed = alice.closed().await;
    assert_eq!(closed.code, Some(4510), "{closed:?}");
}

#[tokio::test]
async fn batch_limits_and_malformed_bodies_are_refused_whole() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIMITS__MAX_BATCH_COMMANDS", "3"),
            ("HERALD_LIMITS__MAX_BROADCAST_BODY_BYTES", "2000"),
        ],
    )
    .await;
    let publish = |i: u32| json!({"publish": {"channel": "lim", "data": i}});
    let four: Vec<Value> = (0..4).map(publish).collect();
    let (status, body) = node
        .api("/api/batch", Some(json!({ "commands": four })))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], 106, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_batch_commands (3)"), "{message}");
    // Nothing of a refused batch ran.
    let (_, history) = node
        .api("/api/history", Some(json!({"channel": "lim"})))
        .await;
    assert_eq!(history["offset"], 0, "{history}");

    let big = json!({"commands": [{"publish": {"channel": "lim", "data": "x".repeat(3000)}}]});
    let (status, body) = node.api("/api/batch", Some(big)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], 106, "{body}");

    let (status, body) = node
        .http(
            "POST",
            "/api/batch",
            Some("{not json".into()),
            Some("testkey"),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], 107, "{body}");
    let (status, body) = node
        .api(
            "/api/batch",
            Some(json!({"commands": [publish(1)], "paralel": true})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("paralel"),
        "{body}"
    );
    let (status, body) = node.http("GET", "/api/batch", None, Some("testkey")).await;
    assert_eq!(status, 405, "{body}");

    // Centrifugo's batch has the same limit (error 106 in Centrifugo's reply shape).
    let (status, body) = node
        .http(
            "POST",
            "/centrifugo/api/batch",
            Some(json!({ "commands": (0..4).map(publish).collect::<Vec<_>>() }).to_string()),
            Some("testkey"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"]["code"], 106, "{body}");
}

/// `/api/publish`, `/api/broadcast` and a batch's commands publish once per key on `node`'s
/// broker: a retry answers the first position and subscribers get one publication.
async fn idempotency_keys_hold_on_every_api_path(node: &Node) {
    let mut sub = node.connected(&["i1", "i2"]).await;
    let publish = json!({"channel": "i1", "b64data": "eyJpIjoxfQ==", "idempotency_key": "p-1"});
    let broadcast = json!({"channels": ["i1", "i2"], "data": {"i": 2}, "idempotency_key": "b-1"});
    let batch = json!({"commands": [
        {"publish": {"channel": "i2", "data": {"i": 3}, "idempotency_key": "c-1"}},
        {"publish": {"channel": "i2", "data": {"i": 4}, "idempotency_key": "c-2"}},
    ]});
    let mut first = Vec::new();
    for attempt in 0..2 {
        let (s1, p) = node.api("/api/publish", Some(publish.clone())).await;
        let (s2, b) = node.api("/api/broadcast", Some(broadcast.clone())).await;
        let (s3, c) = node.api("/api/batch", Some(batch.clone())).await;
        assert_eq!((s1, s2, s3), (200, 200, 200), "{p} {b} {c}");
        let answers = json!([
            p["offset"],
            b["results"][0]["offset"],
            b["results"][1]["offset"],
            c["replies"][0]["result"]["offset"],
            c["replies"][1]["result"]["offset"],
        ]);
        if attempt == 0 {
            assert_eq!(answers, json!([1, 2, 1, 2, 3]), "{p} {b} {c}");
            first.push(answers);
        } else {
            assert_eq!(answers, first[0], "a retry answers the first positions");
        }
    }
    let seen = received(&mut sub, 5).await;
    assert_eq!(seen["i1"], [json!({"i": 1}), json!({"i": 2})], "{seen:?}");
    assert_eq!(
        seen["i2"],
        [json!({"i": 2}), json!({"i": 3}), json!({"i": 4})],
        "{seen:?}"
    );
    nothing_more(&mut sub, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn idempotency_keys_hold_on_the_memory_broker() {
    idempotency_keys_hold_on_every_api_path(&Node::dev().await).await;
}

#[tokio::test]
async fn idempotency_keys_hold_on_redis() {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("start Redis");
    let node = Node::on_broker("on-redis", &redis.url()).await;
    idempotency_keys_hold_on_every_api_path(&node).await;
}

#[tokio::test]
async fn idempotency_keys_hold_on_nats() {
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start NATS");
    let node = Node::on_broker("on-nats", &nats.url()).await;
    idempotency_keys_hold_on_every_api_path(&node).await;
}

#[tokio::test]
async fn an_outbox_row_holds_a_batch() {
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("start PostgreSQL");
    let toml = format!(
        "[consumers.postgres.outbox]\ndsn = \"{}\"\ncreate_table = true\npoll_interval_ms = 200\n",
        pg.dsn()
    );
    let file = config_file("herald.toml", &toml);
    let node = Node::start(&["--dev", "--config", &file], &[]).await;
    let mut sub = node.connected(&["o1", "o2"]).await;
    let mut carol = user(&node, "carol").await;
    // One row of commands to the same channel: each has its own key (row key and index), so
    // none is taken for a retry of another. A second row with a bad command among good ones.
    pg.psql(
        r#"INSERT INTO herald_outbox (method, payload) VALUES
           ('batch', '{"commands": [
               {"method": "publish", "payload": {"channel": "o1", "data": {"i": 1}}},
               {"publish": {"channel": "o1", "data": {"i": 2}}},
               {"broadcast": {"channels": ["o1", "o2"], "b64data": "eyJpIjozfQ=="}},
               {"subscribe": {"user": "carol", "channel": "o9"}}
           ]}'),
           ('batch', '{"commands": [
               {"publish": {"channel": "o2", "data": {"i": 4}}},
               {"publish": {"channel": "nope:x", "data": {"i": 0}}},
               {"publish": {"channel": "o2", "data": {"i": 5}}}
           ]}');"#,
    );
    let seen = received(&mut sub, 6).await;
    assert_eq!(
        seen["o1"],
        [json!({"i": 1}), json!({"i": 2}), json!({"i": 3})],
        "{seen:?}"
    );
    assert_eq!(
        seen["o2"],
        [json!({"i": 3}), json!({"i": 4}), json!({"i": 5})],
        "{seen:?}"
    );
    nothing_more(&mut sub, Duration::from_millis(500)).await;
    let m = carol.next().await;
    assert_eq!(m["subscribe"]["channel"], "o9", "{m}");
    // The row with the bad command is dead-lettered, naming it; its good commands ran.
    let dead = eventually_ok(DEADLINE, "the bad batch dead-lettered", || async {
        let d = pg.psql("SELECT error FROM herald_outbox_dead");
        if d.is_empty() {
            Err("empty")
        } else {
            Ok(d)
        }
    })
    .await;
    assert!(dead.contains("command 1 (publish)"), "{dead}");
    assert!(dead.contains("1 of 3 commands"), "{dead}");
    let left = pg.psql("SELECT count(*) FROM herald_outbox");
    assert_eq!(left.trim(), "0");
}

#[tokio::test]
async fn a_kafka_record_holds_a_batch() {
    let kafka = tokio::task::spawn_blocking(KafkaServer::start)
        .await
        .expect("start Kafka");
    let bootstrap = kafka.bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client");
    let topic = NewTopic::new("batches", 1, TopicReplication::Fixed(1));
    for r in admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .expect("create topic")
    {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
    let toml = format!(
        "[consumers.kafka]\nbrokers = \"{bootstrap}\"\ntopics = [\"batches\"]\n\
         group_id = \"batches\"\n"
    );
    let file = config_file("herald.toml", &toml);
    let node = Node::start(&["--dev", "--config", &file], &[]).await;
    let mut sub = node.connected(&["k1", "k2"]).await;
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    let record = json!({"method": "batch", "payload": {"commands": [
        {"publish": {"channel": "k1", "data": {"i": 1}}},
        {"publish": {"channel": "k1", "data": {"i": 2}}},
        {"method": "broadcast", "payload": {"channels": ["k1", "k2"], "data": {"i": 3}}},
    ]}});
    p.send(
        FutureRecord::<(), str>::to("batches").payload(&record.to_string()),
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|(e, _)| panic!("produce: {e}"));
    let seen = received(&mut sub, 4).await;
    assert_eq!(
        seen["k1"],
        [json!({"i": 1}), json!({"i": 2}), json!({"i": 3})],
        "{seen:?}"
    );
    assert_eq!(seen["k2"], [json!({"i": 3})], "{seen:?}");
    nothing_more(&mut sub, Duration::from_millis(500)).await;
}
