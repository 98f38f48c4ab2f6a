//! A real single-node Apache Kafka 4.x broker (KRaft: broker and controller in one JVM) for
//! tests, on free loopback ports, killed on drop.
//!
//! ```no_run
//! let mut kafka = herald_testkit::kafka::KafkaServer::start();
//! let bootstrap = kafka.bootstrap(); // 127.0.0.1:PORT
//! kafka.restart(); // SIGKILL, then the same ports and data again
//! ```
//! The jars come from Maven Central through `scripts/kafka-jars.sh` (run here when the cache is
//! missing), cached in `HERALD_KAFKA_JARS` or `~/.cache/herald/kafka-<version>`. Java 17+ comes
//! from `PATH` or `HERALD_JAVA_BIN`. Topics are created on first use with 3 partitions.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use tempfile::TempDir;

/// The Kafka version the jars script fetches by default (`HERALD_KAFKA_VERSION` overrides both).
pub const DEFAULT_VERSION: &str = "4.1.1";
/// How long the JVM gets to log that the server started (about 4 s on an idle 2-core machine;
/// a parallel cargo build can make it several times slower).
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Partitions of an auto-created topic: more than one, so order per partition is exercised.
pub const PARTITIONS: u32 = 3;
/// The line the broker logs once it serves clients.
const STARTED: &str = "Kafka Server started";
/// Runs `"$@"` (the JVM) and kills it with SIGKILL once stdin reaches its end; exits when the
/// JVM does. (A background job's stdin is /dev/null unless redirected, hence fd 3.)
const WATCHDOG: &str = r#"exec 3<&0
"$@" <&- &
jvm=$!
{ read -r _ <&3; kill -9 "$jvm" 2>/dev/null; } &
wait "$jvm""#;

fn version() -> String {
    std::env::var("HERALD_KAFKA_VERSION").unwrap_or_else(|_| DEFAULT_VERSION.into())
}

/// The folder holding Kafka's jars, fetched by `scripts/kafka-jars.sh` when not cached yet.
pub fn jars_dir() -> PathBuf {
    let dir = std::env::var_os("HERALD_KAFKA_JARS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home)
                .join(".cache/herald")
                .join(format!("kafka-{}", version()))
        });
    if !dir.join(".complete").exists() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka-jars.sh");
        let status = Command::new("bash")
            .arg(&script)
            .env("HERALD_KAFKA_JARS", &dir)
            .stdout(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            status.success(),
            "{} failed ({status}): Kafka's jars are needed (Maven and Java 17)",
            script.display()
        );
    }
    dir
}

fn java_bin() -> String {
    std::env::var("HERALD_JAVA_BIN").unwrap_or_else(|_| "java".into())
}

/// A random KRaft cluster id: 16 bytes, URL-safe base64 without padding (what
/// `kafka-storage random-uuid` prints), never starting with `-`: `kafka-storage format -t` would
/// read such an id as an option and fail ("expected one argument"), which it did for one start in
/// 64. Kafka's own `Uuid.randomUuid` draws again in that case too.
fn cluster_id() -> String {
    loop {
        let id = encoded_random_id();
        if !id.starts_with('-') {
            return id;
        }
    }
}

/// 16 random bytes in URL-safe base64 without padding.
fn encoded_random_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes: [u8; 16] = rand::random();
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = String::new();
    for b in bytes {
        bits = (bits << 8) | u32::from(b);
        n += 8;
        while n >= 6 {
            n -= 6;
            out.push(ALPHABET[((bits >> n) & 63) as usize] as char);
        }
    }
    if n > 0 {
        out.push(ALPHABET[((bits << (6 - n)) & 63) as usize] as char);
    }
    out
}

/// One Kafka broker+controller JVM on 127.0.0.1, killed on drop (its data folder removed).
pub struct KafkaServer {
    port: u16,
    controller_port: u16,
    /// The SASL listener's port and its one user (name, password), when asked for.
    sasl: Option<(u16, String, String)>,
    jars: PathBuf,
    dir: TempDir,
    child: Option<Child>,
}

impl KafkaServer {
    /// A fresh broker with an empty log, ready for clients.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Also a `SASL_PLAINTEXT` listener ([`sasl_bootstrap`](Self::sasl_bootstrap)) taking
    /// SCRAM-SHA-256 and PLAIN for one user.
    pub fn start_with_sasl(user: &str, password: &str) -> Self {
        Self::start_with(Some((user.to_owned(), password.to_owned())))
    }

    fn start_with(sasl: Option<(String, String)>) -> Self {
        let jars = jars_dir();
        let mut last_err = String::new();
        // A free port can be taken between `free_port` and the bind: try a few.
        for _ in 0..3 {
            let dir = tempfile::Builder::new()
                .prefix("herald-kafka-")
                .tempdir()
                .expect("create temp dir");
            let mut server = KafkaServer {
                port: free_port(),
                controller_port: free_port(),
                sasl: sasl.clone().map(|(u, p)| (free_port(), u, p)),
                jars: jars.clone(),
                dir,
                child: None,
            };
            server.write_config();
            if let Err(e) = server.format() {
                panic!("formatting Kafka's storage failed: {e}");
            }
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("Kafka did not start: {last_err}");
    }

    /// `host:port` for clients (`bootstrap.servers`).
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `host:port` of the SASL listener, when started with [`start_with_sasl`](Self::start_with_sasl).
    pub fn sasl_bootstrap(&self) -> Option<String> {
        self.sasl
            .as_ref()
            .map(|(port, _, _)| format!("127.0.0.1:{port}"))
    }

    /// Kill the JVM (SIGKILL: no clean shutdown) and wait until it is gone. The data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Closing the watchdog's stdin makes it kill -9 the JVM and exit.
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// Start again after [`stop`](Self::stop), on the same ports with the same data.
    pub fn start_again(&mut self) {
        if let Err(e) = self.spawn() {
            panic!("Kafka did not start again: {e}");
        }
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again).
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("server.properties")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn write_config(&self) {
        let dir = self.dir.path().display();
        let (port, cport) = (self.port, self.controller_port);
        // One node, replication factor 1 everywhere; no rebalance delay so a consumer joins at
        // once; a single offsets partition so the group coordinator loads quickly; a short
        // broker session, so that after a SIGKILL the controller lets the restarted broker
        // register again within 2 s rather than 9 (its previous incarnation must time out).
        let (mut listeners, mut advertised, mut protocols, mut sasl) = (
            format!("PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}"),
            format!("PLAINTEXT://127.0.0.1:{port}"),
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".to_owned(),
            String::new(),
        );
        if let Some((sport, user, password)) = &self.sasl {
            listeners.push_str(&format!(",SASL_PLAINTEXT://127.0.0.1:{sport}"));
            advertised.push_str(&format!(",SASL_PLAINTEXT://127.0.0.1:{sport}"));
            protocols.push_str(",SASL_PLAINTEXT:SASL_PLAINTEXT");
            // SCRAM credentials live in the metadata log (added when formatting); PLAIN's in
            // the listener's JAAS line.
            sasl = format!(
                "sasl.enabled.mechanisms=SCRAM-SHA-256,PLAIN\n\
                 listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=\
                 org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
                 listener.name.sasl_plaintext.plain.sasl.jaas.config=\
                 org.apache.kafka.common.security.plain.PlainLoginModule required \
                 user_{user}=\"{password}\";\n"
            );
        }
        let props = format!(
            "process.roles=broker,controller\n\
             node.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{cport}\n\
             listeners={listeners}\n\
             advertised.listeners={advertised}\n\
             controller.listener.names=CONTROLLER\n\
             listener.security.protocol.map={protocols}\n\
             {sasl}\
             inter.broker.listener.name=PLAINTEXT\n\
             log.dirs={dir}/data\n\
             num.partitions={PARTITIONS}\n\
             auto.create.topics.enable=true\n\
             offsets.topic.replication.factor=1\n\
             offsets.topic.num.partitions=1\n\
             transaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\n\
             share.coordinator.state.topic.replication.factor=1\n\
             share.coordinator.state.topic.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\n\
             broker.heartbeat.interval.ms=500\n\
             broker.session.timeout.ms=2000\n\
             message.max.bytes=16777216\n"
        );
        std::fs::write(self.config_path(), props).expect("write server.properties");
        let log4j = format!(
            "status = error\n\
             appender.file.type = File\n\
             appender.file.name = F\n\
             appender.file.fileName = {}\n\
             appender.file.layout.type = PatternLayout\n\
             appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
             rootLogger.level = WARN\n\
             rootLogger.appenderRef.f.ref = F\n\
             logger.started.name = kafka.server.KafkaRaftServer\n\
             logger.started.level = INFO\n",
            self.log_path().display()
        );
        std::fs::write(self.dir.path().join("log4j2.properties"), log4j).expect("write log4j2");
    }

    /// The JVM's arguments to run `main` with this server's jars and logging.
    fn java_args(&self, main: &str) -> Vec<String> {
        vec![
            "-Xmx512m".into(),
            "-Xms64m".into(),
            "-XX:+UseSerialGC".into(),
            format!(
                "-Dlog4j2.configurationFile={}",
                self.dir.path().join("log4j2.properties").display()
            ),
            "-cp".into(),
            format!("{}/*", self.jars.display()),
            main.into(),
        ]
    }

    fn format(&self) -> Result<(), String> {
        let mut cmd = Command::new(java_bin());
        cmd.args(self.java_args("kafka.tools.StorageTool"))
            .args(["format", "-t", &cluster_id(), "-c"])
            .arg(self.config_path());
        if let Some((_, user, password)) = &self.sasl {
            cmd.arg("--add-scram")
                .arg(format!("SCRAM-SHA-256=[name={user},password={password}]"));
        }
        let out = cmd
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{}` ({e}): install Java 17+ or set HERALD_JAVA_BIN",
                    java_bin()
                )
            });
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) -> Result<(), String> {
        // Count the "started" lines already in the log: a restart waits for one more.
        let before = self.log_text().matches(STARTED).count();
        let out = std::fs::File::create(self.dir.path().join("stdout.log")).expect("stdout.log");
        // The JVM runs under a watchdog shell that kills it when its stdin closes: when this
        // handle stops it, and also when the test process dies without dropping it.
        let child = Command::new("bash")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("kafka")
            .arg(java_bin())
            .args(self.java_args("kafka.Kafka"))
            .arg(self.config_path())
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("clone log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run bash ({e})"));
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if self.log_text().matches(STARTED).count() > before {
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
            "not started within {START_TIMEOUT:?}: {}",
            self.log_tail()
        ))
    }

    fn log_tail(&self) -> String {
        let mut text = self.log_text();
        text.push_str(
            &std::fs::read_to_string(self.dir.path().join("stdout.log")).unwrap_or_default(),
        );
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for KafkaServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::{cluster_id, encoded_random_id};

    #[test]
    fn cluster_ids_are_22_url_safe_characters() {
        let id = cluster_id();
        assert_eq!(id.len(), 22);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }

    #[test]
    fn cluster_ids_never_start_with_a_dash() {
        // One raw id in 64 starts with `-`: in 5,000 draws one does with near certainty.
        assert!((0..5_000).any(|_| encoded_random_id().starts_with('-')));
        assert!((0..5_000).all(|_| !cluster_id().starts_with('-')));
    }
}
