//! Centrifugo's asynchronous consumers' commands, taken unchanged by Herald's: a Centrifugo
//! PostgreSQL outbox table (its own DDL and trigger) with rows in Centrifugo's field names, and
//! Kafka records in Centrifugo's method-header and publication-data modes. Real PostgreSQL and
//! Kafka (herald-testkit), the real `herald` binary, WebSocket subscribers.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{config_file, token, Client, Node};
use herald_testkit::eventually_ok;
use herald_testkit::kafka::KafkaServer;
use herald_testkit::postgres::PostgresServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(60);

/// A namespace without history, where Centrifugo's `skip_history` means what it says.
const LIVE_NAMESPACE: &str =
    "[[namespaces]]\nname = \"live\"\nsubscribe = \"anonymous\"\nhistory_size = 0\n";

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

/// Nothing more within `quiet`.
async fn nothing_more(client: &mut Client, quiet: Duration) {
    while let Some(m) = client.next_within(quiet).await {
        assert!(m.get("pub").is_none(), "unexpected publication {m}");
    }
}

#[tokio::test]
async fn a_centrifugo_outbox_table_is_drained_unchanged() {
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("start PostgreSQL");
    // Centrifugo's outbox table and notification trigger, as its documentation has them.
    pg.psql(
        "CREATE TABLE centrifugo_outbox (
            id BIGSERIAL PRIMARY KEY,
            method text NOT NULL,
            payload JSONB NOT NULL,
            partition INTEGER NOT NULL default 0,
            created_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP NOT NULL
         );
         CREATE OR REPLACE FUNCTION centrifugo_notify_partition_change() RETURNS TRIGGER AS $$
         BEGIN
             PERFORM pg_notify('centrifugo_partition_change', NEW.partition::text);
             RETURN NEW;
         END;
         $$ LANGUAGE plpgsql;
         CREATE OR REPLACE TRIGGER centrifugo_notify_partition_trigger
         AFTER INSERT ON centrifugo_outbox
         FOR EACH ROW EXECUTE FUNCTION centrifugo_notify_partition_change();",
    );
    let toml = format!(
        "{LIVE_NAMESPACE}[consumers.postgres.centrifugo]\ndsn = \"{}\"\n\
         table = \"centrifugo_outbox\"\ncreate_table = true\npoll_interval_ms = 200\n",
        pg.dsn()
    );
    let file = config_file("herald.toml", &toml);
    let node = Node::start(&["--dev", "--config", &file], &[]).await;
    let mut sub = node.connected(&["room", "live:a", "live:b"]).await;
    let mut alice = node.client().await;
    let r = alice
        .call("connect", json!({"token": token(json!({"sub": "alice"}))}))
        .await;
    assert!(r["connect"]["client"].is_string(), "{r}");

    pg.psql(
        r#"INSERT INTO centrifugo_outbox (method, payload) VALUES
           ('publish', '{"channel": "room", "data": {"i": 1}, "tags": {}, "skip_history": false, "delta": true}'),
           ('publish', '{"channel": "room", "b64data": "eyJpIjogMn0="}'),
           ('broadcast', '{"channels": ["live:a", "live:b"], "data": {"i": 3}, "skip_history": true, "idempotency_key": "typing-1"}'),
           ('publish', '{"channel": "room", "data": {"i": 4}, "tags": {"kind": "x"}}'),
           ('publish', '{"channel": "room", "data": {"i": 5}, "version": 3}'),
           ('publish', '{"channel": "room", "data": {"i": 6}, "skip_history": true}'),
           ('subscribe', '{"user": "alice", "channel": "room"}');"#,
    );
    let seen = received(&mut sub, 6).await;
    assert_eq!(
        seen["room"],
        [
            json!({"i": 1}),
            json!({"i": 2}),
            json!({"i": 4}),
            json!({"i": 6})
        ],
        "{seen:?}"
    );
    assert_eq!(seen["live:a"], [json!({"i": 3})], "{seen:?}");
    assert_eq!(seen["live:b"], [json!({"i": 3})], "{seen:?}");
    nothing_more(&mut sub, Duration::from_millis(500)).await;

    // The row with tags is published with them (the history shows them); the row with a
    // version Herald cannot honour is dead-lettered, the error naming the field.
    let (_, h) = node
        .api("/api/history", Some(json!({"channel": "room"})))
        .await;
    let tagged: Vec<&Value> = h["publications"]
        .as_array()
        .expect("history")
        .iter()
        .filter(|p| p["data"] == json!({"i": 4}))
        .collect();
    assert_eq!(tagged.len(), 1, "{h}");
    assert_eq!(tagged[0]["tags"], json!({"kind": "x"}), "{h}");
    // The skip_history row reached the subscriber live (above) and is not in history.
    assert!(
        !h["publications"]
            .as_array()
            .expect("history")
            .iter()
            .any(|p| p["data"] == json!({"i": 6})),
        "{h}"
    );
    let dead = eventually_ok(
        DEADLINE,
        "the version row in the dead-letter table",
        || async {
            let d = pg.psql("SELECT error FROM centrifugo_outbox_dead");
            if d.is_empty() {
                Err("empty")
            } else {
                Ok(d)
            }
        },
    )
    .await;
    assert!(dead.contains("\"version\" is not supported"), "{dead}");
    // Centrifugo's control commands reach the user's connection: subscribed, then closed.
    let first = alice.next().await;
    assert_eq!(first["subscribe"]["channel"], "room", "{first}");
    pg.psql(
        r#"INSERT INTO centrifugo_outbox (method, payload) VALUES
           ('disconnect', '{"user": "alice", "disconnect": {"code": 4510, "reason": "bye"}}');"#,
    );
    let closed = alice.closed().await;
    assert_eq!(closed.code, Some(4510), "{closed:?}");
    // history_remove: the channel's stored publications go, its position stays.
    pg.psql(
        r#"INSERT INTO centrifugo_outbox (method, payload) VALUES
           ('history_remove', '{"channel": "room"}');"#,
    );
    eventually_ok(DEADLINE, "room's history removed", || async {
        let (_, h) = node
            .api("/api/history", Some(json!({"channel": "room"})))
            .await;
        match h["publications"].as_array().map(Vec::len) {
            Some(0) => Ok(h),
            _ => Err("publications left"),
        }
    })
    .await;
    let (_, p) = node
        .api("/api/publish", Some(json!({"channel": "room", "data": 7})))
        .await;
    assert_eq!(
        p["offset"], 4,
        "the stream continues after history_remove: {p}"
    );
    let left = pg.psql("SELECT count(*) FROM centrifugo_outbox");
    assert_eq!(left.trim(), "0");
}

async fn create_topic(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for r in admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create topic")
    {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

async fn produce(p: &FutureProducer, topic: &str, value: &str, headers: &[(&str, &str)]) {
    let mut h = OwnedHeaders::new();
    for (key, value) in headers {
        h = h.insert(Header {
            key,
            value: Some(*value),
        });
    }
    p.send(
        FutureRecord::<(), str>::to(topic).payload(value).headers(h),
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
}

#[tokio::test]
async fn kafka_takes_centrifugo_method_headers_and_publication_data() {
    let kafka = tokio::task::spawn_blocking(KafkaServer::start)
        .await
        .expect("start Kafka");
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "cent-commands").await;
    create_topic(&bootstrap, "cent-data").await;
    let toml = format!(
        "{LIVE_NAMESPACE}\
         [[consumers.kafka]]\nname = \"commands\"\nbrokers = \"{bootstrap}\"\n\
         topics = [\"cent-commands\"]\ngroup_id = \"cent-commands\"\n\
         [[consumers.kafka]]\nname = \"data\"\nbrokers = \"{bootstrap}\"\n\
         topics = [\"cent-data\"]\ngroup_id = \"cent-data\"\n\
         [consumers.kafka.publication_data_mode]\nenabled = true\n"
    );
    let file = config_file("herald.toml", &toml);
    let node = Node::start(&["--dev", "--config", &file], &[]).await;
    let mut sub = node.connected(&["k1", "k2", "k3"]).await;
    let mut bob = node.client().await;
    let r = bob
        .call("connect", json!({"token": token(json!({"sub": "bob"}))}))
        .await;
    assert!(r["connect"]["client"].is_string(), "{r}");

    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    // Method in a header, the value the request body (with Centrifugo's fields).
    produce(
        &p,
        "cent-commands",
        r#"{"channel":"k1","b64data":"eyJpIjoxfQ==","tags":{}}"#,
        &[("centrifugo-method", "publish")],
    )
    .await;
    // The envelope, its payload a JSON string (as a CDC tool writes a jsonb column).
    let envelope = json!({
        "method": "broadcast",
        "payload": json!({"channels": ["k1", "k2"], "data": {"i": 2}, "delta": false}).to_string(),
    });
    produce(&p, "cent-commands", &envelope.to_string(), &[]).await;
    // Publication data: the value is the data, channels and key in headers; the same key
    // twice publishes once.
    for _ in 0..2 {
        produce(
            &p,
            "cent-data",
            r#"{"i":3}"#,
            &[
                ("centrifugo-channels", "k2,k3"),
                ("centrifugo-idempotency-key", "order-3"),
            ],
        )
        .await;
    }
    produce(
        &p,
        "cent-data",
        r#"{"i":4}"#,
        &[("centrifugo-channels", "k3")],
    )
    .await;
    // A control command by method header: the user's connection is subscribed.
    produce(
        &p,
        "cent-commands",
        r#"{"user":"bob","channel":"k9"}"#,
        &[("centrifugo-method", "subscribe")],
    )
    .await;

    let mut seen = received(&mut sub, 6).await;
    assert_eq!(seen["k1"], [json!({"i": 1}), json!({"i": 2})], "{seen:?}");
    // Two topics, two consumers: k2's two publications may come in either order.
    let k2 = seen.get_mut("k2").expect("k2");
    k2.sort_by_key(|d| d["i"].as_u64());
    assert_eq!(seen["k2"], [json!({"i": 2}), json!({"i": 3})], "{seen:?}");
    assert_eq!(seen["k3"], [json!({"i": 3}), json!({"i": 4})], "{seen:?}");
    nothing_more(&mut sub, Duration::from_millis(1000)).await;
    let m = bob.next().await;
    assert_eq!(m["subscribe"]["channel"], "k9", "{m}");
}
