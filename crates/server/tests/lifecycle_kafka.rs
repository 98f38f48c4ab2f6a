//! The lifecycle stream into a Kafka topic (docs/lifecycle.md): a real Apache Kafka (herald-testkit)
//! and the real binary; one record per event, keyed by the user, in order.
mod common;

use std::time::Duration;

use common::*;
use herald_testkit::kafka::KafkaServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn events_reach_the_topic_in_order_keyed_by_user() {
    let kafka = tokio::task::spawn_blocking(KafkaServer::start)
        .await
        .expect("start Kafka");
    let bootstrap = kafka.bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client");
    let topic = NewTopic::new("lifecycle", 3, TopicReplication::Fixed(1));
    for r in admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .expect("create topic")
    {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIFECYCLE__KAFKA_BROKERS", &bootstrap),
            ("HERALD_LIFECYCLE__KAFKA_TOPIC", "lifecycle"),
        ],
    )
    .await;
    let mut c = node.client().await;
    c.call("connect", json!({"token": token(json!({"sub": "bob"}))}))
        .await;
    c.call("subscribe", json!({"channel": "news"})).await;
    let (status, _) = node
        .api("/api/disconnect", Some(json!({"user": "bob"})))
        .await;
    assert_eq!(status, 200);

    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "check-lifecycle")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    reader.subscribe(&["lifecycle"]).expect("subscribe");
    let mut seen: Vec<Value> = Vec::new();
    while seen.len() < 4 {
        let m = tokio::time::timeout(DEADLINE, reader.recv())
            .await
            .expect("the lifecycle records within the deadline")
            .expect("read the topic");
        assert_eq!(m.key(), Some(&b"bob"[..]), "keyed by the user");
        seen.push(serde_json::from_slice(m.payload().expect("payload")).expect("JSON event"));
    }
    let kinds: Vec<&str> = seen.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["connect", "subscribe", "unsubscribe", "disconnect"],
        "{seen:#?}"
    );
    assert_eq!(seen[3]["code"], 4502);
}
