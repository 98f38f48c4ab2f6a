//! Fuzz harness for the HTTP API against the real binary (property-based, stable toolchain):
//! random and edited request bodies on every endpoint get a 2xx or a 4xx with a JSON error,
//! never a 5xx, a hang or a crash, and the node keeps serving. `scripts/fuzz.sh` runs it with
//! more cases (`PROPTEST_CASES`).

mod common;

use common::*;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestRunner};

const PATHS: &[&str] = &[
    "/api/publish",
    "/api/broadcast",
    "/api/history",
    "/api/presence",
    "/api/subscribe",
    "/api/unsubscribe",
    "/api/disconnect",
    "/api/channels",
    "/api/info",
];

/// Bodies each endpoint accepts as they are: one case in ten sends one, so both kinds of answer
/// always come up (with only edited seeds, a 200 was rare enough to miss in a run).
const VALID: &[(&str, &str)] = &[
    (
        "/api/publish",
        r#"{"channel":"c","data":{"a":1},"idempotency_key":"k1"}"#,
    ),
    ("/api/broadcast", r#"{"channels":["a","b"],"data":[1,2]}"#),
    ("/api/history", r#"{"channel":"c","limit":5}"#),
    ("/api/subscribe", r#"{"user":"u","channel":"c"}"#),
    ("/api/disconnect", r#"{"user":"u"}"#),
];

const SEEDS: &[&str] = &[
    r#"{"channel":"c","data":{"a":1},"idempotency_key":"k1"}"#,
    r#"{"channels":["a","b"],"data":[1,2]}"#,
    r#"{"channel":"c","limit":5,"since":{"epoch":"e","offset":2}}"#,
    r#"{"channel":"c"}"#,
    r#"{"user":"u","channel":"c"}"#,
    r#"{"user":"u","reconnect":false}"#,
    "{}",
];

fn body() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), common::edited_seed(SEEDS),]
}

fn case() -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        9 => (select(PATHS), body()),
        1 => select(VALID).prop_map(|(path, body)| (path, body.to_owned())),
    ]
}

#[test]
fn random_api_bodies_get_a_clear_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node = rt.block_on(Node::dev());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    runner
        .run(&case(), |(path, body)| {
            let (status, reply) =
                rt.block_on(node.http("POST", path, Some(body.clone()), Some(API_KEY)));
            seen.lock().unwrap().insert(status);
            prop_assert!(
                (200..500).contains(&status),
                "{path} {body:?} answered {status} {reply}"
            );
            if status >= 400 {
                prop_assert!(reply["error"]["code"].is_u64(), "{path} {body:?}: {reply}");
            }
            Ok(())
        })
        .unwrap();
    // Both kinds of answer came up, so the bodies reached the handlers.
    let seen = seen.into_inner().unwrap();
    assert!(seen.contains(&200) && seen.contains(&400), "{seen:?}");
    let (status, _) = rt.block_on(node.api("/api/channels", None));
    assert_eq!(status, 200, "the node still serves");
}
