//! `--tls-resume`: each client resumes with the tickets its own connections received, never with
//! another client's (its own process: the rig trusts the CA once per process).

mod tls_node;

use rustls::HandshakeKind::{self, Full, Resumed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One connection: its handshake's kind, after reading the answer (the ticket comes with it);
/// fails the test if the exchange with the in-process server does not finish within 30 s.
async fn visit(port: u16) -> Option<HandshakeKind> {
    let wait = std::time::Duration::from_secs(30);
    tokio::time::timeout(wait, exchange(port))
        .await
        .unwrap_or_else(|_| panic!("a TLS visit did not finish within {wait:?}"))
}

async fn exchange(port: u16) -> Option<HandshakeKind> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let stream = herald_bench::tls::wrap(tcp, true, "127.0.0.1")
        .await
        .unwrap();
    let tokio_util::either::Either::Right(mut tls) = stream else {
        panic!("a TLS stream");
    };
    let kind = tls.get_ref().1.handshake_kind();
    tls.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    assert!(raw.starts_with(b"HTTP/1.1 200"), "{raw:?}");
    kind
}

#[tokio::test(flavor = "current_thread")]
async fn each_client_resumes_with_its_own_tickets() {
    let node = tls_node::start().await;
    herald_bench::tls::trust(&node.ca_file, true).unwrap();
    let port = node.port;
    use herald_bench::tls::as_client;
    assert_eq!(as_client(1, visit(port)).await, Some(Full), "first visit");
    assert_eq!(
        as_client(2, visit(port)).await,
        Some(Full),
        "client 2 holds no ticket of its own yet"
    );
    assert_eq!(as_client(1, visit(port)).await, Some(Resumed));
    assert_eq!(as_client(2, visit(port)).await, Some(Resumed));
}
