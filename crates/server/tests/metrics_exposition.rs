//! `/metrics` of the real binary: one exposition written by prometheus-client, the transports'
//! open-connection gauges in it before the closing `# EOF` (a strict OpenMetrics parser stops
//! there), with their names, labels, HELP and TYPE.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn open_connection_gauges_come_before_eof() {
    let node = Node::start(&["--dev"], &[]).await;
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(10),
        node.http("GET", "/metrics", None, None),
    )
    .await
    .expect("/metrics answered within 10 s");
    assert_eq!(status, 200);
    let text = body.as_str().expect("text body");
    let (before, after) = text
        .split_once("# EOF\n")
        .expect("an exposition ends with # EOF");
    assert_eq!(after, "", "nothing after # EOF:\n{after}");
    for line in [
        "# HELP herald_ws_connections_open WebSocket connections open at the transport.",
        "# TYPE herald_ws_connections_open gauge",
        "herald_ws_connections_open 0",
        "# HELP herald_stream_connections_open One-way stream connections open, by transport.",
        "# TYPE herald_stream_connections_open gauge",
        "herald_stream_connections_open{transport=\"sse\"} 0",
        "herald_stream_connections_open{transport=\"ndjson\"} 0",
        "herald_stream_connections_open{transport=\"emulation\"} 0",
    ] {
        assert!(
            before.lines().any(|l| l == line),
            "{line:?} missing before # EOF:\n{text}"
        );
    }
}
