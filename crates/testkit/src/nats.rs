//! nats-server with JetStream for tests: a real process on a free loopback port with its own
//! storage directory, killed (and its directory removed) on drop.
//!
//! ```no_run
//! let mut nats = herald_testkit::nats::NatsServer::start();
//! let url = nats.url(); // nats://127.0.0.1:<port>
//! nats.restart();       // same port, same storage: JetStream file streams survive
//! ```
//!
//! The binary is `nats-server` on `PATH`, or `HERALD_NATS_SERVER_BIN`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// Environment variable naming the nats-server binary.
pub const BIN_ENV: &str = "HERALD_NATS_SERVER_BIN";

/// How long a server gets to start accepting and report healthy JetStream.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running nats-server (`-js`), killed on drop.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    monitor_port: u16,
    /// JetStream storage, removed when the server is dropped (after it is killed: fields drop
    /// after `Drop::drop`).
    store_dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

fn binary() -> String {
    std::env::var(BIN_ENV).unwrap_or_else(|_| "nats-server".to_owned())
}

impl NatsServer {
    /// Start a server with JetStream on a free port, and wait until it is healthy.
    ///
    /// # Panics
    /// When the binary is missing (with an install hint) or the server does not come up.
    pub fn start() -> NatsServer {
        Self::start_with_args(&[])
    }

    /// Like [`start`](Self::start), with extra command-line arguments.
    pub fn start_with_args(args: &[&str]) -> NatsServer {
        let mut server = Self::unstarted(args);
        server.spawn();
        server
    }

    fn unstarted(args: &[&str]) -> NatsServer {
        NatsServer {
            child: None,
            port: free_port(),
            monitor_port: free_port(),
            store_dir: tempfile::Builder::new()
                .prefix("herald-nats-")
                .tempdir()
                .expect("create nats-server storage directory"),
            extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    fn spawn(&mut self) {
        self.spawn_process();
        self.wait_healthy();
    }

    fn spawn_process(&mut self) {
        let bin = binary();
        let child = Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-m")
            .arg(self.monitor_port.to_string())
            .arg("-sd")
            .arg(self.store_dir.path())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
                "`{bin}` not found. Install it (Debian/Ubuntu: `apt-get install -y nats-server`) \
                 or set {BIN_ENV} to its path."
            ),
            Err(err) => panic!("could not start `{bin}`: {err}"),
        };
        self.child = Some(child);
    }

    /// Poll the monitoring endpoint until JetStream reports healthy.
    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "nats-server exited during startup ({status}); is port {} taken?",
                        self.port
                    );
                }
            }
            let client_port_open = TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if client_port_open
                && self
                    .monitor_get("/healthz")
                    .is_some_and(|b| b.contains("ok"))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not become healthy in time"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The storage directory (`-sd`): JetStream keeps its file streams under it. Copy it aside
    /// while the server is stopped and put it back later to make the server come back *behind*.
    pub fn store_dir(&self) -> &Path {
        self.store_dir.path()
    }

    /// The HTTP monitoring base URL (`/varz`, `/connz?subs=1`, `/subsz`, `/healthz`).
    pub fn monitor_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitor_port)
    }

    /// GET a monitoring path (e.g. `/connz?subs=1`) and return the body, `None` on any error.
    /// Plain HTTP/1.0 over a socket, so that tests need no HTTP client for it.
    pub fn monitor_get(&self, path: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.monitor_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.").then(|| body.to_owned())
    }

    /// Stop the server the way an operator would (SIGTERM: it flushes JetStream to disk and
    /// closes connections), SIGKILL after 10 s. The storage directory stays.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let terminated = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if terminated {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kill the server at once (SIGKILL), as a crash would. Publications acknowledged in the
    /// last moment may not have reached the disk.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the server again on the same port with the same storage.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again on a running server");
        self.spawn();
    }

    /// Stop, then start again on the same port and storage.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Where [`snapshot`](Self::snapshot) keeps its copy of the storage directory.
    fn snapshot_dir(&self) -> std::path::PathBuf {
        self.store_dir.path().with_extension("snapshot")
    }

    /// Copy the storage directory aside *while the server runs*, as a crash-consistent backup
    /// (a disk snapshot) would: what JetStream acknowledged is in its files already, and a server
    /// started from them recovers like one restarted after a crash. The server keeps running, so
    /// its clients notice nothing. See [`restart_from_snapshot`](Self::restart_from_snapshot).
    pub fn snapshot(&self) {
        // JetStream writes each stored message to its block file before acknowledging it; a
        // short pause lets index writes that follow settle too.
        std::thread::sleep(Duration::from_millis(200));
        let saved = self.snapshot_dir();
        let _ = std::fs::remove_dir_all(&saved);
        copy_tree(self.store_dir.path(), &saved);
    }

    /// Kill the server and start it again from the last [`snapshot`](Self::snapshot): whatever
    /// was stored since is lost, as when a server comes back from an older backup of its store.
    pub fn restart_from_snapshot(&mut self) {
        let saved = self.snapshot_dir();
        assert!(saved.is_dir(), "restart_from_snapshot without a snapshot");
        self.kill();
        std::fs::remove_dir_all(self.store_dir.path()).expect("remove the newer store");
        copy_tree(&saved, self.store_dir.path());
        self.start_again();
    }
}

/// Copy a directory tree (a nats-server storage directory).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create copy");
    for entry in std::fs::read_dir(from).expect("read storage") {
        let entry = entry.expect("storage entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy storage file");
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.snapshot_dir());
    }
}

/// Three nats-server processes routed into one cluster (`herald`) with JetStream, so streams can
/// have three replicas and survive the loss of one server. Killed on drop.
pub struct NatsCluster {
    servers: Vec<NatsServer>,
}

impl NatsCluster {
    /// Start the three servers and wait until each reports healthy (JetStream has a meta leader).
    /// A server that exits at startup (a port taken meanwhile by another process) makes it start
    /// over on new ports, up to three times.
    pub fn start() -> NatsCluster {
        for _ in 0..2 {
            if let Some(cluster) = Self::try_start() {
                return cluster;
            }
        }
        Self::try_start().expect("a NATS cluster")
    }

    fn try_start() -> Option<NatsCluster> {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut servers: Vec<NatsServer> = (0..3)
            .map(|i| {
                let others: Vec<String> = routes
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, p)| format!("nats://127.0.0.1:{p}"))
                    .collect();
                let args = [
                    "--cluster_name".to_owned(),
                    "herald".to_owned(),
                    "--server_name".to_owned(),
                    format!("n{i}"),
                    "--cluster".to_owned(),
                    format!("nats://127.0.0.1:{}", routes[i]),
                    "--routes".to_owned(),
                    others.join(","),
                ];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                NatsServer::unstarted(&args)
            })
            .collect();
        for s in &mut servers {
            s.spawn_process();
        }
        std::thread::sleep(Duration::from_millis(200));
        for s in &mut servers {
            if s.child
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
            {
                return None;
            }
        }
        for s in &mut servers {
            s.wait_healthy();
        }
        Some(NatsCluster { servers })
    }

    /// Every server's client URL, comma-separated (what `broker_url` takes).
    pub fn url(&self) -> String {
        let urls: Vec<String> = self.servers.iter().map(NatsServer::url).collect();
        urls.join(",")
    }

    /// The servers.
    pub fn servers(&mut self) -> &mut [NatsServer] {
        &mut self.servers
    }
}
