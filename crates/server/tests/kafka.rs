//! The Kafka consumer against a real Apache Kafka 4.x broker (herald-testkit starts one per test,
//! about 4 s each on an idle machine) and the real `herald` binary: order per partition, publish
//! and broadcast records, malformed records skipped and counted, a retryable failure (Redis down)
//! retried until it publishes, a node killed with SIGKILL mid-stream (every record published
//! exactly once, thanks to the record's idempotency key), a draining node committing before it
//! leaves, Kafka restarted mid-stream (nothing lost), SASL SCRAM and PLAIN, and a consumer config
//! librdkafka refuses. Records are produced with the same client crate, rdkafka.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Client, Node};
use herald_testkit::eventually_ok;
use herald_testkit::kafka::KafkaServer;
use herald_testkit::redis::RedisServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::{json, Value};

/// How long a test waits for everything it expects to arrive.
const DEADLINE: Duration = Duration::from_secs(60);

/// Start Kafka off the async runtime (it blocks until the JVM is up).
async fn kafka() -> KafkaServer {
    tokio::task::spawn_blocking(KafkaServer::start)
        .await
        .expect("start Kafka")
}

async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create topic");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        // Retries across a broker restart must not write a record twice (that would be two
        // offsets, so two publications).
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "120000")
        .set("linger.ms", "0")
        .create()
        .expect("producer")
}

async fn produce(p: &FutureProducer, topic: &str, partition: i32, value: &str) {
    p.send(
        FutureRecord::<(), str>::to(topic)
            .partition(partition)
            .payload(value),
        Duration::from_secs(120),
    )
    .await
    .unwrap_or_else(|(e, _)| panic!("produce to {topic}/{partition}: {e}"));
}

fn publish(channel: &str, data: Value) -> String {
    json!({"method": "publish", "payload": {"channel": channel, "data": data}}).to_string()
}

/// The consumer's settings as `HERALD_CONSUMERS__KAFKA__*` variables (the environment route of
/// the config loader, which the file route shares).
fn consumer_env(bootstrap: &str, topic: &str, group: &str) -> Vec<(String, String)> {
    [
        ("BROKERS", bootstrap),
        ("TOPICS", topic),
        ("GROUP_ID", group),
        ("STATS_INTERVAL_MS", "500"),
        // The brokers' least: a member lost with a broker restart is replaced sooner.
        ("SESSION_TIMEOUT_MS", "6000"),
    ]
    .into_iter()
    .map(|(k, v)| (format!("HERALD_CONSUMERS__KAFKA__{k}"), v.to_owned()))
    .collect()
}

async fn start_node(extra: &[&str], env: &[(String, String)]) -> Node {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Node::start(extra, &env).await
}

/// Read publications until `done` says enough, or panic at the deadline. Returns each channel's
/// data in arrival order.
async fn collect(
    client: &mut Client,
    mut done: impl FnMut(&BTreeMap<String, Vec<Value>>) -> bool,
) -> BTreeMap<String, Vec<Value>> {
    let mut seen: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done(&seen) {
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

fn count(seen: &BTreeMap<String, Vec<Value>>) -> usize {
    seen.values().map(Vec::len).sum()
}

/// The `i` fields of a channel's data, in order.
fn indexes(data: &[Value]) -> Vec<u64> {
    data.iter().map(|d| d["i"].as_u64().expect("i")).collect()
}

/// Poll a metric until it reaches `want` (metrics with labels included).
async fn metric_reaches(node: &Node, name: &str, want: f64) {
    eventually_ok(DEADLINE, &format!("{name} to reach {want}"), || async {
        let (_, body) = node.http("GET", "/metrics", None, None).await;
        let text = body.as_str().unwrap_or_default().to_owned();
        let value = text
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok());
        if value == Some(want) {
            return Ok(());
        }
        Err(format!(
            "{name} is {value:?}:\n{}",
            text.lines()
                .filter(|l| l.contains("kafka"))
                .collect::<Vec<_>>()
                .join("\n")
        ))
    })
    .await
}

#[tokio::test]
async fn records_of_a_partition_arrive_in_order() {
    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "ordered", 3).await;
    let node = start_node(&["--dev"], &consumer_env(&bootstrap, "ordered", "g-order")).await;
    let mut client = node.connected(&["part0", "part1", "part2"]).await;

    // 3 partitions × 100 records; each partition's records go to its own channel, so any
    // reordering inside a partition shows up as a channel out of order.
    let p = producer(&bootstrap);
    const PER_PARTITION: u64 = 100;
    for i in 0..PER_PARTITION {
        for part in 0..3 {
            produce(
                &p,
                "ordered",
                part,
                &publish(&format!("part{part}"), json!({"i": i})),
            )
            .await;
        }
    }
    let seen = collect(&mut client, |s| count(s) >= 3 * PER_PARTITION as usize).await;
    let want: Vec<u64> = (0..PER_PARTITION).collect();
    for part in 0..3 {
        assert_eq!(
            indexes(&seen[&format!("part{part}")]),
            want,
            "partition {part}"
        );
    }
    metric_reaches(
        &node,
        r#"herald_kafka_consumed_total{consumer="g-order"}"#,
        300.0,
    )
    .await;
    metric_reaches(
        &node,
        r#"herald_kafka_published_total{consumer="g-order"}"#,
        300.0,
    )
    .await;
}

#[tokio::test]
async fn publish_and_broadcast_records_reach_their_channels() {
    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "commands", 1).await;
    // Configured from a file this time, as `[[consumers.kafka]]`.
    let file = common::config_file(
        "herald.toml",
        &format!(
            "[[consumers.kafka]]\nname = \"cmds\"\nbrokers = [\"{bootstrap}\"]\ntopics = [\"commands\"]\n\
             group_id = \"g-commands\"\n"
        ),
    );
    let node = Node::start(&["--dev", "--config", &*file], &[]).await;
    let mut client = node.connected(&["news", "room1", "room2"]).await;

    let p = producer(&bootstrap);
    produce(
        &p,
        "commands",
        0,
        &publish("news", json!({"headline": "hi"})),
    )
    .await;
    let broadcast = json!({"method": "broadcast", "payload": {
        "channels": ["room1", "room2"], "data": {"text": "to both"}}});
    produce(&p, "commands", 0, &broadcast.to_string()).await;

    let seen = collect(&mut client, |s| count(s) >= 3).await;
    assert_eq!(seen["news"], [json!({"headline": "hi"})]);
    assert_eq!(seen["room1"], [json!({"text": "to both"})]);
    assert_eq!(seen["room2"], [json!({"text": "to both"})]);
    assert!(
        client
            .next_within(Duration::from_millis(500))
            .await
            .is_none(),
        "nothing more"
    );
    metric_reaches(
        &node,
        r#"herald_kafka_published_total{consumer="cmds"}"#,
        2.0,
    )
    .await;
}

#[tokio::test]
async fn a_malformed_record_is_skipped_counted_and_later_records_flow() {
    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    // One partition: the bad records sit in front of the good one.
    create_topic(&bootstrap, "mixed", 1).await;
    let node = start_node(&["--dev"], &consumer_env(&bootstrap, "mixed", "g-mixed")).await;
    let mut client = node.connected(&["good"]).await;

    let p = producer(&bootstrap);
    produce(&p, "mixed", 0, "this is not JSON").await;
    produce(&p, "mixed", 0, r#"{"method":"delete","payload":{}}"#).await;
    produce(&p, "mixed", 0, &publish("good", json!({"i": 0}))).await;
    // A channel of a namespace that is not configured: refused, not retried.
    produce(&p, "mixed", 0, &publish("nowhere:x", json!(1))).await;
    produce(&p, "mixed", 0, &publish("good", json!({"i": 1}))).await;

    let seen = collect(&mut client, |s| count(s) >= 2).await;
    assert_eq!(indexes(&seen["good"]), [0, 1]);
    metric_reaches(
        &node,
        r#"herald_kafka_failed_total{consumer="g-mixed",reason="malformed"}"#,
        2.0,
    )
    .await;
    metric_reaches(
        &node,
        r#"herald_kafka_failed_total{consumer="g-mixed",reason="refused"}"#,
        1.0,
    )
    .await;
    metric_reaches(
        &node,
        r#"herald_kafka_consumed_total{consumer="g-mixed"}"#,
        5.0,
    )
    .await;
    // Every offset, the skipped ones too, is committed: nothing is left behind.
    metric_reaches(
        &node,
        r#"herald_kafka_lag{consumer="g-mixed",topic="mixed",partition="0"}"#,
        0.0,
    )
    .await;
}

/// Each channel's history through the API, as the `i` of each publication.
async fn history(node: &Node, channel: &str) -> Vec<u64> {
    let (status, body) = node
        .api(
            "/api/history",
            Some(json!({"channel": channel, "limit": 1000})),
        )
        .await;
    assert_eq!(status, 200, "history: {body}");
    body["publications"]
        .as_array()
        .expect("publications")
        .iter()
        .map(|p| p["data"]["i"].as_u64().expect("i"))
        .collect()
}

#[tokio::test]
async fn a_node_killed_mid_stream_publishes_every_record_exactly_once() {
    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "stream", 3).await;
    // Redis outlives the node and remembers the idempotency keys; a long commit interval makes
    // sure records were published but not committed when the node dies.
    let redis = RedisServer::start();
    let mut env = consumer_env(&bootstrap, "stream", "g-crash");
    env.push((
        "HERALD_CONSUMERS__KAFKA__COMMIT_INTERVAL_MS".into(),
        "3000".into(),
    ));
    env.push(("HERALD_BROKER_URL".into(), redis.url()));
    let mut first = start_node(&["--dev"], &env).await;
    let mut client = first.connected(&["s0", "s1", "s2"]).await;

    const TOTAL: u64 = 600;
    let p = producer(&bootstrap);
    let producing = tokio::spawn(async move {
        for i in 0..TOTAL {
            let part = (i % 3) as i32;
            produce(
                &p,
                "stream",
                part,
                &publish(&format!("s{part}"), json!({"i": i})),
            )
            .await;
            // Paced (the point): the stream must still be flowing when the node is killed.
            if i % 20 == 19 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    // Kill the node once it has published some of the stream, not all of it.
    let seen_before_kill = count(&collect(&mut client, |s| count(s) >= 150).await) as u64;
    first.process().start_kill().expect("kill -9");
    first.process().wait().await.expect("reaped");
    drop(client);

    let second = start_node(&["--dev"], &env).await;
    producing.await.expect("producer");
    let all = eventually_ok(
        DEADLINE,
        &format!("{TOTAL} publications in the channels' history"),
        || async {
            let mut all = Vec::new();
            for part in 0..3 {
                all.push(history(&second, &format!("s{part}")).await);
            }
            let lens: Vec<usize> = all.iter().map(Vec::len).collect();
            if lens.iter().sum::<usize>() as u64 >= TOTAL {
                Ok(all)
            } else {
                Err(format!("s0, s1, s2 hold {lens:?}"))
            }
        },
    )
    .await;
    for (part, got) in all.iter().enumerate() {
        let want: Vec<u64> = (0..TOTAL).filter(|i| i % 3 == part as u64).collect();
        assert_eq!(got, &want, "channel s{part}: each record once, in order");
    }
    // The case was exercised: the second node took again records the first had published
    // (they were not committed yet), and their keys kept them from being published twice.
    let consumed_again = second
        .metric(r#"herald_kafka_consumed_total{consumer="g-crash"}"#)
        .await as u64;
    assert!(
        consumed_again > TOTAL - seen_before_kill,
        "the second node consumed {consumed_again}, the first had published at least \
         {seen_before_kill} of {TOTAL}: nothing was redelivered"
    );
}

#[tokio::test]
async fn kafka_restarted_mid_stream_loses_nothing() {
    let mut kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "restarts", 3).await;
    let node = start_node(
        &["--dev"],
        &consumer_env(&bootstrap, "restarts", "g-restart"),
    )
    .await;
    let mut client = node.connected(&["r0", "r1", "r2"]).await;

    // A paced producer that keeps going across the restart (its client buffers and resends
    // while the broker is down; idempotence keeps a resend from writing a record twice).
    const TOTAL: u64 = 300;
    let p = producer(&bootstrap);
    let producing = tokio::spawn(async move {
        for i in 0..TOTAL {
            let part = (i % 3) as i32;
            let value = publish(&format!("r{part}"), json!({"i": i}));
            produce(&p, "restarts", part, &value).await;
            // Paced (the point): records keep coming before, during and after the restart.
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    // Restart the broker (SIGKILL, same ports and data) while records are flowing.
    let mut seen = collect(&mut client, |s| count(s) >= 30).await;
    kafka = tokio::task::spawn_blocking(move || {
        kafka.restart();
        kafka
    })
    .await
    .expect("restart Kafka");
    let before = count(&seen);
    assert!(
        (before as u64) < TOTAL,
        "the stream was over before the restart"
    );
    let rest = collect(&mut client, |s| before + count(s) >= TOTAL as usize).await;
    producing.await.expect("producer");
    for (channel, data) in rest {
        seen.entry(channel).or_default().extend(data);
    }
    // Anything more would be a duplicate.
    if let Some(extra) = client.next_within(Duration::from_millis(500)).await {
        panic!("more than {TOTAL} publications: {extra}");
    }
    for part in 0..3u64 {
        let want: Vec<u64> = (0..TOTAL).filter(|i| i % 3 == part).collect();
        assert_eq!(
            indexes(&seen[&format!("r{part}")]),
            want,
            "channel r{part}: every record once, in order"
        );
    }
    drop(kafka);
}

/// A metric's value (0 when the series does not exist yet).
async fn metric_value(node: &Node, name: &str) -> f64 {
    let (_, body) = node.http("GET", "/metrics", None, None).await;
    body.as_str()
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_retryable_failure_is_retried_until_the_broker_is_back() {
    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "retried", 1).await;
    let mut redis = RedisServer::start_with(herald_testkit::redis::RedisOptions {
        persistent: true,
        ..Default::default()
    });
    let mut env = consumer_env(&bootstrap, "retried", "g-retry");
    env.push(("HERALD_BROKER_URL".into(), redis.url()));
    // This Redis keeps every write (appendfsync always), so it may be declared: the restart
    // then keeps the channel's epoch and its history (otherwise a new epoch starts).
    env.push((
        "HERALD_REDIS__SYNCHRONOUS_PERSISTENCE".into(),
        "true".into(),
    ));
    env.push(("HERALD_CONSUMERS__KAFKA__RETRY_MAX_MS".into(), "300".into()));
    let node = start_node(&["--dev"], &env).await;
    let p = producer(&bootstrap);
    produce(&p, "retried", 0, &publish("q", json!({"i": 0}))).await;
    eventually_ok(DEADLINE, "the first record in q's history", || async {
        match history(&node, "q").await {
            got if got == [0] => Ok(()),
            got => Err(format!("{got:?}")),
        }
    })
    .await;

    // The broker goes away: the next records fail with a retryable error and wait.
    redis.stop();
    for i in 1..=5 {
        produce(&p, "retried", 0, &publish("q", json!({"i": i}))).await;
    }
    let retries = r#"herald_kafka_retries_total{consumer="g-retry"}"#;
    eventually_ok(
        DEADLINE,
        "3 retries counted while Redis is down",
        || async {
            match metric_value(&node, retries).await {
                n if n >= 3.0 => Ok(()),
                n => Err(format!("{retries} is {n}")),
            }
        },
    )
    .await;
    redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .expect("restart Redis");

    // Nothing was skipped: every record published once, in order, once the broker is back.
    eventually_ok(
        DEADLINE,
        "q's history to be [0, 1, 2, 3, 4, 5] once the broker is back",
        || async {
            // The node answers 503 until it has reconnected to Redis.
            let (status, body) = node
                .api("/api/history", Some(json!({"channel": "q", "limit": 100})))
                .await;
            let got: Vec<u64> = match status {
                200 => body["publications"]
                    .as_array()
                    .expect("publications")
                    .iter()
                    .map(|p| p["data"]["i"].as_u64().expect("i"))
                    .collect(),
                _ => Vec::new(),
            };
            if got == [0, 1, 2, 3, 4, 5] {
                Ok(())
            } else {
                Err(format!("status {status}, history {got:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        metric_value(
            &node,
            r#"herald_kafka_failed_total{consumer="g-retry",reason="refused"}"#
        )
        .await,
        0.0,
        "a retryable failure is never skipped"
    );
    drop(redis);
}

#[tokio::test]
async fn a_consumer_librdkafka_refuses_stops_the_node_at_start() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--dev", "--port", "0"])
        .env("HERALD_CONSUMERS__KAFKA__BROKERS", "127.0.0.1:1")
        .env("HERALD_CONSUMERS__KAFKA__TOPICS", "t")
        .env(
            "HERALD_CONSUMERS__KAFKA__SECURITY_PROTOCOL",
            "carrier_pigeon",
        )
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("herald exits")
        .expect("run herald");
    assert!(!out.status.success(), "herald started with a bad consumer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("consumers.kafka"), "{stderr}");
}

#[tokio::test]
async fn a_draining_node_commits_what_it_published_before_it_leaves() {
    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "drained", 1).await;
    // No periodic commit within the test: only the commit made on SIGTERM can move the group.
    let mut env = consumer_env(&bootstrap, "drained", "g-drain");
    env.push((
        "HERALD_CONSUMERS__KAFKA__COMMIT_INTERVAL_MS".into(),
        "600000".into(),
    ));
    env.push(("HERALD_DRAIN_MS".into(), "0".into()));
    let mut first = start_node(&["--dev"], &env).await;
    let p = producer(&bootstrap);
    for i in 0..5 {
        produce(&p, "drained", 0, &publish("d", json!({"i": i}))).await;
    }
    metric_reaches(
        &first,
        r#"herald_kafka_published_total{consumer="g-drain"}"#,
        5.0,
    )
    .await;
    first.sigterm();
    tokio::time::timeout(Duration::from_secs(20), first.process().wait())
        .await
        .expect("the node stops within 20 s")
        .expect("exit status");

    // The next node of the group starts after the committed offset: only the new record.
    let second = start_node(&["--dev"], &env).await;
    let mut client = second.connected(&["d"]).await;
    produce(&p, "drained", 0, &publish("d", json!({"i": 5}))).await;
    // Wait for the new record's publication. A partition's records are consumed in offset order,
    // each counted before it is published, so a record of 0..5 consumed again is counted by the
    // time record 5 is out: no time has to pass for it to show.
    let seen = collect(&mut client, |s| {
        s.get("d").is_some_and(|d| d.contains(&json!({"i": 5})))
    })
    .await;
    assert_eq!(indexes(&seen["d"]), [5], "only the new record is published");
    metric_reaches(
        &second,
        r#"herald_kafka_published_total{consumer="g-drain"}"#,
        1.0,
    )
    .await;
    assert_eq!(
        metric_value(
            &second,
            r#"herald_kafka_consumed_total{consumer="g-drain"}"#
        )
        .await,
        1.0,
        "records published before the drain were consumed again"
    );
}

#[tokio::test]
async fn sasl_scram_and_plain_credentials_reach_the_broker() {
    let kafka = tokio::task::spawn_blocking(|| KafkaServer::start_with_sasl("herald", "s3cret"))
        .await
        .expect("start Kafka");
    let bootstrap = kafka.bootstrap();
    let sasl = kafka.sasl_bootstrap().expect("SASL listener");
    create_topic(&bootstrap, "authed", 1).await;
    let p = producer(&bootstrap);
    produce(&p, "authed", 0, &publish("a", json!({"i": 0}))).await;

    // Each mechanism in its own group, so each node consumes the record itself.
    for (mechanism, group) in [("SCRAM-SHA-256", "g-scram"), ("PLAIN", "g-plain")] {
        let mut env = consumer_env(&sasl, "authed", group);
        for (k, v) in [
            ("SECURITY_PROTOCOL", "sasl_plaintext"),
            ("SASL_MECHANISM", mechanism),
            ("SASL_USERNAME", "herald"),
            ("SASL_PASSWORD", "s3cret"),
        ] {
            env.push((format!("HERALD_CONSUMERS__KAFKA__{k}"), v.into()));
        }
        let node = start_node(&["--dev"], &env).await;
        metric_reaches(
            &node,
            &format!(r#"herald_kafka_published_total{{consumer="{group}"}}"#),
            1.0,
        )
        .await;
    }

    // A wrong password gets nothing.
    let mut env = consumer_env(&sasl, "authed", "g-wrong");
    for (k, v) in [
        ("SECURITY_PROTOCOL", "sasl_plaintext"),
        ("SASL_MECHANISM", "SCRAM-SHA-256"),
        ("SASL_USERNAME", "herald"),
        ("SASL_PASSWORD", "wrong"),
    ] {
        env.push((format!("HERALD_CONSUMERS__KAFKA__{k}"), v.into()));
    }
    let node = start_node(&["--dev"], &env).await;
    // A sleep: the point is five seconds passing with nothing consumed; a refused login leaves
    // no metric to wait for (it is only logged).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        metric_value(&node, r#"herald_kafka_consumed_total{consumer="g-wrong"}"#).await,
        0.0
    );
}

/// Records skipped for good (malformed, oversized, refused) are produced to the dead-letter
/// topic as they were (key, value, headers) plus Herald's headers saying why and where from,
/// and only once the topic acknowledged them are their offsets committed. While the topic does
/// not exist (and may not be created automatically) nothing is committed and the good record
/// behind them waits; once it is created, everything flows.
#[tokio::test]
async fn skipped_records_reach_the_dead_letter_topic_before_their_offsets_commit() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};

    let kafka = kafka().await;
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "cmds", 1).await;
    let file = common::config_file(
        "herald.toml",
        &format!(
            "[limits]\nmax_api_body_bytes = 1000\n\
             [consumers.kafka]\nbrokers = \"{bootstrap}\"\ntopics = \"cmds\"\n\
             group_id = \"g-dead\"\ndead_letter_topic = \"cmds-dead\"\n\
             stats_interval_ms = 500\nsession_timeout_ms = 6000\n\
             [consumers.kafka.properties]\n\"allow.auto.create.topics\" = \"false\"\n\
             \"message.timeout.ms\" = \"5000\"\n"
        ),
    );
    let node = Node::start(&["--dev", "--config", &*file], &[]).await;
    let mut client = node.connected(&["good"]).await;

    let p = producer(&bootstrap);
    let oversized = publish("good", json!({"pad": "x".repeat(1000)}));
    let records = [
        ("k0", "not JSON".to_owned(), "malformed"),
        ("k1", oversized, "oversized"),
        ("k2", publish("nowhere:x", json!(1)), "refused"),
        ("k3", publish("good", json!({"i": 0})), ""),
    ];
    for (key, value, _) in &records {
        p.send(
            FutureRecord::to("cmds")
                .partition(0)
                .key(*key)
                .payload(value)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "trace",
                    value: Some(*key),
                })),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce: {e}"));
    }

    // No dead-letter topic yet: producing the first record there fails and is tried again, the
    // record stays uncommitted, and the good one behind it waits.
    let retries = r#"herald_kafka_retries_total{consumer="g-dead"}"#;
    eventually_ok(
        DEADLINE,
        "a failed dead-letter produce, retried",
        || async {
            match metric_value(&node, retries).await {
                n if n >= 1.0 => Ok(()),
                n => Err(format!("{retries} is {n}")),
            }
        },
    )
    .await;
    // (Pings may come meanwhile; no publication.)
    while let Some(m) = client.next_within(Duration::from_secs(2)).await {
        assert!(
            m.get("pub").is_none(),
            "the good record waits behind the one not yet dead-lettered: {m}"
        );
    }
    assert_eq!(
        committed(&bootstrap, "g-dead", "cmds").await,
        None,
        "nothing committed before the dead-letter topic acknowledged"
    );

    create_topic(&bootstrap, "cmds-dead", 1).await;
    let seen = collect(&mut client, |s| count(s) >= 1).await;
    assert_eq!(indexes(&seen["good"]), [0]);
    eventually_ok(
        DEADLINE,
        "every offset committed once dead-lettered (offset 4)",
        || async {
            match committed(&bootstrap, "g-dead", "cmds").await {
                Some(4) => Ok(()),
                other => Err(format!("committed {other:?}")),
            }
        },
    )
    .await;
    for reason in ["malformed", "oversized", "refused"] {
        metric_reaches(
            &node,
            &format!(r#"herald_kafka_failed_total{{consumer="g-dead",reason="{reason}"}}"#),
            1.0,
        )
        .await;
    }

    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "check-dead")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    reader.subscribe(&["cmds-dead"]).expect("subscribe");
    let mut dead = Vec::new();
    while dead.len() < 3 {
        let m = tokio::time::timeout(DEADLINE, reader.recv())
            .await
            .expect("the dead-letter records within the deadline")
            .expect("read the dead-letter topic");
        dead.push(m.detach());
    }
    for (offset, (m, (key, value, reason))) in dead.iter().zip(&records).enumerate() {
        assert_eq!(m.key(), Some(key.as_bytes()), "record {offset}");
        assert_eq!(m.payload(), Some(value.as_bytes()), "record {offset}");
        let headers: BTreeMap<String, String> = m
            .headers()
            .expect("headers")
            .iter()
            .map(|h| {
                let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                (h.key.to_owned(), value.into_owned())
            })
            .collect();
        assert_eq!(headers["trace"], *key, "the record's own header is kept");
        assert_eq!(headers["herald.reason"], *reason, "{headers:?}");
        assert_eq!(headers["herald.source.topic"], "cmds");
        assert_eq!(headers["herald.source.partition"], "0");
        assert_eq!(headers["herald.source.offset"], offset.to_string());
        assert_eq!(headers["herald.source.group"], "g-dead");
        assert!(!headers["herald.error"].is_empty(), "{headers:?}");
    }
    assert!(
        headers_error(&dead[1]).contains("limits.max_api_body_bytes"),
        "{}",
        headers_error(&dead[1])
    );
}

/// The `herald.error` header of a dead-lettered record.
fn headers_error(m: &rdkafka::message::OwnedMessage) -> String {
    use rdkafka::message::{Headers, Message};
    m.headers()
        .and_then(|h| h.iter().find(|h| h.key == "herald.error"))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// The offset `group` committed on partition 0 of `topic` (none when it committed nothing), read
/// without joining the group.
async fn committed(bootstrap: &str, group: &str, topic: &str) -> Option<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let reader: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &group)
            .create()
            .expect("consumer");
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&topic, 0);
        let offsets = reader
            .committed_offsets(partitions, Duration::from_secs(10))
            .expect("read the committed offsets");
        match offsets.elements()[0].offset() {
            Offset::Offset(n) => Some(n),
            _ => None,
        }
    })
    .await
    .expect("committed offsets")
}
