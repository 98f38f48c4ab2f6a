//! What a node with proxy hooks says and does at start-up, read from the real binary's output: a
//! malformed hook URL stops it with an error naming the key (and never the URL, which may carry
//! credentials); a node whose connect hook authenticates clients does not warn that clients
//! cannot connect.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

/// `herald serve --config <toml>` with no token keys: whether it started listening, and what it
/// wrote to stderr until then (or until it exited).
async fn start_up(toml: &str) -> (bool, String) {
    let cfg = config_file("herald.toml", toml);
    let mut cmd = Command::new(herald_bin());
    cmd.args(["serve", "--port", "0", "--config", &cfg]);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .env("HERALD_API_KEY", "startup-test-key")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .expect("herald listened or exited within 20 s")
        .ok()
        .flatten()
        .is_some_and(|l| l.contains("listening"));
    let _ = child.kill().await;
    let mut stderr = String::new();
    let mut pipe = child.stderr.take().unwrap();
    tokio::time::timeout(Duration::from_secs(5), pipe.read_to_string(&mut stderr))
        .await
        .expect("stderr closed after exit")
        .unwrap();
    (listening, stderr)
}

#[tokio::test]
async fn a_malformed_hook_url_stops_the_node_naming_the_key() {
    for (url, why) in [
        (
            "127.0.0.1:8080/connect",
            "proxy.connect_url is not a valid URL",
        ),
        (
            "ftp://herald:s3cret@127.0.0.1/connect",
            "proxy.connect_url must be an http:// or https:// URL, not ftp://",
        ),
        // A Centrifugo gRPC proxy endpoint, carried over as is.
        (
            "grpc://herald:s3cret@127.0.0.1:10000",
            "proxy.connect_url: gRPC proxy endpoints are not supported; use an http:// or https:// URL",
        ),
    ] {
        let (listening, stderr) = start_up(&format!("[proxy]\nconnect_url = {url:?}\n")).await;
        assert!(!listening, "{url} accepted");
        assert!(stderr.contains(why), "{url}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{url}: {stderr}");
    }
}

#[tokio::test]
async fn no_cannot_connect_warning_when_the_connect_hook_authenticates() {
    const WARNING: &str = "clients cannot connect";
    let (listening, stderr) =
        start_up("[proxy]\nconnect_url = \"http://127.0.0.1:9/connect\"\n").await;
    assert!(listening, "{stderr}");
    assert!(!stderr.contains(WARNING), "{stderr}");
    // Without the hook (and without keys or anonymous access) the warning stays.
    let (listening, stderr) = start_up("[proxy]\nrpc_url = \"http://127.0.0.1:9/rpc\"\n").await;
    assert!(listening, "{stderr}");
    assert!(stderr.contains(WARNING), "{stderr}");
}

#[tokio::test]
async fn a_namespace_hook_entry_the_node_cannot_use_stops_it() {
    const HOOKS: &str = "[proxy]\nsubscribe_url = \"http://127.0.0.1:9/subscribe\"\n";
    const ROOM: &str = "[[namespaces]]\nname = \"room\"\nsubscribe_proxy = true\n";
    for (entry, why) in [
        (
            "name = \"lobby\"\nsubscribe_url = \"http://127.0.0.1:9/lobby\"\n",
            "[[proxy.namespaces]] \"lobby\": no such namespace in [[namespaces]]",
        ),
        (
            "name = \"room\"\npublish_url = \"http://127.0.0.1:9/publish\"\n",
            "publish_url is set but the namespace does not have publish_proxy",
        ),
        (
            "name = \"room\"\nsubscribe_url = \"ftp://herald:s3cret@127.0.0.1/x\"\n",
            "subscribe_url must be an http:// or https:// URL, not ftp://",
        ),
    ] {
        let toml = format!("{HOOKS}\n[[proxy.namespaces]]\n{entry}\n{ROOM}");
        let (listening, stderr) = start_up(&toml).await;
        assert!(!listening, "{entry} accepted");
        assert!(stderr.contains(why), "{entry}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{entry}: {stderr}");
    }
    // A proxy client certificate without its key, or one that cannot be read.
    let (listening, stderr) =
        start_up(&format!("{HOOKS}tls_cert_file = \"/nonexistent.pem\"\n")).await;
    assert!(!listening);
    assert!(
        stderr.contains("proxy.tls_cert_file and proxy.tls_key_file go together"),
        "{stderr}"
    );
    let (listening, stderr) =
        start_up(&format!("{HOOKS}tls_ca_file = \"/nonexistent.pem\"\n")).await;
    assert!(!listening);
    assert!(
        stderr.contains("proxy.tls_ca_file \"/nonexistent.pem\""),
        "{stderr}"
    );
}
