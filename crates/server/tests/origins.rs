//! The `Origin` rule of every door a browser connects through (WebSocket, SSE, NDJSON stream,
//! WebSocket emulation), over real sockets against the real binary: with a connect hook (which
//! authenticates by the browser's cookies) and `allowed_origins` empty, a page on another site is
//! refused (cross-site WebSocket hijacking); without a hook, or with a list, as before.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const EVIL: &str = "https://evil.example";
/// A connect hook nobody answers: the origin check comes before any call to it.
const HOOK: &str = "http://127.0.0.1:9/herald/connect";

/// Send one request and read only its status line (a stream that was accepted never ends).
async fn status(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let has_host = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host"));
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !has_host {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = if method == "POST" { "{}" } else { "" };
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no answer within 10 s"))
            .expect("read");
        assert!(n > 0, "{method} {path}: closed without an answer");
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {text:?}"))
}

/// The status of a request through each Herald door carrying `origin` (and `host`, when given).
async fn doors(
    addr: SocketAddr,
    origin: Option<&str>,
    host: Option<&str>,
) -> Vec<(&'static str, u16)> {
    let mut common: Vec<(&str, &str)> = Vec::new();
    if let Some(o) = origin {
        common.push(("Origin", o));
    }
    if let Some(h) = host {
        common.push(("Host", h));
    }
    let ws: Vec<(&str, &str)> = common
        .iter()
        .copied()
        .chain([
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ])
        .collect();
    vec![
        ("websocket", status(addr, "GET", "/ws", &ws).await),
        (
            "sse",
            status(addr, "GET", "/connection/sse?connect=%7B%7D", &common).await,
        ),
        (
            "stream",
            status(addr, "POST", "/connection/stream", &common).await,
        ),
        (
            "emulation open",
            status(addr, "GET", "/connection/emulation", &common).await,
        ),
        (
            "emulation send",
            status(addr, "POST", "/connection/emulation?session=x", &common).await,
        ),
    ]
}

fn assert_all(results: &[(&str, u16)], refused: bool, what: &str) {
    for (door, code) in results {
        assert_eq!(
            *code == 403,
            refused,
            "{what}: {door} answered {code} (refused expected: {refused})"
        );
    }
}

#[tokio::test]
async fn cross_site_pages_are_refused_when_cookies_authenticate() {
    let node = Node::start(&[], &[("HERALD_PROXY__CONNECT_URL", HOOK)]).await;
    let own = format!("http://{}", node.addr);
    assert_all(
        &doors(node.addr, Some(EVIL), None).await,
        true,
        "another site",
    );
    assert_all(
        &doors(node.addr, Some("null"), None).await,
        true,
        "Origin: null",
    );
    assert_all(
        &doors(node.addr, Some(&own), None).await,
        false,
        "the node's own origin",
    );
    assert_all(
        &doors(node.addr, None, None).await,
        false,
        "no Origin (not a browser)",
    );
    let port = node.addr.port().to_string();
    assert_all(
        &doors(node.addr, Some(&format!("http://localhost:{port}")), None).await,
        true,
        "another host name than the request's",
    );
}

#[tokio::test]
async fn without_a_connect_hook_any_origin_may_connect() {
    let node = Node::start(&[], &[]).await;
    assert_all(
        &doors(node.addr, Some(EVIL), None).await,
        false,
        "tokens only",
    );
}

#[tokio::test]
async fn a_list_of_origins_decides_alone() {
    let node = Node::start(
        &[],
        &[
            ("HERALD_PROXY__CONNECT_URL", HOOK),
            ("HERALD_ALLOWED_ORIGINS", "[\"https://app.example\"]"),
        ],
    )
    .await;
    assert_all(
        &doors(node.addr, Some("https://app.example"), None).await,
        false,
        "a listed origin",
    );
    assert_all(
        &doors(node.addr, Some(EVIL), None).await,
        true,
        "an unlisted one",
    );
}

#[tokio::test]
async fn dev_nodes_accept_loopback_pages_on_other_ports() {
    let node = Node::start(&["--dev"], &[("HERALD_PROXY__CONNECT_URL", HOOK)]).await;
    assert_all(
        &doors(node.addr, Some("http://localhost:5173"), None).await,
        false,
        "a dev server on another port",
    );
    assert_all(
        &doors(node.addr, Some(EVIL), None).await,
        true,
        "another site",
    );
}

#[tokio::test]
async fn pusher_connections_are_not_cookie_authenticated() {
    let node = Node::start(
        &[],
        &[
            ("HERALD_PROXY__CONNECT_URL", HOOK),
            ("HERALD_PUSHER_APP_ID", "7"),
            ("HERALD_PUSHER_APP_KEY", "app-key"),
            ("HERALD_PUSHER_APP_SECRET", "app-secret"),
        ],
    )
    .await;
    let code = status(
        node.addr,
        "GET",
        "/app/app-key?protocol=7",
        &[
            ("Origin", EVIL),
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
    )
    .await;
    assert_eq!(code, 101, "a Pusher client on another site connects");
}
