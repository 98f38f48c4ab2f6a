//! redis-server and a three-master Redis Cluster for tests, on free loopback ports, killed on drop.
//!
//! ```no_run
//! let redis = herald_testkit::redis::RedisServer::start();
//! let url = redis.url(); // redis://127.0.0.1:PORT
//! let cluster = herald_testkit::redis::RedisCluster::start();
//! let url = cluster.url(); // redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
//! ```
//! The binaries come from `PATH`, or from `HERALD_REDIS_SERVER_BIN` / `HERALD_REDIS_CLI_BIN`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use tempfile::TempDir;

/// How long a server gets to answer `PING` after it was spawned.
// Generous: a restart replays the AOF, which a long soak makes large (seen over 10 s on a busy
// 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a new cluster gets to report `cluster_state:ok` everywhere.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

fn server_bin() -> String {
    std::env::var("HERALD_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

fn cli_bin() -> String {
    std::env::var("HERALD_REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into())
}

fn missing(bin: &str, err: std::io::Error) -> ! {
    panic!(
        "cannot run `{bin}` ({err}). Install Redis ≥ 7.0 (`apt-get install redis-server`), or point \
         HERALD_REDIS_SERVER_BIN / HERALD_REDIS_CLI_BIN at the binaries"
    )
}

/// A fresh, empty directory under the system temp dir, removed when dropped.
fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("herald-{tag}-"))
        .tempdir()
        .expect("create temp dir")
}

/// How to start a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Keep data across [`RedisServer::restart`] with an append-only file fsynced on every write
    /// (default: no persistence at all, `--save "" --appendonly no`).
    pub persistent: bool,
    /// Extra `redis-server` arguments, e.g. `["--requirepass", "secret"]`.
    pub extra_args: Vec<String>,
    /// Run as a Sentinel monitoring this master: (name, `host:port`), quorum 1.
    pub sentinel_of: Option<(String, String)>,
}

/// One `redis-server` process on 127.0.0.1, killed on drop.
pub struct RedisServer {
    port: u16,
    options: RedisOptions,
    cluster_bus_port: Option<u16>,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// A standalone server without persistence.
    pub fn start() -> Self {
        Self::start_with(RedisOptions::default())
    }

    /// A standalone server with `options`.
    pub fn start_with(options: RedisOptions) -> Self {
        Self::spawn_new(options, false)
    }

    fn spawn_new(options: RedisOptions, cluster: bool) -> Self {
        let mut last_err = String::new();
        // A free port can be taken between `free_port` and the bind: try a few.
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port(),
                cluster_bus_port: cluster.then(free_port),
                options: options.clone(),
                dir: temp_dir("redis"),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("redis-server did not start: {last_err}");
    }

    fn args(&self) -> Vec<String> {
        if let Some((name, master)) = &self.options.sentinel_of {
            let (host, port) = master.rsplit_once(':').expect("host:port");
            let conf = self.dir.path().join("sentinel.conf");
            if !conf.exists() {
                let text = format!(
                    "sentinel monitor {name} {host} {port} 1\nsentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 2000\n"
                );
                std::fs::write(&conf, text).expect("write sentinel.conf");
            }
            return [
                conf.display().to_string(),
                "--sentinel".into(),
                "--port".into(),
                self.port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--dir".into(),
                self.dir.path().display().to_string(),
                "--logfile".into(),
                "redis.log".into(),
            ]
            .into_iter()
            .chain(self.options.extra_args.iter().cloned())
            .collect();
        }
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--save".into(),
            "".into(),
            "--daemonize".into(),
            "no".into(),
            "--logfile".into(),
            "redis.log".into(),
        ];
        if self.options.persistent {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        } else {
            args.extend(["--appendonly", "no"].map(String::from));
        }
        if let Some(bus) = self.cluster_bus_port {
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                ]
                .map(String::from),
            );
            args.push(bus.to_string());
        }
        args.extend(self.options.extra_args.iter().cloned());
        args
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = server_bin();
        let child = Command::new(&bin)
            .args(self.args())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| missing(&bin, e));
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if ping(self.port, self.password()) {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let mut err = String::new();
                if let Some(mut e) = self.child.take().and_then(|c| c.stderr) {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("exited with {status}: {err} {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        Err(format!(
            "no PONG within {START_TIMEOUT:?}: {}",
            self.log_tail()
        ))
    }

    fn password(&self) -> Option<&str> {
        let args = &self.options.extra_args;
        args.iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// A Sentinel (`redis-server --sentinel`) that monitors `master` under `name`, quorum 1.
    pub fn start_sentinel(name: &str, master: &RedisServer) -> Self {
        Self::start_with(RedisOptions {
            sentinel_of: Some((name.to_owned(), master.addr())),
            ..RedisOptions::default()
        })
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// The server's working directory (AOF, logs, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kill the process (SIGKILL) and wait for it. Data survives only with `persistent`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start again on the same port and directory after [`stop`](Self::stop) (or kill and start).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return,
                // The old socket may linger a moment.
                Err(e) if Instant::now() > deadline => panic!("redis-server restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Save a snapshot of the data now (`SAVE`) and keep a copy of it aside, for
    /// [`restart_from_snapshot`](Self::restart_from_snapshot).
    pub fn snapshot(&self) {
        assert_eq!(self.cli(&["SAVE"]), "OK", "SAVE failed");
        std::fs::copy(self.dir().join("dump.rdb"), self.dir().join("older.rdb"))
            .expect("copy the snapshot aside");
    }

    /// Kill the process and start it from the last [`snapshot`](Self::snapshot), dropping the
    /// append-only file: whatever was written since the snapshot is lost, as when Redis comes
    /// back from an older RDB file (or a lagging replica is promoted).
    ///
    /// A `persistent` server starts without its AOF first: Redis 7 with `appendonly yes` and no
    /// AOF would start *empty* and ignore the RDB (a wipe, not a rollback). Once the snapshot is
    /// loaded, the AOF is turned back on and rewritten from it before this returns.
    pub fn restart_from_snapshot(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(self.dir().join("appendonlydir"));
        std::fs::copy(self.dir().join("older.rdb"), self.dir().join("dump.rdb"))
            .expect("put the older snapshot back");
        let persistent = std::mem::replace(&mut self.options.persistent, false);
        self.restart();
        self.options.persistent = persistent;
        if persistent {
            assert_eq!(self.cli(&["CONFIG", "SET", "appendonly", "yes"]), "OK");
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let info = self.cli(&["INFO", "persistence"]);
                let done = info.contains("aof_enabled:1")
                    && info.contains("aof_rewrite_in_progress:0")
                    && info.contains("aof_rewrite_scheduled:0");
                if done {
                    break;
                }
                assert!(Instant::now() < deadline, "AOF rewrite never ended: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Run `redis-cli -p PORT args…` and return its trimmed stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let bin = cli_bin();
        let mut cmd = Command::new(&bin);
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(pw) = self.password() {
            cmd.args(["--no-auth-warning", "-a", pw]);
        }
        cmd.args(args);
        stdout_within(cmd, CLI_TIMEOUT, &bin, &args.join(" "))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long one `redis-cli` call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);

/// Run `cmd` and return its trimmed stdout; kills it and panics naming `what` when it is not done
/// within `limit`, so a server that never answers fails the call instead of hanging it. (The
/// bound is kept here rather than with `redis-cli -t`, which Redis 7.0's client does not know.)
fn stdout_within(mut cmd: Command, limit: Duration, bin: &str, what: &str) -> String {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| missing(bin, e));
    // Read on a thread: a large reply must not fill the pipe while this one waits for the exit.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{bin} {what}` did not finish within {limit:?}");
            }
        }
    }
    let out = reader.join().expect("stdout reader");
    String::from_utf8_lossy(&out).trim().to_owned()
}

/// Send `PING` (after `AUTH` when a password is set) and expect `+PONG`.
fn ping(port: u16, password: Option<&str>) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut req = Vec::new();
    if let Some(pw) = password {
        req.extend(format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{pw}\r\n", pw.len()).as_bytes());
    }
    req.extend(b"*1\r\n$4\r\nPING\r\n");
    if s.write_all(&req).is_err() {
        return false;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.windows(7).any(|w| w == b"+PONG\r\n") {
            return true;
        }
        if got.starts_with(b"-") {
            return false;
        }
    }
    false
}

/// A Redis Cluster of three masters without replicas, each a [`RedisServer`].
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start three `--cluster-enabled yes` servers, join them with
    /// `redis-cli --cluster create … --cluster-replicas 0 --cluster-yes`, and wait for
    /// `cluster_state:ok` on every node.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::spawn_new(RedisOptions::default(), true))
            .collect();
        let bin = cli_bin();
        let mut cmd = Command::new(&bin);
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(n.addr());
        }
        let out = cmd
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| missing(&bin, e));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let ok = cluster.nodes.iter().all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
            // Every node must also agree that all slots are assigned.
            if ok
                && cluster
                    .nodes
                    .iter()
                    .all(|n| n.cli(&["CLUSTER", "SLOTS"]).lines().count() > 6)
            {
                return cluster;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The three masters.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// `redis://127.0.0.1:P` for every node, for clients that take a list of seed URLs.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The slot of a hash tag (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, tag: &str) -> u16 {
        let reply = self.nodes[0].cli(&["CLUSTER", "KEYSLOT", tag]);
        reply.trim().parse().expect("CLUSTER KEYSLOT")
    }

    /// The index of the master that owns `slot`, as the first node sees it.
    pub fn owner_of(&self, slot: u16) -> usize {
        let ids: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.cli(&["CLUSTER", "MYID"]).trim().to_owned())
            .collect();
        for line in self.nodes[0].cli(&["CLUSTER", "NODES"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let owns = fields.iter().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
            });
            if owns {
                return ids
                    .iter()
                    .position(|id| id == fields[0])
                    .expect("a known node");
            }
        }
        panic!("no node owns slot {slot}");
    }

    /// Move `slot` and its keys to master `to` while the cluster serves, the way
    /// `redis-cli --cluster reshard` does: IMPORTING / MIGRATING, `MIGRATE` the keys in batches,
    /// then `SETSLOT … NODE` on every master.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        let from = self.owner_of(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let slot_s = slot.to_string();
        let src_id = src.cli(&["CLUSTER", "MYID"]).trim().to_owned();
        let dst_id = dst.cli(&["CLUSTER", "MYID"]).trim().to_owned();
        let ok = |reply: String, what: &str| assert!(reply.trim() == "OK", "{what}: {reply}");
        ok(
            dst.cli(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]),
            "IMPORTING",
        );
        ok(
            src.cli(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]),
            "MIGRATING",
        );
        let port = dst.port().to_string();
        loop {
            let keys = src.cli(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"]);
            let keys: Vec<&str> = keys
                .lines()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &port,
                "",
                "0",
                "5000",
                "REPLACE",
                "KEYS",
            ];
            args.extend(keys.iter().copied());
            let reply = src.cli(&args);
            assert!(
                reply.trim() == "OK" || reply.trim() == "NOKEY",
                "MIGRATE: {reply}"
            );
        }
        for n in &self.nodes {
            ok(
                n.cli(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]),
                "SETSLOT NODE",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_starts_restarts_and_persists() {
        let mut r = RedisServer::start_with(RedisOptions {
            persistent: true,
            ..RedisOptions::default()
        });
        assert_eq!(r.cli(&["SET", "k", "v"]), "OK");
        r.restart();
        assert_eq!(r.cli(&["GET", "k"]), "v");
        let port = r.port();
        drop(r);
        assert!(!ping(port, None), "killed on drop");
    }

    #[test]
    fn a_cli_call_that_never_ends_fails_within_its_limit() {
        let started = Instant::now();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            stdout_within(cmd, Duration::from_millis(300), "sleep", "30")
        }))
        .expect_err("it should fail");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("did not finish within"), "{msg}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed at the limit"
        );
    }

    #[test]
    fn sentinel_names_the_master() {
        let master = RedisServer::start();
        let sentinel = RedisServer::start_sentinel("mymaster", &master);
        let addr = sentinel.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
        assert_eq!(
            addr.lines().last(),
            Some(master.port().to_string().as_str()),
            "{addr}"
        );
    }

    #[test]
    fn cluster_reaches_ok() {
        let c = RedisCluster::start();
        assert_eq!(c.nodes().len(), 3);
        assert!(c.url().starts_with("redis+cluster://127.0.0.1:"));
        assert!(c.nodes()[0]
            .cli(&["CLUSTER", "INFO"])
            .contains("cluster_size:3"));
    }
}
