//! Batches: many different commands in one request, `/api/batch` (Herald's own API), Centrifugo's
//! `batch`, and a consumer's `batch` outbox row or Kafka record.
//!
//! A batch body is `{"commands": [...], "parallel"?: bool}`. Each command is Herald's envelope
//! `{"method": "publish", "payload": {…}}` or Centrifugo's `{"publish": {…}}`, so that one body
//! shape serves every entry point. At most `limits.max_batch_commands` commands (error 106,
//! nothing run); the body itself is held to the broadcast body limit (a batch may carry a
//! broadcast). A command that is malformed fails alone, in its place in the replies; a batch
//! inside a batch is refused.
//!
//! Commands run one after another in their order, or all at once with `parallel: true`. This
//! module parses and runs; what each command does is its caller's (the API's methods, the
//! consumers' decoders).

use std::collections::BTreeMap;
use std::future::Future;

use herald_core::config::Limits;
use herald_protocol::command::json_error_reason;
use herald_protocol::ErrorCode;
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::publishing::{check_idempotency_key, PublishError};

/// A parsed batch.
#[derive(Debug)]
pub struct Batch {
    /// The commands in the request's order; a malformed one as its error.
    pub commands: Vec<Result<BatchCommand, PublishError>>,
    /// Run the commands concurrently instead of in order.
    pub parallel: bool,
}

/// One command of a batch.
#[derive(Debug)]
pub struct BatchCommand {
    /// Its method (`publish`, `broadcast`, …).
    pub method: String,
    /// Its request body, as JSON text.
    pub payload: Box<RawValue>,
}

impl BatchCommand {
    /// The payload's bytes.
    pub fn body(&self) -> &[u8] {
        self.payload.get().as_bytes()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(default)]
    commands: Vec<BTreeMap<String, Box<RawValue>>>,
    #[serde(default)]
    parallel: bool,
}

/// The batch in `body`; a body that is not a batch, or one of more than
/// `limits.max_batch_commands` commands, is refused whole (107, 106).
pub fn parse(body: &[u8], limits: &Limits) -> Result<Batch, PublishError> {
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        PublishError::refused(
            ErrorCode::BadRequest,
            format!("bad JSON body: batch: {}", json_error_reason(&e)),
        )
    })?;
    let max = limits.max_batch_commands;
    if b.commands.len() > max {
        return Err(PublishError::refused(
            ErrorCode::LimitExceeded,
            format!(
                "batch of {} commands is over limits.max_batch_commands ({max})",
                b.commands.len()
            ),
        ));
    }
    Ok(Batch {
        commands: b.commands.into_iter().map(command).collect(),
        parallel: b.parallel,
    })
}

/// `{"method", "payload"}` or `{"<method>": payload}`.
fn command(mut fields: BTreeMap<String, Box<RawValue>>) -> Result<BatchCommand, PublishError> {
    let bad = |m: &str| PublishError::refused(ErrorCode::BadRequest, format!("batch: {m}"));
    let (method, payload) = if fields.len() == 2 && fields.contains_key("method") {
        let method = fields.remove("method").expect("checked");
        let payload = fields
            .remove("payload")
            .ok_or_else(|| bad("a command is {\"method\", \"payload\"} or {\"<method>\": {…}}"))?;
        let method: String =
            serde_json::from_str(method.get()).map_err(|_| bad("\"method\" must be a string"))?;
        (method, payload)
    } else if fields.len() == 1 {
        fields.pop_first().expect("one field")
    } else {
        return Err(bad(
            "a command is {\"method\", \"payload\"} or {\"<method>\": {…}}",
        ));
    };
    if method == "batch" {
        return Err(bad("a batch cannot hold a batch"));
    }
    Ok(BatchCommand { method, payload })
}

/// Await `calls` in order, or all at once when `parallel`; the results in `calls`' order. A
/// call is lazy (an `async` block), so in order means each starts after the one before ended.
pub async fn run<F: Future>(calls: Vec<F>, parallel: bool) -> Vec<F::Output> {
    if parallel {
        return futures_util::future::join_all(calls).await;
    }
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        results.push(call.await);
    }
    results
}

/// The idempotency key of command `index` of a batch whose own key (an outbox row's, a Kafka
/// record's) is `key`: `<key>:<index>`, so that two commands of one batch publishing to the
/// same channel are not taken for retries of each other. A key that would pass the 128
/// character limit is replaced by its SHA-256 prefix.
pub fn command_key(key: &str, index: usize) -> String {
    let joined = format!("{key}:{index}");
    if check_idempotency_key(&joined).is_ok() {
        return joined;
    }
    let digest = Sha256::digest(key.as_bytes());
    format!("batch#{}:{index}", hex::encode(&digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn methods(b: &Batch) -> Vec<Result<&str, ErrorCode>> {
        b.commands
            .iter()
            .map(|c| {
                c.as_ref()
                    .map(|c| c.method.as_str())
                    .map_err(PublishError::error_code)
            })
            .collect()
    }

    #[test]
    fn both_command_shapes_parse_and_bad_ones_fail_alone() {
        let b = parse(
            br#"{"commands":[
                {"method":"publish","payload":{"channel":"a","data":1}},
                {"broadcast":{"channels":["a"],"data":1}},
                {"publish":{},"broadcast":{}},
                {"method":3,"payload":{}},
                {"batch":{"commands":[]}}
            ],"parallel":true}"#,
            &Limits::default(),
        )
        .unwrap();
        assert!(b.parallel);
        assert_eq!(
            methods(&b),
            [
                Ok("publish"),
                Ok("broadcast"),
                Err(ErrorCode::BadRequest),
                Err(ErrorCode::BadRequest),
                Err(ErrorCode::BadRequest)
            ]
        );
        let first = b.commands[0].as_ref().unwrap();
        assert_eq!(first.body(), br#"{"channel":"a","data":1}"#);
    }

    #[test]
    fn malformed_and_oversized_batches_are_refused_whole() {
        let limits = Limits {
            max_batch_commands: 2,
            ..Limits::default()
        };
        let e = parse(br#"{"commands":[{"a":{}},{"a":{}},{"a":{}}]}"#, &limits).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::LimitExceeded);
        assert!(e.message().contains("max_batch_commands (2)"), "{e}");
        let e = parse(br#"{"commands":[],"paralel":true}"#, &limits).unwrap_err();
        assert!(e.message().contains("unknown field"), "{e}");
        assert!(parse(b"[1]", &limits).is_err());
        assert!(parse(br#"{"commands":[1]}"#, &limits).is_err());
        assert!(parse(b"{}", &limits).unwrap().commands.is_empty());
    }

    #[test]
    fn command_keys_are_distinct_and_fit_the_limit() {
        assert_eq!(command_key("outbox:t:5", 2), "outbox:t:5:2");
        let long = "k".repeat(128);
        let a = command_key(&long, 0);
        assert!(check_idempotency_key(&a).is_ok(), "{a}");
        assert_ne!(a, command_key(&long, 1));
        assert_ne!(a, command_key(&"j".repeat(128), 0));
    }

    #[tokio::test]
    async fn in_order_each_call_starts_after_the_one_before() {
        let log = std::sync::Mutex::new(Vec::new());
        let calls: Vec<_> = (0..3)
            .map(|i| {
                let log = &log;
                async move {
                    log.lock().unwrap().push(format!("start {i}"));
                    tokio::task::yield_now().await;
                    log.lock().unwrap().push(format!("end {i}"));
                    i
                }
            })
            .collect();
        assert_eq!(run(calls, false).await, [0, 1, 2]);
        let log = log.into_inner().unwrap();
        assert_eq!(log[..2], ["start 0", "end 0"]);
    }
}
