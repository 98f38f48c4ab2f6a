//! examples/cookie-sessions against the real binary, over HTTP and WebSocket (its browser test is
//! clients/js/test/browser/example.test.ts): the app's hooks are not on its public port, and
//! signing out closes the session's connection.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use herald_testkit::free_port;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The example app on free ports, told where Herald's API is: (process, public port, hook port).
async fn start_app(herald_port: u16) -> (Child, u16, u16) {
    let dir = format!(
        "{}/../../examples/cookie-sessions",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut child = Command::new("python3")
        .arg(format!("{dir}/app.py"))
        .args(["--port", "0", "--hook-port", "0"])
        .env("HERALD_API", format!("http://127.0.0.1:{herald_port}"))
        .env("HERALD_API_KEY", API_KEY)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 app.py");
    let line = tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(child.stdout.take().unwrap())
            .lines()
            .next_line(),
    )
    .await
    .expect("the app did not start in time")
    .unwrap()
    .expect("the app exited");
    let ports: Vec<u16> = line
        .strip_prefix("listening ")
        .map(|p| p.split(' ').filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    let [public, hooks] = ports[..] else {
        panic!("listening line: {line}")
    };
    (child, public, hooks)
}

/// `curl` against the app: (status, headers and body as text).
async fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-i", "--max-time", "5"])
        .args(args)
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    (status, text)
}

#[tokio::test]
async fn hooks_are_not_public_and_signing_out_closes_the_connection() {
    let herald_port = free_port();
    let (_app, public, hooks) = start_app(herald_port).await;
    let example = format!(
        "{}/../../examples/cookie-sessions/herald.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let toml = std::fs::read_to_string(example)
        .unwrap()
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{hooks}"));
    let cfg = config_file("herald.toml", &toml);
    let port = herald_port.to_string();
    let node = Node::start(&["--config", &cfg, "--port", &port], &[]).await;

    // A forged hook call on the public port is not answered.
    let forged = r#"{"client": "x", "user": "admin", "method": "whoami"}"#;
    let rpc = format!("http://127.0.0.1:{public}/herald/rpc");
    let (status, text) = curl(&["-X", "POST", "-d", forged, &rpc]).await;
    assert_eq!(status, 404, "{text}");

    // Sign in, connect with the cookie, sign out: the connection closes at once.
    let login = format!("http://127.0.0.1:{public}/login");
    let (status, text) = curl(&["-X", "POST", "-d", "name=alice", &login]).await;
    assert_eq!(status, 303, "{text}");
    let cookie = text
        .lines()
        .find_map(|l| l.strip_prefix("Set-Cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie in {text}"))
        .to_owned();
    let mut client = Client::open(node.addr, &[("Cookie", &cookie)]).await;
    let r = client.call("connect", json!({})).await;
    assert_eq!(r["connect"]["data"]["name"], "Alice", "{r}");
    let logout = format!("http://127.0.0.1:{public}/logout");
    let (status, text) = curl(&["-X", "POST", "-H", &format!("Cookie: {cookie}"), &logout]).await;
    assert_eq!(status, 303, "{text}");
    let closed = tokio::time::timeout(Duration::from_secs(5), client.closed())
        .await
        .expect("the connection closed after sign-out");
    assert_eq!(closed.code, Some(4502));
    // The session is gone: the same cookie connects no more.
    let mut again = Client::open(node.addr, &[("Cookie", &cookie)]).await;
    let r = again.call("connect", json!({})).await;
    assert_eq!(r["error"]["code"], 1401, "{r}");
}
