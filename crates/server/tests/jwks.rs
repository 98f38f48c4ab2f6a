//! Token keys from a JWKS URL and `aud`/`iss` checks, against the real binary. The key set is
//! served by a separate process (Python's `http.server`) whose request log counts the fetches.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

/// `python3 -m http.server` serving a directory, with its request log in a file.
struct KeyServer {
    _child: Child,
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    log: PathBuf,
    port: u16,
}

impl KeyServer {
    async fn start(jwks_fixture: &str) -> KeyServer {
        let tmp = tempfile::Builder::new()
            .prefix("herald-test-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::copy(fixture(jwks_fixture), dir.join("jwks.json")).unwrap();
        let log = dir.join("requests.log");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 http.server");
        herald_testkit::eventually(
            Duration::from_secs(10),
            "python3 http.server (the key server) to accept connections",
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
        KeyServer {
            _child: child,
            _tmp: tmp,
            dir,
            log,
            port,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/jwks.json", self.port)
    }

    fn serve(&self, jwks_fixture: &str) {
        std::fs::copy(fixture(jwks_fixture), self.dir.join("jwks.json")).unwrap();
    }

    fn fetches(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("GET /jwks.json")
            .count()
    }
}

fn signed(alg: Algorithm, kid: Option<&str>, claims: Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    let key = match alg {
        Algorithm::RS256 => {
            EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa_private.pem")).unwrap())
        }
        _ => EncodingKey::from_ec_pem(&std::fs::read(fixture("ec_private.pem")).unwrap()),
    }
    .unwrap();
    encode(&header, &claims, &key).unwrap()
}

async fn connect(node: &Node, token: &str) -> Result<Client, (u64, Value)> {
    let mut c = node.client().await;
    let r = c.call("connect", json!({ "token": token })).await;
    match r["error"]["code"].as_u64() {
        None => Ok(c),
        Some(code) => Err((code, r)),
    }
}

#[tokio::test]
async fn keys_come_from_the_jwks_url_and_rotate() {
    let keys = KeyServer::start("jwks_rsa.json").await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            "token_jwks_url = {:?}\ntoken_jwks_min_refresh_ms = 300\n",
            keys.url()
        ),
    );
    let node = Node::start(&["--config", &cfg], &[("HERALD_TOKEN_HMAC_SECRET", "")]).await;
    let claims = json!({"sub": "alice", "exp": now() + 60});

    let mut alice = connect(
        &node,
        &signed(Algorithm::RS256, Some("rsa-1"), claims.clone()),
    )
    .await
    .expect("a key of the set verifies");
    assert_eq!(keys.fetches(), 1);

    // A kid the set lacks: refused, whatever the signature.
    let ec = signed(Algorithm::ES256, Some("ec-1"), claims.clone());
    let (code, r) = connect(&node, &ec)
        .await
        .err()
        .expect("unknown kid refused");
    assert_eq!(code, 101, "{r}");
    assert_eq!(r["error"]["message"], "unknown signing key (kid)", "{r}");
    // The wrong algorithm for a known key, and no kid with no static key: refused.
    let (code, _) = connect(
        &node,
        &signed(Algorithm::ES256, Some("rsa-1"), claims.clone()),
    )
    .await
    .err()
    .expect("alg must match the key");
    assert_eq!(code, 101);
    let (code, _) = connect(&node, &signed(Algorithm::RS256, None, claims.clone()))
        .await
        .err()
        .expect("no kid, no static RSA key");
    assert_eq!(code, 101);

    // A flood of made-up kids costs the provider at most one fetch per interval.
    let before = keys.fetches();
    let flood: Vec<_> = (0..30)
        .map(|i| {
            let t = signed(
                Algorithm::RS256,
                Some(&format!("made-up-{i}")),
                claims.clone(),
            );
            let node_addr = node.addr;
            tokio::spawn(async move {
                let mut c = Client::open(node_addr, &[]).await;
                c.call("connect", json!({ "token": t })).await
            })
        })
        .collect();
    for f in flood {
        let r = herald_testkit::joined(f, std::time::Duration::from_secs(60), "a flooding client")
            .await;
        assert_eq!(r["error"]["code"], 101, "{r}");
    }
    assert!(
        keys.fetches() - before <= 2,
        "{} fetches for 30 unknown kids",
        keys.fetches() - before
    );

    // Rotation: the provider adds a key; a token naming it works once the interval has passed.
    keys.serve("jwks_rsa_ec.json");
    // Waits out token_jwks_min_refresh_ms (300) since the flood's fetch: the period under test.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut bob = connect(&node, &ec).await.expect("the new key verifies");

    // The provider goes away: the keys already loaded keep working.
    drop(keys);
    connect(
        &node,
        &signed(Algorithm::RS256, Some("rsa-1"), claims.clone()),
    )
    .await
    .expect("cached key still verifies");
    for c in [&mut alice, &mut bob] {
        let r = c.call("subscribe", json!({"channel": "news"})).await;
        assert!(r.get("subscribe").is_some(), "connection unusable: {r}");
    }
}

#[tokio::test]
async fn audience_and_issuer_are_enforced_when_configured() {
    let node = Node::start(
        &[],
        &[
            ("HERALD_TOKEN_AUDIENCE", "chat-app"),
            ("HERALD_TOKEN_ISSUER", "https://id.example"),
        ],
    )
    .await;
    let good = token(json!({"sub": "a", "aud": "chat-app", "iss": "https://id.example"}));
    connect(&node, &good).await.expect("matching aud and iss");
    for (claims, why) in [
        (
            json!({"sub": "a", "aud": "other", "iss": "https://id.example"}),
            "wrong audience",
        ),
        (
            json!({"sub": "a", "aud": "chat-app", "iss": "https://evil.example"}),
            "wrong issuer",
        ),
        (json!({"sub": "a"}), "a required claim is missing"),
    ] {
        let (code, r) = connect(&node, &token(claims.clone()))
            .await
            .err()
            .expect("refused");
        assert_eq!(code, 101, "{claims}: {r}");
        assert_eq!(r["error"]["message"], why, "{claims}: {r}");
    }
}
