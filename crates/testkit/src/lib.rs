//! # Test kit: real servers on free loopback ports
//!
//! Every integration test that needs Redis, a Redis Cluster, NATS, PostgreSQL or Kafka starts its
//! own server here and the server is killed when the handle drops. Nothing assumes a service is
//! already running.
//!
//! # Layout
//! - [`free_port`]: a free TCP port on 127.0.0.1.
//! - [`redis`]: standalone redis-server and a three-master Redis Cluster.
//! - [`nats`]: nats-server with JetStream.
//! - [`postgres`]: a PostgreSQL server made with initdb in a temporary directory.
//! - [`kafka`]: a single-node Apache Kafka 4.x (KRaft) broker, from jars that
//!   `scripts/kafka-jars.sh` fetches from Maven Central.
//! - [`node`]: a real `herald` node (alone or on a shared broker), its HTTP API, SSE streams,
//!   tokens, config files: the one harness of every test that drives the binary.
//! - [`client`]: the protocol client over a real WebSocket.
//! - [`fuzz`]: proptest strategies for fuzzing the running binary.
//! - [`hooks`]: the proxy hooks' test backend (a real HTTP server in Python).
//! - [`multinode`]: the multi-node suite (real `herald` nodes over WebSockets), run against any
//!   broker through [`multinode::BrokerProcess`].
//! - [`eventually`] / [`eventually_some`] / [`eventually_ok`]: wait for a state (a node noticed
//!   something, a metric moved), bounded and failing with what it waited for (and, for
//!   `eventually_ok`, the last state it saw); [`joined`]: the same for a spawned task. A test
//!   sleeps only where time passing is the point (pacing, a TTL, a rate window).

pub mod client;
pub mod fuzz;
pub mod hooks;
pub mod kafka;
pub mod multinode;
pub mod nats;
pub mod node;
pub mod postgres;
pub mod redis;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// A TCP port on 127.0.0.1 that was free a moment ago, and never handed out before by this
/// process (the kernel may give the same ephemeral port to two binds in a row, and a server
/// started later would then find its port taken).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind 127.0.0.1:0");
        if GIVEN.lock().expect("ports").insert(port) {
            return port;
        }
    }
}

/// Wait for a spawned task's result, at most `limit`, failing with `what` it was doing: a task
/// that never ends fails the test instead of hanging the suite.
pub async fn joined<T>(
    task: tokio::task::JoinHandle<T>,
    limit: std::time::Duration,
    what: &str,
) -> T {
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what}: the task failed: {e}"),
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

/// How often [`eventually`] and [`eventually_some`] look again: often enough that a test waits
/// little past the moment the state is reached, rarely enough not to load a busy machine.
const POLL: std::time::Duration = std::time::Duration::from_millis(25);

/// Wait until `check` is true, looking every few milliseconds, at most `limit`; panics naming
/// `what` it waited for. For a state the test cannot be told about (a node noticed something, a
/// subscription took effect, a metric moved): a fixed sleep would be slow on a quiet machine and
/// too short on a busy one.
pub async fn eventually<F, Fut>(limit: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_some(limit, what, || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// Like [`eventually`], for a check that finds a value: waits until `check` gives `Some`, and
/// returns it.
pub async fn eventually_some<T, F, Fut>(limit: std::time::Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_ok(limit, what, || {
        let fut = check();
        async move { fut.await.ok_or("") }
    })
    .await
}

/// Like [`eventually_some`], for a check that can say what it saw instead: waits until `check`
/// gives `Ok`, and returns its value; at the limit, the panic names `what` it waited for and the
/// last `Err` (the state the wait ended in: a count, a metric's value, what arrived so far).
pub async fn eventually_ok<T, E, F, Fut>(limit: std::time::Duration, what: &str, mut check: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = String::new();
    let give_up = |last: &str| -> ! {
        if last.is_empty() {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        panic!("timed out after {limit:?} waiting for: {what}; last seen: {last}");
    };
    loop {
        // The check itself is bounded too: one that never returns must not outlive the limit.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, check()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => give_up(&last),
        }
        if tokio::time::Instant::now() + POLL > deadline {
            give_up(&last);
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn eventually_returns_once_the_check_holds() {
        let n = AtomicU32::new(0);
        eventually(Duration::from_secs(5), "the third look", || async {
            n.fetch_add(1, Ordering::SeqCst) >= 2
        })
        .await;
        assert_eq!(n.load(Ordering::SeqCst), 3);
        let v = eventually_some(Duration::from_secs(5), "a value", || async { Some(7) }).await;
        assert_eq!(v, 7);
    }

    #[tokio::test]
    async fn eventually_names_what_it_waited_for() {
        let limit = Duration::from_millis(200);
        let err = tokio::spawn(eventually(limit, "the sky to fall", || async { false }))
            .await
            .expect_err("it should fail");
        let p = err.into_panic();
        let msg = p.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("waiting for: the sky to fall"), "{msg}");
        // A check that never returns is cut off at the limit too.
        let stuck = tokio::spawn(eventually(limit, "a stuck check", || async {
            std::future::pending::<()>().await;
            true
        }));
        let err = tokio::time::timeout(Duration::from_secs(5), stuck)
            .await
            .expect("the limit bounds a stuck check")
            .expect_err("it should fail");
        let msg = err
            .into_panic()
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(msg.contains("a stuck check"), "{msg}");
    }

    #[tokio::test]
    async fn eventually_ok_names_the_last_state_it_saw() {
        let n = AtomicU32::new(0);
        let v = eventually_ok(Duration::from_secs(5), "the third look", || async {
            match n.fetch_add(1, Ordering::SeqCst) {
                2 => Ok("found"),
                k => Err(format!("look {k}")),
            }
        })
        .await;
        assert_eq!(v, "found");
        let err = tokio::spawn(eventually_ok(
            Duration::from_millis(200),
            "a count of 3",
            || async { Err::<(), _>("2 of 3") },
        ))
        .await
        .expect_err("it should fail");
        let msg = err
            .into_panic()
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            msg.contains("waiting for: a count of 3; last seen: 2 of 3"),
            "{msg}"
        );
    }
}
