//! Passwords in broker URLs never reach the node's output: a node whose broker cannot be reached
//! fails to start, and neither its error nor any log line (at `debug` too, where client libraries
//! print their connection settings) shows the password.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::process::Command;

const PASSWORD: &str = "pw-S3cr3t-9f1c";

/// Run `herald serve` against `broker_url` until it exits (a broker on a closed port fails the
/// start): its stdout and stderr together.
async fn failed_start(broker_url: &str, rust_log: &str, format: &str) -> String {
    let closed = herald_testkit::free_port();
    let url = broker_url.replace("PORT", &closed.to_string());
    let mut cmd = Command::new(herald_bin());
    cmd.args(["serve", "--port", "0"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HERALD_BROKER_URL", &url)
        .env("HERALD_API_KEY", API_KEY)
        .env("HERALD_LOG_FORMAT", format)
        .env("HERALD_NATS__CONNECT_TIMEOUT_MS", "500")
        .env("HERALD_REDIS__CONNECT_TIMEOUT_MS", "500")
        .env("RUST_LOG", rust_log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("herald with broker_url {url} did not exit within 60 s"))
        .expect("run herald");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "the node started without its broker: {text}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_passwords_never_reach_stdout_or_stderr() {
    let urls = [
        format!("redis://:{PASSWORD}@127.0.0.1:PORT"),
        format!("redis://{PASSWORD}@127.0.0.1:PORT/0"),
        format!("rediss://app:{PASSWORD}@127.0.0.1:PORT"),
        format!("redis://:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis+sentinel://:{PASSWORD}@127.0.0.1:PORT,127.0.0.1:PORT/mymaster"),
        format!("redis+cluster://app:{PASSWORD}@127.0.0.1:PORT,127.0.0.1:PORT"),
        format!("rediss://app:{PASSWORD}@127.0.0.1:PORT,rediss://app:{PASSWORD}@127.0.0.1:PORT"),
        format!("redis+shards://:{PASSWORD}@127.0.0.1:PORT,127.0.0.1:PORT"),
        format!("nats://app:{PASSWORD}@127.0.0.1:PORT"),
        format!("nats://{PASSWORD}@127.0.0.1:PORT"),
    ];
    let mut runs = Vec::new();
    for url in &urls {
        for (log, format) in [("info", "text"), ("debug", "text"), ("debug", "json")] {
            let url = url.clone();
            runs.push(tokio::spawn(async move {
                let out = failed_start(&url, log, format).await;
                (url, log, format, out)
            }));
        }
    }
    let mut leaks = Vec::new();
    for run in runs {
        let (url, log, format, out) = run.await.expect("run");
        assert!(
            out.contains("***@") || out.contains("Error"),
            "no error shown for {url}: {out}"
        );
        if out.contains(PASSWORD) {
            let line = out.lines().find(|l| l.contains(PASSWORD)).unwrap_or("");
            leaks.push(format!("{url} at RUST_LOG={log} ({format}): {line}"));
        }
    }
    assert!(
        leaks.is_empty(),
        "the password reached the output:\n{}",
        leaks.join("\n")
    );
}
