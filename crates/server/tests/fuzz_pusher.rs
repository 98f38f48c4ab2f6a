//! Fuzz harness for the Pusher endpoint (`/app/{key}`) against the real binary (property-based,
//! stable toolchain): random and edited client frames get their answer, a `pusher:error` or a
//! `pusher:subscription_error`, or a close with one of the Pusher protocol's codes, never a
//! reset, a hang or a crash; every frame the server sends is a Pusher event; and the node keeps
//! serving other clients. `scripts/fuzz.sh` runs it with more cases (`PROPTEST_CASES`).

mod common;

use std::time::Duration;

use common::{Client, Node};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::net::TcpStream;

const APP: [(&str, &str); 4] = [
    ("HERALD_PUSHER_APP_ID", "7"),
    ("HERALD_PUSHER_APP_KEY", "app-key"),
    ("HERALD_PUSHER_APP_SECRET", "app-secret"),
    ("HERALD_PUSHER_APP_ENABLE_CLIENT_EVENTS", "true"),
];

/// One frame of each kind a Pusher client sends; edits of these reach the parser's corners.
const SEEDS: &[&str] = &[
    r#"{"event":"pusher:subscribe","data":{"channel":"news"}}"#,
    r#"{"event":"pusher:subscribe","data":{"channel":"private-x","auth":"app-key:00"}}"#,
    r#"{"event":"pusher:subscribe","data":{"channel":"presence-r","auth":"app-key:00","channel_data":"{\"user_id\":\"u\"}"}}"#,
    r#"{"event":"pusher:subscribe","data":{"channel":"private-encrypted-x","auth":"app-key:00"}}"#,
    r#"{"event":"pusher:subscribe","data":{"channel":"news","herald_since":{"epoch":"e","offset":1}}}"#,
    r#"{"event":"pusher:unsubscribe","data":{"channel":"news"}}"#,
    r#"{"event":"pusher:ping","data":{}}"#,
    r#"{"event":"pusher:signin","data":{"auth":"app-key:00","user_data":"{\"id\":\"u\"}"}}"#,
    r#"{"event":"client-typing","channel":"private-x","data":{"a":1}}"#,
    r#"{"event":"pusher:subscribe","data":"{\"channel\":\"news\"}"}"#,
];

fn frame() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), common::edited_seed(SEEDS),]
}

async fn connected(node: &Node) -> Client {
    let tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
    let url = format!(
        "ws://{}/app/app-key?protocol=7&client=fuzz&version=1",
        node.addr
    );
    let mut c = Client::open_on(Box::new(tcp), &url, &[])
        .await
        .expect("ws handshake");
    let m = c.next().await;
    assert_eq!(m["event"], "pusher:connection_established", "{m}");
    c
}

/// What one frame led to.
enum Outcome {
    /// The connection answered a ping after it: it carries on.
    CarriesOn,
    /// The server closed the connection with this code.
    Closed(Option<u16>),
}

/// Send `frame`, then a ping, and read until the pong (or the close). Every message on the way
/// must be a Pusher event.
async fn probe(c: &mut Client, frame: &str) -> Result<Outcome, String> {
    let ping = r#"{"event":"pusher:ping","data":{}}"#;
    if !c.try_send_raw(frame).await || !c.try_send_raw(ping).await {
        return Ok(Outcome::Closed(c.closed().await.code));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, c.next_or_closed()).await {
            Err(_) => return Err(format!("no pong within 5 s after {frame:?}")),
            Ok(None) => return Ok(Outcome::Closed(c.close_code)),
            Ok(Some(m)) => {
                if !m["event"].is_string() {
                    return Err(format!("not a Pusher event: {m} (after {frame:?})"));
                }
                if m["event"] == "pusher:pong" {
                    return Ok(Outcome::CarriesOn);
                }
            }
        }
    }
}

#[test]
fn random_pusher_frames_get_a_clear_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node = rt.block_on(Node::start(&["--dev"], &APP));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    // The connection carries over from case to case while it stays open.
    let client = std::cell::RefCell::new(None::<Client>);
    let (carried_on, closed) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    runner
        .run(&frame(), |frame| {
            let mut taken = client.borrow_mut().take();
            let outcome = rt.block_on(async {
                let c = match taken.as_mut() {
                    Some(c) => c,
                    None => taken.insert(connected(&node).await),
                };
                probe(c, &frame).await
            });
            if matches!(outcome, Ok(Outcome::CarriesOn)) {
                *client.borrow_mut() = taken;
            }
            match outcome {
                Ok(Outcome::CarriesOn) => {
                    carried_on.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Outcome::Closed(code)) => {
                    closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // 4000-4299 are the Pusher protocol's own codes; anything else (1006: a
                    // reset, 1011: a server error) would be a failure to answer.
                    prop_assert!(
                        code.is_some_and(|c| (4000..4300).contains(&c)),
                        "{frame:?} closed the connection with {code:?}"
                    );
                }
                Err(e) => prop_assert!(false, "{e}"),
            }
            Ok(())
        })
        .unwrap();
    let carried_on = carried_on.into_inner();
    assert!(carried_on > 0, "no frame left the connection open");

    // The node still serves a new client.
    rt.block_on(async {
        let mut c = connected(&node).await;
        c.send_raw(r#"{"event":"pusher:subscribe","data":{"channel":"after"}}"#)
            .await;
        let m = c.next().await;
        assert_eq!(m["event"], "pusher_internal:subscription_succeeded", "{m}");
    });
}
