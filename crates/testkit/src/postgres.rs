//! A real PostgreSQL server for tests: `initdb` in a temporary directory, `postgres` on a free
//! loopback port with trust authentication, stopped on drop (the directory is removed with it).
//!
//! ```no_run
//! let mut pg = herald_testkit::postgres::PostgresServer::start();
//! let dsn = pg.dsn(); // host=127.0.0.1 port=PORT user=postgres dbname=postgres
//! pg.psql("CREATE TABLE t (x int)");
//! pg.restart(); // an immediate shutdown (like a crash), then the same data again
//! ```
//! The binaries come from `HERALD_POSTGRES_BIN_DIR`, else from the directory on `PATH` that has
//! `initdb`, else from the newest `/usr/lib/postgresql/*/bin` (where Debian puts them). PostgreSQL
//! refuses to run as root: as root, the server runs as the `postgres` user (or `nobody`), which
//! is given the temporary directory.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use tempfile::TempDir;

/// How long a server gets to accept queries after it was spawned (a restart after an immediate
/// shutdown replays the WAL first).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory holding `initdb` and `postgres`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("HERALD_POSTGRES_BIN_DIR") {
        return dir.into();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|d| d.join("initdb").exists() && d.join("postgres").exists());
    if let Some(dir) = on_path {
        return dir;
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    debian.sort();
    debian.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL not found: install it (`apt-get install postgresql`) or point \
             HERALD_POSTGRES_BIN_DIR at the directory holding initdb and postgres"
        )
    })
}

/// `psql`: next to the server, else on `PATH`.
fn psql_bin(bin: &Path) -> PathBuf {
    let next = bin.join("psql");
    if next.exists() {
        next
    } else {
        "psql".into()
    }
}

/// The uid and gid to run PostgreSQL as: none when not root, else `postgres` or `nobody`.
fn run_as() -> Option<(u32, u32)> {
    let out = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let user = |name: &str| {
        passwd.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.len() > 3 && f[0] == name).then(|| (f[2].parse().ok(), f[3].parse().ok()))
        })
    };
    match user("postgres").or_else(|| user("nobody")) {
        Some((Some(uid), Some(gid))) => Some((uid, gid)),
        _ => {
            panic!("running as root, and neither a postgres nor a nobody user to run PostgreSQL as")
        }
    }
}

/// One PostgreSQL server on 127.0.0.1 (user `postgres`, trust authentication), stopped on drop.
pub struct PostgresServer {
    port: u16,
    tls: bool,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    dir: TempDir,
    child: Option<Child>,
}

impl PostgresServer {
    /// Create a cluster and start it.
    pub fn start() -> Self {
        Self::start_with_tls(None)
    }

    /// Create a cluster and start it with TLS (`ssl = on`) on this PEM certificate and key;
    /// clients may still connect without TLS.
    pub fn start_tls(cert: &Path, key: &Path) -> Self {
        Self::start_with_tls(Some((cert, key)))
    }

    fn start_with_tls(tls: Option<(&Path, &Path)>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("herald-postgres-")
            .tempdir()
            .expect("create temp dir");
        let run_as = run_as();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("give the temp dir to the PostgreSQL user");
        }
        let bin = bin_dir();
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-D", "data", "-U", "postgres", "-A", "trust", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = run_as {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some((cert, key)) = tls {
            // The server reads them from its data directory, and refuses a key others can read.
            let data = dir.path().join("data");
            for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
                let to = data.join(to);
                std::fs::copy(from, &to).expect("copy the TLS files");
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                    .expect("chmod");
                if let Some((uid, gid)) = run_as {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid)).expect("chown");
                }
            }
        }
        let mut server = PostgresServer {
            port: 0,
            tls: tls.is_some(),
            bin,
            run_as,
            dir,
            child: None,
        };
        let mut last_err = String::new();
        // A free port can be taken between `free_port` and the bind: try a few.
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("postgres did not start: {last_err}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = File::create(self.dir.path().join("postgres.log")).expect("create log");
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.args(["-D", "data", "-p", &self.port.to_string()])
            .args(["-k", &self.dir.path().display().to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            // Tests lose nothing to a process crash without fsync (the page cache survives).
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            // Several servers run at once in a test binary: keep each one small.
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=50"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.tls {
            cmd.args(["-c", "ssl=on"]);
        }
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        self.child = Some(
            cmd.spawn()
                .map_err(|e| format!("cannot run postgres: {e}"))?,
        );
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if self.try_psql("SELECT 1").is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited with {status}: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        Err(format!(
            "no answer within {START_TIMEOUT:?}: {}",
            self.log_tail()
        ))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A key=value connection string for user `postgres`, database `postgres`.
    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Run SQL with `psql` (one statement or several); its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql failed on {sql:?}: {e}"))
    }

    fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(psql_bin(&self.bin))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-q", "-A", "-t"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Stop at once (an immediate shutdown: every connection is cut, as in a crash) and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stop (immediately) and start again on the same port with the same data.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("postgres restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
