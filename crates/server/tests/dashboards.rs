//! The Grafana dashboard (`deploy/grafana/herald.json`), the Prometheus alert rules
//! (`deploy/prometheus/herald-alerts.yml`) and their unit tests' input series
//! (`herald-alerts.test.yml`) name only metrics that live nodes export (docs/deploy.md,
//! "Monitoring"). Every `herald_…` name in those files must be on the `/metrics` of one of the
//! real nodes started here, after a little traffic: one on Redis with a subscribe hook and a
//! PostgreSQL outbox consumer, one on NATS (the NATS-only broker metrics), and, with the `kafka`
//! feature, one consuming a Kafka topic (`herald_kafka_*` series appear only once a consumer has
//! partitions or has skipped a record). A histogram's name counts with or without its `_bucket`,
//! `_sum` or `_count` suffix. Every expression must also name its metrics with the `herald_`
//! prefix, so that a misspelt prefix is not skipped by the name check.
//!
//! `scripts/monitoring-test.sh` checks the rest: `promtool check rules` and `promtool test rules`,
//! and that each dashboard panel has a data source and targets.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use herald_testkit::eventually_ok;
use herald_testkit::hooks::HookBackend;
use herald_testkit::nats::NatsServer;
use herald_testkit::postgres::PostgresServer;
use herald_testkit::redis::RedisServer;
use serde_json::{json, Value};

const DASHBOARD: &str = "deploy/grafana/herald.json";
const RULES: &str = "deploy/prometheus/herald-alerts.yml";
const RULE_TESTS: &str = "deploy/prometheus/herald-alerts.test.yml";

/// How long the test waits for a series that appears after an event (a consumer's first poll,
/// a Kafka partition's first statistics).
const DEADLINE: Duration = Duration::from_secs(60);

/// Identifiers with an underscore that expressions may use besides metric names: PromQL and
/// Grafana functions (label names and keywords have no underscore; `$__rate_interval` is a
/// variable).
const FUNCTIONS: [&str; 2] = ["histogram_quantile", "label_values"];

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `herald_…` identifier in `text` (descriptions and comments included).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("herald_") {
        let before = rest[..at].chars().next_back();
        let len = rest[at..]
            .find(|c: char| !is_name_char(c))
            .unwrap_or(rest.len() - at);
        if !before.is_some_and(|c| is_name_char(c) || c == '$') {
            names.insert(rest[at..at + len].to_owned());
        }
        rest = &rest[at + len..];
    }
    names
}

/// The identifiers of `expr` outside quoted strings and `$variables` that contain an underscore
/// but are neither `herald_…` names nor a known function: a metric name with a misspelt prefix.
fn suspicious_tokens(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expr.char_indices().peekable();
    let mut quote: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        if let Some(q) = quote {
            if c == '\\' {
                chars.next();
            } else if c == q {
                quote = None;
            }
            continue;
        }
        if c == '"' || c == '\'' || c == '`' {
            quote = Some(c);
            continue;
        }
        if !is_name_char(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if !is_name_char(d) {
                break;
            }
            end = j + d.len_utf8();
            chars.next();
        }
        let token = &expr[i..end];
        let variable = expr[..i].ends_with('$');
        let word = c.is_ascii_alphabetic() || c == '_';
        if word
            && !variable
            && token.contains('_')
            && !token.starts_with("herald_")
            && !FUNCTIONS.contains(&token)
        {
            out.push(token.to_owned());
        }
    }
    out
}

/// The PromQL of the dashboard: each panel's targets (rows' panels included) and the template
/// variables' queries.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                out.push(
                    target["expr"]
                        .as_str()
                        .unwrap_or_else(|| panic!("a target without expr: {target}"))
                        .to_owned(),
                );
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let query = &var["query"];
            out.push(
                query["query"]
                    .as_str()
                    .or(query.as_str())
                    .expect("a query variable's query")
                    .to_owned(),
            );
        }
    }
    out
}

/// The `expr:` of each rule in a rules file: the rest of the line, or a block scalar's lines
/// (indented deeper than the key); and each unit test's `series:`.
fn yaml_exprs(yaml: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let key = line.trim_start().trim_start_matches("- ");
        let value = key
            .strip_prefix("expr:")
            .or_else(|| key.strip_prefix("series:"));
        i += 1;
        let Some(value) = value.map(str::trim) else {
            continue;
        };
        if value.starts_with('|') || value.starts_with('>') {
            let mut block = String::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line))
            {
                block.push_str(lines[i].trim());
                block.push('\n');
                i += 1;
            }
            out.push(block);
        } else {
            let unquoted = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .or_else(|| value.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
                .unwrap_or(value);
            out.push(unquoted.to_owned());
        }
    }
    out
}

/// What expositions declare: the names of their samples, and the names of their histograms.
#[derive(Default)]
struct Exposed {
    samples: BTreeSet<String>,
    histograms: BTreeSet<String>,
}

impl Exposed {
    fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                if let (Some(name), Some("histogram" | "gaugehistogram")) =
                    (words.next(), words.next())
                {
                    self.histograms.insert(name.to_owned());
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                self.samples.insert(line[..end].to_owned());
            }
        }
    }

    /// Whether `name` is a sample's name, or a histogram's with or without a series suffix.
    fn has(&self, name: &str) -> bool {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        self.samples.contains(name)
            || self.histograms.contains(name)
            || self.histograms.contains(base)
    }

    /// The names in `names` that no exposition has.
    fn missing<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        names
            .into_iter()
            .filter(|n| !self.has(n))
            .cloned()
            .collect()
    }
}

/// Every file's `herald_…` names, and its expressions checked: each has a metric named with the
/// `herald_` prefix (or Prometheus' own `up`) and no misspelt prefix.
fn names_used() -> BTreeSet<String> {
    let dashboard_text = repo_file(DASHBOARD);
    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("the dashboard is JSON");
    let rules = repo_file(RULES);
    let rule_tests = repo_file(RULE_TESTS);
    let exprs = [
        (DASHBOARD, dashboard_exprs(&dashboard)),
        (RULES, yaml_exprs(&rules)),
        (RULE_TESTS, yaml_exprs(&rule_tests)),
    ];
    let alerts = rules.matches("- alert:").count();
    assert!(alerts >= 9, "{RULES}: {alerts} alerts");
    assert_eq!(exprs[1].1.len(), alerts, "{RULES}: one expr per alert");
    assert!(exprs[0].1.len() >= 20, "{DASHBOARD}: {:?}", exprs[0].1);
    assert!(exprs[2].1.len() >= 20, "{RULE_TESTS}: {:?}", exprs[2].1);
    for (file, exprs) in &exprs {
        for expr in exprs {
            let bad = suspicious_tokens(expr);
            assert!(bad.is_empty(), "{file}: {bad:?} in {expr:?}");
            assert!(
                !metric_names(expr).is_empty() || expr.starts_with("up{"),
                "{file}: no herald_ metric in {expr:?}"
            );
        }
    }
    let mut names = metric_names(&dashboard_text);
    names.extend(metric_names(&rules));
    names.extend(metric_names(&rule_tests));
    names
}

async fn scrape(node: &Node) -> String {
    let (status, body) = node.http("GET", "/metrics", None, None).await;
    assert_eq!(status, 200, "/metrics on {}", node.name);
    body.as_str().expect("text").to_owned()
}

/// Wait until `node`'s /metrics has a sample named `name`.
async fn series_appears(node: &Node, name: &str) {
    eventually_ok(DEADLINE, &format!("{name} on {}", node.name), || async {
        let text = scrape(node).await;
        let mut exposed = Exposed::default();
        exposed.add(&text);
        if exposed.samples.contains(name) {
            Ok(())
        } else {
            Err(format!("not in {:?}", exposed.samples))
        }
    })
    .await;
}

/// Publish `n` publications to `channel` through `node` and read them on a subscriber; then
/// subscribe with `since`, once where the node can recover and once where it cannot.
async fn traffic(node: &Node, channels: &[&str]) {
    let mut client = node.connected(channels).await;
    let channel = channels[0];
    let mut epoch = String::new();
    for i in 0..3 {
        let reply = node.publish(channel, json!({ "i": i })).await;
        epoch = reply["epoch"].as_str().expect("epoch").to_owned();
    }
    let offsets = client.offsets(channel, 3, Duration::from_secs(15)).await;
    assert_eq!(offsets.len(), 3, "{offsets:?}");
    let recovering = node
        .subscriber(json!({ channel: { "since": { "epoch": epoch, "offset": 1 } } }))
        .await;
    assert_eq!(
        recovering.connect_reply["subs"][channel]["recovered"], true,
        "{}",
        recovering.connect_reply
    );
    let lost = node
        .subscriber(json!({ channel: { "since": { "epoch": "gone", "offset": 1 } } }))
        .await;
    assert_eq!(
        lost.connect_reply["subs"][channel]["recovered"], false,
        "{}",
        lost.connect_reply
    );
}

#[tokio::test]
async fn every_metric_of_the_dashboard_and_alerts_is_on_a_live_node() {
    let names = names_used();
    #[cfg(feature = "kafka")]
    let kafka = tokio::task::spawn_blocking(herald_testkit::kafka::KafkaServer::start);
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("start PostgreSQL");
    let redis = RedisServer::start();
    let nats = NatsServer::start();
    let hooks = HookBackend::start().await;
    let config = config_file(
        "herald.toml",
        &format!(
            "broker_url = \"{}\"\n\
             [proxy]\nsubscribe_url = \"{}\"\ntimeout_ms = 3000\n\
             [[namespaces]]\nname = \"hooked\"\nsubscribe = \"anonymous\"\n\
             subscribe_proxy = true\nhistory_size = 10\n\
             [consumers.postgres.main]\ndsn = \"{}\"\ncreate_table = true\n\
             poll_interval_ms = 100\n",
            redis.url(),
            hooks.url("subscribe"),
            pg.dsn()
        ),
    );
    let on_redis = Node::start(
        &["--dev", "--config", &config],
        &[("HERALD_NODE_NAME", "on-redis")],
    )
    .await;
    let on_nats = Node::on_broker("on-nats", &nats.url()).await;

    traffic(&on_redis, &["chat", "hooked:room"]).await;
    traffic(&on_nats, &["chat"]).await;
    series_appears(&on_redis, "herald_consumer_lag").await;
    let calls = on_redis.metric("herald_proxy_calls_total").await;
    assert!(calls >= 1.0, "the subscribe hook was called ({calls})");

    let mut exposed = Exposed::default();
    for node in [&on_redis, &on_nats] {
        exposed.add(&scrape(node).await);
    }

    #[cfg(feature = "kafka")]
    let (_kafka, _on_kafka) = {
        let kafka = kafka.await.expect("start Kafka");
        let node = kafka_traffic(&kafka).await;
        exposed.add(&scrape(&node).await);
        (kafka, node)
    };
    #[cfg(not(feature = "kafka"))]
    let names: BTreeSet<String> = {
        eprintln!("built without the kafka feature: herald_kafka_* names are not checked");
        names
            .into_iter()
            .filter(|n| !n.starts_with("herald_kafka_"))
            .collect()
    };

    let missing = exposed.missing(&names);
    assert!(
        missing.is_empty(),
        "used in {DASHBOARD}, {RULES} or {RULE_TESTS} but on no node's /metrics: {missing:?}\n\
         exported: {:?}",
        exposed.samples
    );
    eprintln!("{} metric names checked: {names:?}", names.len());
}

/// A node consuming a one-partition topic that holds a record it skips (not a command): its
/// `herald_kafka_failed_total` and, once librdkafka reports the partition, `herald_kafka_lag`.
#[cfg(feature = "kafka")]
async fn kafka_traffic(kafka: &herald_testkit::kafka::KafkaServer) -> Node {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::ClientConfig;

    let bootstrap = kafka.bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client");
    let topic = NewTopic::new("dash", 1, TopicReplication::Fixed(1));
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
            ("HERALD_NODE_NAME", "on-kafka"),
            ("HERALD_CONSUMERS__KAFKA__BROKERS", &bootstrap),
            ("HERALD_CONSUMERS__KAFKA__TOPICS", "dash"),
            ("HERALD_CONSUMERS__KAFKA__GROUP_ID", "dash"),
            ("HERALD_CONSUMERS__KAFKA__STATS_INTERVAL_MS", "500"),
        ],
    )
    .await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::<(), str>::to("dash")
                .partition(0)
                .payload("not a command"),
            Duration::from_secs(60),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce: {e}"));
    series_appears(&node, "herald_kafka_failed_total").await;
    series_appears(&node, "herald_kafka_lag").await;
    node
}

/// The check itself: a misspelt name, a counter named without `_total` and a misspelt prefix are
/// reported; a histogram's name is accepted with and without its suffixes.
#[test]
fn the_check_reports_a_misspelt_name() {
    let mut exposed = Exposed::default();
    exposed.add(
        "# TYPE herald_slow_consumers counter\nherald_slow_consumers_total 0\n\
         # TYPE herald_publish_seconds histogram\nherald_publish_seconds_sum 0.0\n\
         herald_publish_seconds_count 0\nherald_publish_seconds_bucket{le=\"+Inf\"} 0\n# EOF\n",
    );
    let expr = "sum by (instance) (rate(herald_slow_consumer_total[5m])) \
                + rate(herald_slow_consumers_total{instance=~\"$instance\"}[$__rate_interval]) \
                + herald_slow_consumers + histogram_quantile(0.99, \
                rate(herald_publish_seconds_bucket[5m])) + herald_publish_seconds_sum";
    let names = metric_names(expr);
    assert_eq!(
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        [
            "herald_publish_seconds_bucket",
            "herald_publish_seconds_sum",
            "herald_slow_consumer_total",
            "herald_slow_consumers",
            "herald_slow_consumers_total"
        ]
    );
    assert_eq!(
        exposed.missing(&names),
        ["herald_slow_consumer_total", "herald_slow_consumers"]
    );
    assert!(exposed.has("herald_publish_seconds"));
    assert!(suspicious_tokens(expr).is_empty());
    assert_eq!(
        suspicious_tokens(
            "rate(heral_deliveries_total{job=\"x_y\"}[5m]) / herald_deliveries_total"
        ),
        ["heral_deliveries_total"]
    );
}

/// The expressions are read from the files as written: a rule's block scalar whole, a unit
/// test's series without its quotes, every dashboard target.
#[test]
fn expressions_are_read_from_the_files() {
    let yaml = r#"groups:
  - name: g
    rules:
      - alert: A
        expr: |
          rate(herald_a_total[5m])
            > 0
        for: 1m
      - alert: B
        expr: up{job="herald"} == 0
    input_series:
      - series: 'herald_b{x="1"}'
"#;
    assert_eq!(
        yaml_exprs(yaml),
        [
            "rate(herald_a_total[5m])\n> 0\n",
            "up{job=\"herald\"} == 0",
            "herald_b{x=\"1\"}"
        ]
    );
    let dashboard = json!({
        "panels": [
            {"type": "row", "panels": [{"targets": [{"expr": "herald_c"}]}]},
            {"targets": [{"expr": "herald_d"}, {"expr": "herald_e"}]}
        ],
        "templating": {"list": [
            {"type": "datasource", "query": "prometheus"},
            {"type": "query", "query": {"query": "label_values(herald_f, instance)"}}
        ]}
    });
    assert_eq!(
        dashboard_exprs(&dashboard),
        [
            "herald_c",
            "herald_d",
            "herald_e",
            "label_values(herald_f, instance)"
        ]
    );
}
