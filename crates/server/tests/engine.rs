//! The connection engine (crates/server/src/engine) against the real binary: the policies every
//! transport now shares, seen from a transport that did not have them before.

mod common;

use std::time::Duration;

use common::*;
use herald_testkit::eventually;

/// A one-way stream whose client stopped reading is dropped once a write outlasts
/// `limits.write_timeout_ms`; its queue overflowed meanwhile, so it counts as a slow consumer,
/// as a WebSocket connection does (`herald_slow_consumers_total`), though the jammed socket
/// cannot carry the 4001 any more.
#[tokio::test]
async fn an_sse_reader_that_stops_is_counted_as_a_slow_consumer() {
    let node = Node::start(
        &["--dev"],
        &[
            ("HERALD_LIMITS__WRITE_TIMEOUT_MS", "500"),
            ("HERALD_LIMITS__OUTBOUND_QUEUE_BYTES", "262144"),
        ],
    )
    .await;
    assert_eq!(node.metric("herald_slow_consumers_total").await, 0.0);
    // A raw TCP client with a small receive buffer that sends the request and never reads.
    let stuck = stuck_sse_reader(&node, "flood").await;
    eventually(Duration::from_secs(10), "the SSE stream opened", || async {
        node.metric("herald_stream_connections_open{transport=\"sse\"}")
            .await
            == 1.0
    })
    .await;
    // Far more than the kernel buffers hold (24 MB), from two publishers.
    const TOTAL: u64 = 3000;
    let publishers = flood(&node, "flood", TOTAL);
    for p in publishers {
        herald_testkit::joined(p, Duration::from_secs(120), "a publisher").await;
    }
    eventually(
        Duration::from_secs(10),
        "the SSE client that stopped reading dropped",
        || async {
            node.metric("herald_stream_connections_open{transport=\"sse\"}")
                .await
                == 0.0
        },
    )
    .await;
    assert_eq!(
        node.metric("herald_slow_consumers_total").await,
        1.0,
        "the stream dropped for a write that outlasted the timeout, its queue overflowed, is a \
         slow consumer"
    );
    drop(stuck);
}
