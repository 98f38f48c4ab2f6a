//! The proxy hooks' test backend: `crates/server/tests/fixtures/proxy_backend.py`, a real HTTP
//! server in its own Python process on a free port, whose answers each test picks through the
//! cookies, data, channels and methods it sends (see the fixture's docstring).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::node::fixture;

/// The backend process, killed on drop.
pub struct HookBackend {
    _child: Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
}

impl HookBackend {
    /// Start it and wait (at most 10 s) until it listens.
    pub async fn start() -> HookBackend {
        let mut child = Command::new("python3")
            .arg(fixture("proxy_backend.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 proxy_backend.py");
        let stdout = child.stdout.take().expect("stdout");
        let line = tokio::time::timeout(
            Duration::from_secs(10),
            BufReader::new(stdout).lines().next_line(),
        )
        .await
        .expect("the hook backend did not start within 10 s")
        .expect("read the hook backend's output")
        .expect("the hook backend exited");
        let port = line
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .expect("listening line");
        HookBackend {
            _child: child,
            port,
        }
    }

    /// The URL of one hook (`connect`, `subscribe`, …).
    pub fn url(&self, hook: &str) -> String {
        format!("http://127.0.0.1:{}/{hook}", self.port)
    }

    /// A `[proxy]` section with every hook on this backend.
    pub fn section(&self, timeout_ms: u64) -> String {
        format!(
            "[proxy]\nconnect_url = {:?}\nrefresh_url = {:?}\nsubscribe_url = {:?}\n\
             sub_refresh_url = {:?}\npublish_url = {:?}\nrpc_url = {:?}\n\
             timeout_ms = {timeout_ms}\n\
             headers = [\"X-App-Version\"]\ncookies = [\"sessionid\"]\n",
            self.url("connect"),
            self.url("refresh"),
            self.url("subscribe"),
            self.url("sub_refresh"),
            self.url("publish"),
            self.url("rpc"),
        )
    }
}
