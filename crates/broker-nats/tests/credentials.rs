//! Credentials in the NATS URL (`nats://user:pass@host`, `nats://token@host`, which the docs
//! allow) against a real nats-server started with `--user/--pass` or `--auth`, and the password
//! never in the logs at debug level (issue 29, items 4 and 11).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_broker::conformance::{opts, unique, Recorder};
use herald_broker::SharedBroker;
use herald_testkit::nats::NatsServer;

/// Everything logged in this test binary, at debug level and above, from every crate.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Buffer(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        buffer
    })
}

#[derive(Clone)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn connect_when_up(url: &str, node: &str) -> SharedBroker {
    let broker = tokio::time::timeout(
        Duration::from_secs(10),
        herald_broker_nats::connect(url, node),
    )
    .await
    .expect("connect answered within 10 s")
    .unwrap_or_else(|e| panic!("connect with the URL's credentials: {e}"));
    broker
        .start(Arc::new(Recorder::default()))
        .await
        .expect("start");
    broker
}

/// Publish, retrying while the client reconnects (at most 20 s).
async fn publish_when_back(broker: &SharedBroker, ch: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = broker
        .publish(ch, Bytes::from_static(b"1"), None, &opts(10))
        .await
    {
        assert!(Instant::now() < deadline, "never reconnected: {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Connect with the credentials in the URL, publish, make the client reconnect (its connection
/// attempts are logged at debug level), publish again; the secret never appears in the logs.
async fn works_and_stays_secret(mut nats: NatsServer, url: &str, secret: &str) {
    let logs = logs();
    let broker = connect_when_up(url, "cred").await;
    let ch = unique("cred");
    publish_when_back(&broker, &ch).await;
    nats.restart();
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish_when_back(&broker, &ch).await;
    let text = String::from_utf8_lossy(&logs.lock().expect("log buffer")).into_owned();
    assert!(
        text.contains("127.0.0.1"),
        "the test captured no connection logs:\n{text}"
    );
    assert!(!text.contains(secret), "the secret is in the logs:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_in_the_url_authenticate() {
    // The password has a character that must be percent-encoded in a URL.
    let nats = NatsServer::start_with_args(&["--user", "herald", "--pass", "s3cret@pw"]);
    let url = format!("nats://herald:s3cret%40pw@127.0.0.1:{}", nats.port());
    works_and_stays_secret(nats, &url, "s3cret").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_the_url_authenticates() {
    let nats = NatsServer::start_with_args(&["--auth", "t0kensecret"]);
    let url = format!("nats://t0kensecret@127.0.0.1:{}", nats.port());
    works_and_stays_secret(nats, &url, "t0kensecret").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_in_the_url_is_refused_without_showing_it() {
    let nats = NatsServer::start_with_args(&["--user", "herald", "--pass", "right"]);
    let url = format!("nats://herald:wr0ngpw@127.0.0.1:{}", nats.port());
    let err = match herald_broker_nats::connect(&url, "cred").await {
        Ok(_) => panic!("a wrong password connected"),
        Err(e) => e,
    };
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wr0ngpw"), "{text}");
}
