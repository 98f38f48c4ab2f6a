//! The Kafka consumer: Herald joins a consumer group on configured topics and runs each record's
//! value, a publish or broadcast command in the HTTP API's shape, through the same executor as
//! `/api/publish` and `/api/broadcast` (see docs/consumers-kafka.md).
//!
//! Delivery: each record publishes with the idempotency key `kafka:<topic>:<partition>:<offset>`
//! (unless its command carries its own key), and its offset is stored for commit only after the
//! publish succeeded; the stored offsets are committed every `commit_interval_ms`, on a rebalance
//! and on shutdown. A crash between publish and commit redelivers records whose keys the broker
//! still remembers, so no channel gets one twice. Records of one partition are published one
//! after another; partitions of one batch run side by side. A record that is not a command (or
//! whose payload is over the API's body limit, or that the node refuses) is logged, counted,
//! produced to the `dead_letter_topic` when one is configured, and skipped (its offset
//! committed, after the dead-letter topic acknowledged it), so it never blocks its partition; a
//! retryable failure (broker down) is retried with backoff, never skipped.
//!
//! Client: `rdkafka` (librdkafka, built from source by cargo, linked with the system's OpenSSL).
//! It is the maintained Rust client with full consumer-group support (group membership,
//! rebalancing, offset commits) against Kafka 4.x, SASL PLAIN/SCRAM and TLS; the pure-Rust ones
//! lack groups (`rskafka`) or are young and thinly kept (`samsa`).
//!
//! The client is built only with the `kafka` cargo feature (on by default); a build without it
//! refuses a config that names a Kafka consumer at start-up ([`ensure_supported`]).

use std::collections::HashMap;
use std::time::Duration;

use herald_broker::Backoff;
use herald_core::config::{lenient, Limits};
use herald_protocol::ErrorCode;
use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};

use herald_core::namespace::Namespaces;
use herald_protocol::command::json_error_reason;

use crate::batch::Batch;
use crate::centrifugo::command::{action, decode, Action, Envelope};
use crate::publishing::{self, check_idempotency_key, Command, PublishError};

#[cfg(feature = "kafka")]
mod client;
#[cfg(feature = "kafka")]
mod dead_letter;

#[cfg(feature = "kafka")]
pub use client::KafkaConsumer;
#[cfg(feature = "kafka")]
pub use dead_letter::{ERROR, GROUP, OFFSET, PARTITION, REASON, TOPIC};

/// Whether this build has the Kafka client (the `kafka` cargo feature).
pub const SUPPORTED: bool = cfg!(feature = "kafka");

/// Refuse `configured` Kafka consumers in a build without the client (`supported` false): a
/// consumer the config asks for is never silently left out.
pub fn ensure_supported(configured: usize, supported: bool) -> anyhow::Result<()> {
    if configured > 0 && !supported {
        anyhow::bail!(
            "consumers.kafka: this build has no Kafka support: rebuild with --features kafka"
        );
    }
    Ok(())
}

/// One Kafka consumer: `[consumers.kafka]`, or one `[[consumers.kafka]]` entry of several.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Name in logs and metrics (default: the group id).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub name: Option<String>,
    /// Bootstrap brokers: `host:port` list, or one comma-separated string.
    #[serde(deserialize_with = "lenient::string_list")]
    pub brokers: Vec<String>,
    /// Topics to consume (they must exist; Herald does not create them).
    #[serde(deserialize_with = "lenient::string_list")]
    pub topics: Vec<String>,
    /// Consumer group: nodes with the same group share the topics' partitions.
    #[serde(default = "default_group", deserialize_with = "lenient::string")]
    pub group_id: String,
    /// Client id seen by the brokers (default: `herald-<node_name>`).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub client_id: Option<String>,
    /// Where a group without a committed offset starts: `earliest` (default) or `latest`.
    #[serde(default = "default_reset", deserialize_with = "lenient::string")]
    pub auto_offset_reset: String,
    /// `plaintext` (default), `ssl`, `sasl_plaintext` or `sasl_ssl`.
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub security_protocol: Option<String>,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub sasl_mechanism: Option<String>,
    /// SASL user name.
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub sasl_username: Option<String>,
    /// SASL password (never logged).
    #[serde(default)]
    pub sasl_password: Option<Secret>,
    /// CA certificates (PEM file) to verify the brokers with (default: the system's).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub ssl_ca_location: Option<String>,
    /// Client certificate (PEM file), for brokers that ask for one.
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub ssl_certificate_location: Option<String>,
    /// Client private key (PEM file).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub ssl_key_location: Option<String>,
    /// Password of the client private key.
    #[serde(default)]
    pub ssl_key_password: Option<Secret>,
    /// Check that the broker's certificate names its host (default true).
    #[serde(default = "yes")]
    pub ssl_verify_hostname: bool,
    /// Most records taken into one batch (partitions of a batch publish side by side).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Milliseconds between commits of the offsets of published records.
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// First wait before a retryable failure is retried; it doubles up to `retry_max_ms`.
    #[serde(default = "default_retry_initial_ms")]
    pub retry_initial_ms: u64,
    /// Longest wait between two retries of one record.
    #[serde(default = "default_retry_max_ms")]
    pub retry_max_ms: u64,
    /// A node silent this long leaves the group and its partitions go to the others (the
    /// brokers allow 6000 to 300000 by default).
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u64,
    /// Milliseconds between lag readings (`herald_kafka_lag`).
    #[serde(default = "default_stats_interval_ms")]
    pub stats_interval_ms: u64,
    /// Topic that records skipped for good (malformed, oversized, refused) are produced to,
    /// with headers saying why and where they came from (none: they are only logged).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub dead_letter_topic: Option<String>,
    /// Further librdkafka properties, passed as they are (e.g. `"session.timeout.ms" = "10000"`).
    #[serde(default)]
    pub properties: HashMap<String, String>,
    /// Record header naming the API method (Centrifugo's `method_header`): a record carrying it
    /// holds that method's request body as its value, not an envelope. Empty: not looked at.
    #[serde(
        default = "default_method_header",
        deserialize_with = "lenient::string"
    )]
    pub method_header: String,
    /// Centrifugo's publication data mode: each record's value is the publication's data, its
    /// channels and idempotency key in headers.
    #[serde(default)]
    pub publication_data_mode: PublicationDataMode,
}

/// `[consumers.kafka.publication_data_mode]`, as Centrifugo's: the record's value is published
/// as it is to the channels its `channels_header` lists (comma-separated).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicationDataMode {
    /// On or off (default off).
    #[serde(default)]
    pub enabled: bool,
    /// Header with the channels, comma-separated.
    #[serde(
        default = "default_channels_header",
        deserialize_with = "lenient::string"
    )]
    pub channels_header: String,
    /// Header with the publication's idempotency key (absent: the record's own key,
    /// `kafka:<topic>:<partition>:<offset>`).
    #[serde(
        default = "default_idempotency_key_header",
        deserialize_with = "lenient::string"
    )]
    pub idempotency_key_header: String,
    /// Header with Centrifugo's delta flag: read and accepted (subscribers get the whole data).
    #[serde(default = "default_delta_header", deserialize_with = "lenient::string")]
    pub delta_header: String,
}

impl Default for PublicationDataMode {
    fn default() -> Self {
        PublicationDataMode {
            enabled: false,
            channels_header: default_channels_header(),
            idempotency_key_header: default_idempotency_key_header(),
            delta_header: default_delta_header(),
        }
    }
}

fn default_method_header() -> String {
    "centrifugo-method".into()
}
fn default_channels_header() -> String {
    "centrifugo-channels".into()
}
fn default_idempotency_key_header() -> String {
    "centrifugo-idempotency-key".into()
}
fn default_delta_header() -> String {
    "centrifugo-delta".into()
}

/// A password: read like any other text, shown as `***` by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::string(d).map(Secret)
    }
}

fn default_group() -> String {
    "herald".into()
}
fn default_reset() -> String {
    "earliest".into()
}
fn yes() -> bool {
    true
}
fn default_batch_size() -> usize {
    500
}
fn default_commit_interval_ms() -> u64 {
    1000
}
fn default_retry_initial_ms() -> u64 {
    100
}
fn default_retry_max_ms() -> u64 {
    10_000
}
fn default_session_timeout_ms() -> u64 {
    45_000
}
fn default_stats_interval_ms() -> u64 {
    5000
}

/// `[consumers.kafka]` (one consumer) or `[[consumers.kafka]]` (several).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum KafkaConfigs {
    /// One table.
    One(Box<KafkaConfig>),
    /// An array of tables.
    Many(Vec<KafkaConfig>),
}

impl KafkaConfigs {
    /// Every configured consumer.
    pub fn into_vec(self) -> Vec<KafkaConfig> {
        match self {
            KafkaConfigs::One(c) => vec![*c],
            KafkaConfigs::Many(v) => v,
        }
    }
}

/// A Kafka consumer's config that cannot work: `consumers.kafka "<name>": <problem>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("consumers.kafka {name:?}: {problem}")]
pub struct InvalidKafka {
    /// The consumer's name.
    pub name: String,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with a Kafka consumer's config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A list or name that may not be empty.
    #[error("{0} is empty")]
    Empty(&'static str),
    /// `auto_offset_reset` is neither value.
    #[error("auto_offset_reset must be earliest or latest")]
    OffsetReset,
    /// A size or interval of 0.
    #[error("batch_size, retry_initial_ms and commit_interval_ms must be positive")]
    NotPositive,
    /// `dead_letter_topic` is no topic name, or one of the consumed topics.
    #[error(
        "dead_letter_topic must be a topic name (at most 249 characters) other than the consumed topics"
    )]
    DeadLetterTopic,
    /// `properties` sets a key Herald sets itself.
    #[error("property {0:?} is Herald's own (set brokers or group_id instead)")]
    OwnProperty(String),
}

/// Properties Herald sets itself: `properties` may not change them, or the delivery guarantee
/// would not hold.
const OWN_PROPERTIES: &[&str] = &[
    "enable.auto.commit",
    "enable.auto.offset.store",
    "group.id",
    "bootstrap.servers",
    "session.timeout.ms",
];

impl KafkaConfig {
    /// The consumer's name in logs and metrics.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.group_id)
    }

    /// Waits between retries of one record (a publish, or producing it to the dead-letter
    /// topic): `retry_initial_ms` doubling up to `retry_max_ms`, exactly (no jitter: a
    /// consumer's partitions are spread over nodes already).
    pub fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.retry_initial_ms),
            Duration::from_millis(self.retry_max_ms),
        )
        .exact()
    }

    /// Refuse what cannot work, before anything connects.
    pub fn validate(&self) -> Result<(), InvalidKafka> {
        let invalid = |problem| {
            Err(InvalidKafka {
                name: self.name().to_owned(),
                problem,
            })
        };
        if self.brokers.is_empty() {
            return invalid(Problem::Empty("brokers"));
        }
        if self.topics.is_empty() {
            return invalid(Problem::Empty("topics"));
        }
        if self.group_id.is_empty() {
            return invalid(Problem::Empty("group_id"));
        }
        if self.publication_data_mode.enabled
            && self.publication_data_mode.channels_header.is_empty()
        {
            return invalid(Problem::Empty("publication_data_mode.channels_header"));
        }
        if !matches!(self.auto_offset_reset.as_str(), "earliest" | "latest") {
            return invalid(Problem::OffsetReset);
        }
        if self.batch_size == 0 || self.retry_initial_ms == 0 || self.commit_interval_ms == 0 {
            return invalid(Problem::NotPositive);
        }
        if self
            .dead_letter_topic
            .as_deref()
            .is_some_and(|t| t.is_empty() || t.len() > 249 || self.topics.iter().any(|s| s == t))
        {
            return invalid(Problem::DeadLetterTopic);
        }
        if let Some(p) = self
            .properties
            .keys()
            .find(|k| OWN_PROPERTIES.contains(&k.as_str()))
        {
            return invalid(Problem::OwnProperty(p.clone()));
        }
        Ok(())
    }
}

/// The idempotency key of a record: `kafka:<topic>:<partition>:<offset>`, or, for a topic name
/// too long for the 128-character limit, the topic's SHA-256 prefix in its place.
pub fn record_key(topic: &str, partition: i32, offset: i64) -> String {
    let key = format!("kafka:{topic}:{partition}:{offset}");
    if check_idempotency_key(&key).is_ok() {
        return key;
    }
    let digest = Sha256::digest(topic.as_bytes());
    format!("kafka:#{}:{partition}:{offset}", hex::encode(&digest[..16]))
}

/// The command a record's value holds: the envelope `{"method", "payload"}` itself, or the same
/// envelope inside a JSON string (a CDC tool that kept the column as text) or inside a
/// `{"schema", "payload"}` wrapper (Kafka Connect's JSON converter with schemas on). A payload
/// over the API's body limit for its method is refused with error 106.
///
/// Payloads are decoded by [`crate::centrifugo::command::decode`], which also takes
/// Centrifugo's request fields; an envelope's payload may be a JSON string holding the body.
pub fn parse_record(
    value: Option<&[u8]>,
    limits: &Limits,
    namespaces: &Namespaces,
) -> Result<Record, PublishError> {
    let Some(value) = value else {
        return Err(PublishError::refused(
            ErrorCode::BadRequest,
            "the record has no value (a tombstone?)",
        ));
    };
    let envelope = unwrap_value(value);
    let envelope = envelope.as_deref().map(str::as_bytes).unwrap_or(value);
    let e: Envelope = serde_json::from_slice(envelope).map_err(|e| {
        PublishError::refused(
            ErrorCode::BadRequest,
            format!("bad JSON body: {}", json_error_reason(&e)),
        )
    })?;
    let payload = e.payload_text()?;
    publishing::check_body_size(limits, &e.method, payload.len())?;
    decode_record(&e.method, payload.as_bytes(), limits, namespaces)
}

/// What a record asks for.
#[derive(Debug)]
pub enum Record {
    /// A publish or broadcast.
    Publish(Command),
    /// Centrifugo's `subscribe`, `unsubscribe` or `disconnect`: a message to every node.
    Control(Action),
    /// Many commands (crate::batch), each published under its own key.
    Batch(Batch),
}

fn decode_record(
    method: &str,
    payload: &[u8],
    limits: &Limits,
    namespaces: &Namespaces,
) -> Result<Record, PublishError> {
    if method == "batch" {
        return crate::batch::parse(payload, limits).map(Record::Batch);
    }
    match action(method, payload, namespaces)? {
        Some(action) => Ok(Record::Control(action)),
        None => decode(method, payload).map(Record::Publish),
    }
}

/// The command a record holds, by the consumer's mode: with `publication_data_mode` on, the
/// value is the data for the channels in its header; a record with the `method_header` holds
/// that method's body; any other holds an envelope ([`parse_record`]). `headers` are the
/// record's, in order (the first of a name counts).
pub fn parse_message(
    value: Option<&[u8]>,
    headers: &[(&str, &[u8])],
    config: &KafkaConfig,
    limits: &Limits,
    namespaces: &Namespaces,
) -> Result<Record, PublishError> {
    let header = |name: &str| {
        (!name.is_empty())
            .then(|| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v))
            .flatten()
    };
    let text = |name: &str| -> Result<Option<&str>, PublishError> {
        header(name)
            .map(|v| {
                std::str::from_utf8(v).map_err(|_| {
                    PublishError::refused(
                        ErrorCode::BadRequest,
                        format!("header {name:?} is not UTF-8"),
                    )
                })
            })
            .transpose()
    };
    let mode = &config.publication_data_mode;
    if mode.enabled {
        let channels: Vec<&str> = text(&mode.channels_header)?
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if channels.is_empty() {
            return Err(PublishError::refused(
                ErrorCode::BadRequest,
                format!("no channels in header {:?}", mode.channels_header),
            ));
        }
        let Some(value) = value else {
            return Err(PublishError::refused(
                ErrorCode::BadRequest,
                "the record has no value (a tombstone?)",
            ));
        };
        let data: Box<serde_json::value::RawValue> =
            serde_json::from_slice(value).map_err(|_| {
                PublishError::refused(
                    ErrorCode::BadRequest,
                    "the record's value is not JSON: Herald publications are JSON",
                )
            })?;
        let method = if channels.len() == 1 {
            "publish"
        } else {
            "broadcast"
        };
        publishing::check_body_size(limits, method, value.len())?;
        let mut body = serde_json::json!({ "data": data });
        match channels.as_slice() {
            [one] => body["channel"] = serde_json::json!(one),
            many => body["channels"] = serde_json::json!(many),
        }
        if let Some(key) = text(&mode.idempotency_key_header)?.filter(|k| !k.is_empty()) {
            body["idempotency_key"] = serde_json::json!(key);
        }
        if let Some(delta) = text(&mode.delta_header)?.filter(|d| !d.is_empty()) {
            let delta: bool = delta.parse().map_err(|_| {
                PublishError::refused(
                    ErrorCode::BadRequest,
                    format!("header {:?} is not true or false", mode.delta_header),
                )
            })?;
            body["delta"] = serde_json::json!(delta);
        }
        return decode(method, body.to_string().as_bytes()).map(Record::Publish);
    }
    if let Some(method) = text(&config.method_header)?.filter(|m| !m.is_empty()) {
        let value = value.unwrap_or_default();
        publishing::check_body_size(limits, method, value.len())?;
        return decode_record(method, value, limits, namespaces);
    }
    parse_record(value, limits, namespaces)
}

/// The envelope's text when `value` wraps it (at most two levels: a string inside a wrapper).
fn unwrap_value(value: &[u8]) -> Option<String> {
    let first = value.iter().find(|b| !b.is_ascii_whitespace())?;
    match first {
        b'"' => {
            let text: String = serde_json::from_slice(value).ok()?;
            Some(unwrap_value(text.as_bytes()).unwrap_or(text))
        }
        b'{' => {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Wrapper<'a> {
                #[allow(dead_code)]
                schema: &'a serde_json::value::RawValue,
                #[serde(borrow)]
                payload: &'a serde_json::value::RawValue,
            }
            let w: Wrapper<'_> = serde_json::from_slice(value).ok()?;
            let inner = w.payload.get();
            Some(unwrap_value(inner.as_bytes()).unwrap_or_else(|| inner.to_owned()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_record_and_fit_the_limit() {
        assert_eq!(record_key("orders", 2, 17), "kafka:orders:2:17");
        let long = "t".repeat(249);
        let key = record_key(&long, 0, i64::MAX);
        assert!(check_idempotency_key(&key).is_ok(), "{key}");
        assert_ne!(key, record_key(&"u".repeat(249), 0, i64::MAX));
    }

    fn ns() -> Namespaces {
        Namespaces::from_config(&herald_core::Config::default())
    }

    #[test]
    fn records_hold_envelopes_plain_or_wrapped() {
        let env = r#"{"method":"publish","payload":{"channel":"a","data":1}}"#;
        let limits = Limits::default();
        let ns = ns();
        assert!(parse_record(Some(env.as_bytes()), &limits, &ns).is_ok());
        let as_string = serde_json::to_string(env).unwrap();
        assert!(parse_record(Some(as_string.as_bytes()), &limits, &ns).is_ok());
        let wrapped = format!(r#"{{"schema":{{"type":"string"}},"payload":{as_string}}}"#);
        assert!(parse_record(Some(wrapped.as_bytes()), &limits, &ns).is_ok());
        let wrapped = format!(r#"{{"schema":null,"payload":{env}}}"#);
        assert!(parse_record(Some(wrapped.as_bytes()), &limits, &ns).is_ok());
    }

    #[test]
    fn what_is_not_a_command_is_refused() {
        let code = |v: Option<&[u8]>| {
            parse_record(v, &Limits::default(), &ns())
                .unwrap_err()
                .error_code()
        };
        assert_eq!(code(None), ErrorCode::BadRequest);
        assert_eq!(code(Some(b"not json")), ErrorCode::BadRequest);
        assert_eq!(code(Some(b"\"text\"")), ErrorCode::BadRequest);
        assert_eq!(
            code(Some(br#"{"method":"delete","payload":{}}"#)),
            ErrorCode::UnknownMethod
        );
        let small = Limits {
            max_api_body_bytes: 30,
            ..Limits::default()
        };
        let big = r#"{"method":"publish","payload":{"channel":"a","data":"0123456789abcdef"}}"#;
        let wrapped = serde_json::to_string(big).unwrap();
        assert_eq!(
            parse_record(Some(wrapped.as_bytes()), &small, &ns())
                .unwrap_err()
                .error_code(),
            ErrorCode::LimitExceeded,
            "the payload inside a wrapper is held to the API's limit"
        );
    }

    #[test]
    fn a_build_without_the_client_refuses_kafka_consumers() {
        let e = ensure_supported(1, false).unwrap_err().to_string();
        assert!(
            e.contains("this build has no Kafka support: rebuild with --features kafka"),
            "{e}"
        );
        assert!(ensure_supported(0, false).is_ok());
        assert!(ensure_supported(2, true).is_ok());
    }

    #[test]
    fn retries_double_from_initial_to_max() {
        let c: KafkaConfigs = serde_json::from_value(serde_json::json!({
            "brokers": "a:1", "topics": "t", "retry_initial_ms": 100, "retry_max_ms": 350
        }))
        .unwrap();
        let mut b = c.into_vec()[0].backoff();
        let ms = Duration::from_millis;
        let got: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(100), ms(200), ms(350), ms(350)]);
        let c: KafkaConfigs = serde_json::from_value(serde_json::json!({
            "brokers": "a:1", "topics": "t", "retry_initial_ms": 500, "retry_max_ms": 100
        }))
        .unwrap();
        let mut b = c.into_vec()[0].backoff();
        assert_eq!(
            b.next_delay(),
            ms(500),
            "a max below the first wait is the first wait"
        );
        assert_eq!(b.next_delay(), ms(500));
    }

    #[test]
    fn config_takes_a_table_or_an_array_and_lenient_values() {
        let one: KafkaConfigs = serde_json::from_value(serde_json::json!({
            "brokers": "a:9092, b:9092", "topics": ["t"], "sasl_password": 12345
        }))
        .unwrap();
        let one = one.into_vec();
        assert_eq!(one[0].brokers, ["a:9092", "b:9092"]);
        assert_eq!(one[0].sasl_password, Some(Secret("12345".into())));
        assert!(
            !format!("{:?}", one[0]).contains("12345"),
            "passwords stay out of Debug"
        );
        assert_eq!(one[0].name(), "herald");
        assert!(one[0].validate().is_ok());
        let many: KafkaConfigs = serde_json::from_value(serde_json::json!([
            {"brokers": ["a:1"], "topics": "x,y", "group_id": "g1"},
            {"brokers": ["a:1"], "topics": "z", "group_id": "g2", "name": "second"}
        ]))
        .unwrap();
        let many = many.into_vec();
        assert_eq!(many[0].topics, ["x", "y"]);
        assert_eq!(many[1].name(), "second");
        let bad: KafkaConfigs = serde_json::from_value(serde_json::json!({
            "brokers": "a:1", "topics": "t",
            "properties": {"enable.auto.commit": "true"}
        }))
        .unwrap();
        assert_eq!(
            bad.into_vec()[0].validate().unwrap_err().to_string(),
            "consumers.kafka \"herald\": property \"enable.auto.commit\" is Herald's own \
             (set brokers or group_id instead)"
        );
    }

    #[test]
    fn centrifugo_modes_read_headers() {
        let config = |v: serde_json::Value| -> KafkaConfig {
            let c: KafkaConfigs = serde_json::from_value(v).unwrap();
            c.into_vec().remove(0)
        };
        let plain = config(serde_json::json!({"brokers": "a:1", "topics": "t"}));
        let limits = Limits::default();
        let ns = ns();
        let parse = |c: &KafkaConfig, v: &[u8], h: &[(&str, &[u8])]| {
            parse_message(Some(v), h, c, &limits, &ns)
        };
        let body = br#"{"channel":"a","data":1}"#;
        let r = parse(&plain, body, &[("centrifugo-method", b"publish")]).unwrap();
        assert!(
            matches!(r, Record::Publish(Command::Publish { .. })),
            "{r:?}"
        );
        let r = parse(
            &plain,
            br#"{"user":"u"}"#,
            &[("centrifugo-method", b"disconnect")],
        )
        .unwrap();
        assert!(matches!(r, Record::Control(_)), "{r:?}");
        // Without the header the value must be an envelope.
        assert!(parse(&plain, body, &[]).is_err());
        let data = config(serde_json::json!({
            "brokers": "a:1", "topics": "t", "publication_data_mode": {"enabled": true}
        }));
        let r = parse(
            &data,
            br#"{"x":1}"#,
            &[
                ("centrifugo-channels", b"a, b"),
                ("centrifugo-idempotency-key", b"k"),
            ],
        )
        .unwrap();
        match r {
            Record::Publish(Command::Broadcast {
                channels,
                data,
                idempotency_key,
                ..
            }) => {
                assert_eq!(channels, ["a", "b"]);
                assert_eq!(&data[..], br#"{"x":1}"#);
                assert_eq!(idempotency_key.as_deref(), Some("k"));
            }
            other => panic!("{other:?}"),
        }
        let e = parse(&data, br#"{"x":1}"#, &[]).unwrap_err();
        assert!(e.message().contains("centrifugo-channels"), "{e}");
        let e = parse(&data, b"\x00binary", &[("centrifugo-channels", b"a")]).unwrap_err();
        assert!(e.message().contains("not JSON"), "{e}");
        let bad = config(serde_json::json!({
            "brokers": "a:1", "topics": "t",
            "publication_data_mode": {"enabled": true, "channels_header": ""}
        }));
        assert!(bad.validate().is_err());
    }
}
