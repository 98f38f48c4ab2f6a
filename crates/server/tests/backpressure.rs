//! A namespace's `backpressure` policy against a client that stops reading: `conflate` and
//! `drop_oldest` keep its queue bounded without closing it, and when it reads again it gets a
//! `skip` for what was left out and the newest publication, so that what it saw covers every
//! offset exactly once; `disconnect` (the default) is tests/limits.rs's 4001.
mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const TOTAL: u64 = 2000;
const QUEUE: &str = "262144";

/// What a jammed client saw once it read again: publications' offsets and skips, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Pub(u64),
    Skip(u64, u64),
}

/// A reader and a client that does not read share "ticker" while the API publishes 2000 × 8 KB
/// (16 MB, far past the 256 KB queue and the kernel's buffers). Returns what the jammed client
/// got after it started reading again, and the node's RSS growth in KiB.
async fn jammed(policy: &str) -> (Vec<Seen>, Option<u16>, i64, f64) {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIMITS__OUTBOUND_QUEUE_BYTES", QUEUE),
            ("HERALD_LIMITS__WRITE_TIMEOUT_MS", "60000"),
            ("HERALD_DEFAULT_NAMESPACE__BACKPRESSURE", policy),
        ],
    )
    .await;
    let mut reader = node.connected(&["ticker"]).await;
    let mut jammed = node.connected(&["ticker"]).await;
    let rss_before = node.rss_kib().expect("rss") as i64;
    let reading = tokio::spawn(async move {
        let mut last = 0;
        while last < TOTAL {
            if let Some(p) = reader.next().await.get("pub") {
                last = p["offset"].as_u64().unwrap();
            }
        }
        reader
    });
    let pad = "x".repeat(8000);
    let api = node.api_handle();
    let publishing = tokio::spawn(async move {
        for i in 1..=TOTAL {
            api.publish("ticker", json!({"i": i, "pad": pad})).await;
        }
    });
    herald_testkit::joined(publishing, Duration::from_secs(120), "the publisher").await;
    let _reader = herald_testkit::joined(reading, Duration::from_secs(60), "the reader").await;
    let rss_growth = node.rss_kib().expect("rss") as i64 - rss_before;

    // Read again: everything that is there, until a quiet second.
    let mut seen = Vec::new();
    while let Some(m) = jammed.next_within(Duration::from_secs(1)).await {
        if let Some(p) = m.get("pub") {
            seen.push(Seen::Pub(p["offset"].as_u64().unwrap()));
        } else if let Some(s) = m.get("skip") {
            assert_eq!(s["channel"], "ticker", "{m}");
            seen.push(Seen::Skip(
                s["from"].as_u64().unwrap(),
                s["to"].as_u64().unwrap(),
            ));
        } else if m.get("disconnect").is_some() {
            break;
        }
    }
    let slow = node.metric("herald_slow_consumers_total").await;
    eprintln!("{policy}: node RSS grew {rss_growth} KiB while 16 MB were published; the jammed client then got {} messages", seen.len());
    (seen, jammed.close_code, rss_growth, slow)
}

/// Every offset 1..=TOTAL exactly once, as a publication or inside a skip, in order.
fn covers_everything_once(seen: &[Seen]) -> Result<(), String> {
    let mut next = 1;
    for s in seen {
        match *s {
            Seen::Pub(o) if o == next => next += 1,
            Seen::Skip(from, to) if from == next && to >= from => next = to + 1,
            _ => return Err(format!("expected {next} next, got {s:?} in {seen:?}")),
        }
    }
    match next == TOTAL + 1 {
        true => Ok(()),
        false => Err(format!("ended before {TOTAL}: {seen:?}")),
    }
}

#[tokio::test]
async fn a_conflating_client_stays_connected_and_gets_the_newest_after_a_skip() {
    let (seen, close, rss_growth, slow) = jammed("conflate").await;
    assert_eq!(close, None, "not closed: {seen:?}");
    assert_eq!(slow, 0.0, "not counted as a slow consumer");
    covers_everything_once(&seen).unwrap();
    assert_eq!(
        seen.last(),
        Some(&Seen::Pub(TOTAL)),
        "the newest value last"
    );
    assert!(
        seen.iter().any(|s| matches!(s, Seen::Skip(..))),
        "something was left out: {seen:?}"
    );
    // After what the kernel buffered and the write under way held, one skip and the newest: a
    // waiting publication of the channel was replaced by each newer one, so the queue held one,
    // not the 16 MB published.
    let after_first_skip = seen
        .iter()
        .skip_while(|s| !matches!(s, Seen::Skip(..)))
        .count();
    assert_eq!(after_first_skip, 2, "{seen:?}");
    assert!(
        rss_growth < 64 * 1024,
        "memory stays bounded: RSS grew {rss_growth} KiB for 16 MB published"
    );
}

#[tokio::test]
async fn a_drop_oldest_client_stays_connected_and_is_told_each_gap() {
    let (seen, close, rss_growth, slow) = jammed("drop_oldest").await;
    assert_eq!(close, None, "not closed: {seen:?}");
    assert_eq!(slow, 0.0, "not counted as a slow consumer");
    covers_everything_once(&seen).unwrap();
    assert_eq!(seen.last(), Some(&Seen::Pub(TOTAL)));
    assert!(
        rss_growth < 64 * 1024,
        "memory stays bounded: RSS grew {rss_growth} KiB for 16 MB published"
    );
}

#[tokio::test]
async fn a_bad_policy_name_is_refused_at_start_up() {
    let mut child = tokio::process::Command::new(herald_testkit::node::herald_bin())
        .args(["serve", "--dev", "--port", "0"])
        .env("HERALD_DEFAULT_NAMESPACE__BACKPRESSURE", "drop_newest")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run herald");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("herald must refuse the config and exit, not start")
        .expect("wait");
    let out = child.wait_with_output().await.expect("output");
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!status.success(), "{text}");
    assert!(text.contains("BACKPRESSURE"), "{text}");
    assert!(text.contains("drop_newest"), "{text}");
}
