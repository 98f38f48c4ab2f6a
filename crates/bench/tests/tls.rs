//! `--tls-ca`: the rig's clients reach a node over TLS and verify its certificate against the CA
//! given (tls_node: a private CA, a certificate for 127.0.0.1, a server answering `/health`).

mod tls_node;

use std::time::Duration;

#[tokio::test(flavor = "current_thread")]
async fn https_health_through_a_private_ca() {
    // Every step talks to a server in this process; a stuck one fails here instead of hanging.
    let wait = Duration::from_secs(30);
    tokio::time::timeout(wait, health_through_a_private_ca())
        .await
        .unwrap_or_else(|_| panic!("the TLS exchanges did not finish within {wait:?}"));
}

async fn health_through_a_private_ca() {
    let node = tls_node::start().await;
    let url = format!("https://127.0.0.1:{}", node.port);
    // Before the CA is trusted, an https:// URL is refused with a clear cause.
    let err = herald_bench::http::get(&url, "/health").await.unwrap_err();
    assert!(err.to_string().contains("--tls-ca"), "{err}");
    herald_bench::tls::trust(&node.ca_file, false).unwrap();
    herald_bench::http::wait_healthy(&url, "/health", Duration::from_secs(5))
        .await
        .unwrap();
    let r = herald_bench::http::get(&url, "/health").await.unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
}
