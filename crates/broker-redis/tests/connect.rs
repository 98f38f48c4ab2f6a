//! Ways to reach Redis: password, TLS with a private CA, Sentinel, bad settings.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herald_broker::conformance::{eventually, Recorder};
use herald_broker::{BrokerError, PublishOptions};
use herald_broker_redis::{RedisConfig, SentinelConfig};
use herald_testkit::free_port;
use herald_testkit::redis::{RedisOptions, RedisServer};

/// Publish through one broker and receive through another: the connection works end to end.
async fn round_trip(cfg: RedisConfig) {
    let a = herald_broker_redis::connect_with(cfg.clone(), "a")
        .await
        .expect("connect a");
    let b = herald_broker_redis::connect_with(cfg, "b")
        .await
        .expect("connect b");
    let rec = Arc::new(Recorder::default());
    a.start(Arc::new(Recorder::default())).await.unwrap();
    b.start(rec.clone()).await.unwrap();
    let ch = format!("connect{:08x}", rand::random::<u32>());
    b.subscribe(&ch).await.unwrap();
    let p = a
        .publish(
            &ch,
            Bytes::from_static(b"1"),
            None,
            &PublishOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(p.offset, 1);
    eventually("delivered", || rec.offsets(&ch) == vec![1]).await;
}

async fn connect_err(cfg: RedisConfig) -> BrokerError {
    match herald_broker_redis::connect_with(cfg, "x").await {
        Ok(_) => panic!("connected"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_in_url_or_config() {
    let redis = RedisServer::start_with(RedisOptions {
        extra_args: vec!["--requirepass".into(), "s3cret".into()],
        ..RedisOptions::default()
    });
    round_trip(RedisConfig::from_url(&format!(
        "redis://:s3cret@{}",
        redis.addr()
    )))
    .await;
    round_trip(RedisConfig {
        password: Some("s3cret".into()),
        ..RedisConfig::from_url(&redis.url())
    })
    .await;
    let err = connect_err(RedisConfig::from_url(&redis.url())).await;
    assert!(err.to_string().contains("redis"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_misconfigured_fails_at_start() {
    let port = free_port();
    let t = std::time::Instant::now();
    let err = connect_err(RedisConfig::from_url(&format!("redis://127.0.0.1:{port}"))).await;
    assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let err = connect_err(RedisConfig::from_url("mysql://x")).await;
    assert!(err.to_string().contains("unknown scheme"), "{err}");
    let err = herald_broker_redis::connect("redis+sentinel://127.0.0.1:1", "x")
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("master name"), "{err}");
}

/// `rediss://` against a redis-server with TLS on, trusting a private CA from `tls_ca_file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "herald test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("herald-tls-")
        .tempdir()
        .unwrap();
    let write = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let ca_file = write("ca.pem", ca.pem());
    let cert_file = write("server.pem", cert.pem());
    let key_file = write("server.key", key.serialize_pem());

    let tls_port = free_port();
    let redis = RedisServer::start_with(RedisOptions {
        extra_args: [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &cert_file,
            "--tls-key-file",
            &key_file,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            "no",
        ]
        .map(String::from)
        .to_vec(),
        ..RedisOptions::default()
    });
    let url = format!("rediss://localhost:{tls_port}");
    round_trip(RedisConfig {
        tls_ca_file: Some(ca_file.clone().into()),
        ..RedisConfig::from_url(&url)
    })
    .await;
    // `tls = true` turns a redis:// URL into TLS.
    round_trip(RedisConfig {
        tls: true,
        tls_ca_file: Some(ca_file.clone().into()),
        ..RedisConfig::from_url(&format!("redis://localhost:{tls_port}"))
    })
    .await;
    // Without the CA the server is not trusted.
    let err = connect_err(RedisConfig::from_url(&url)).await;
    assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
    // Herald's own subscription connection (named `herald-<node>-sub`) came in on the TLS port.
    let node = herald_broker_redis::connect_with(
        RedisConfig {
            tls_ca_file: Some(ca_file.into()),
            ..RedisConfig::from_url(&url)
        },
        "tlsnode",
    )
    .await
    .expect("connect over TLS");
    let clients = redis.cli(&["CLIENT", "LIST"]);
    let on_tls_port = format!(":{tls_port}");
    assert!(
        clients.lines().any(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or("")
            };
            field("name=") == "herald-tlsnode-sub" && field("laddr=").ends_with(&on_tls_port)
        }),
        "no herald-tlsnode-sub client on port {tls_port}:\n{clients}"
    );
    drop(node);
}

/// A Sentinel-managed master: the node asks Sentinel where the master is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master() {
    let master = RedisServer::start();
    let sentinel = RedisServer::start_sentinel("mymaster", &master);
    round_trip(RedisConfig::from_url(&format!(
        "redis+sentinel://{}/mymaster",
        sentinel.addr()
    )))
    .await;
    round_trip(RedisConfig {
        sentinel: Some(SentinelConfig {
            master: "mymaster".into(),
            nodes: vec![sentinel.addr()],
            sentinel_password: None,
        }),
        ..RedisConfig::default()
    })
    .await;
}

/// Sentinel fails the master over to its replica: the node follows (publishes get READONLY from the
/// old master and reconnect; the subscription sees the old master's new role and moves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        extra_args: vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port().to_string(),
        ],
        ..RedisOptions::default()
    });
    let sentinel = RedisServer::start_sentinel("mymaster", &master);
    // Sentinel learns about the replica from the master's INFO (every few seconds at first).
    herald_testkit::eventually(
        Duration::from_secs(20),
        "sentinel to list the replica",
        || async {
            sentinel
                .cli(&["SENTINEL", "REPLICAS", "mymaster"])
                .contains(&replica.port().to_string())
        },
    )
    .await;
    let mut cfg = RedisConfig::from_url(&format!("redis+sentinel://{}/mymaster", sentinel.addr()));
    cfg.health_check_ms = 300;
    let a = herald_broker_redis::connect_with(cfg.clone(), "a")
        .await
        .unwrap();
    let b = herald_broker_redis::connect_with(cfg, "b").await.unwrap();
    let rec = Arc::new(Recorder::default());
    a.start(Arc::new(Recorder::default())).await.unwrap();
    b.start(rec.clone()).await.unwrap();
    let ch = format!("failover{:08x}", rand::random::<u32>());
    b.subscribe(&ch).await.unwrap();
    a.publish(
        &ch,
        Bytes::from_static(b"1"),
        None,
        &PublishOptions::default(),
    )
    .await
    .unwrap();
    eventually("before failover", || rec.offsets(&ch) == vec![1]).await;

    // Until Sentinel has fresh INFO from the replica it answers NOGOODSLAVE.
    herald_testkit::eventually(
        Duration::from_secs(20),
        "sentinel to accept SENTINEL FAILOVER",
        || async { sentinel.cli(&["SENTINEL", "FAILOVER", "mymaster"]) == "OK" },
    )
    .await;
    herald_testkit::eventually(
        Duration::from_secs(20),
        "the replica to report ROLE master (the failover)",
        || async { replica.cli(&["ROLE"]).starts_with("master") },
    )
    .await;
    // Publish until it lands on the new master and reaches the subscriber there.
    herald_testkit::eventually(
        Duration::from_secs(20),
        "a publication to reach the subscriber through the new master",
        || async {
            let Ok(p) = a
                .publish(
                    &ch,
                    Bytes::from_static(b"2"),
                    None,
                    &PublishOptions::default(),
                )
                .await
            else {
                return false;
            };
            // Delivered within a second, or published again (it may have gone to the old
            // master before it turned read-only).
            let delivered = async {
                while !rec.offsets(&ch).contains(&p.offset) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(1), delivered)
                .await
                .is_ok()
        },
    )
    .await;
    // Sentinel turns the old master into a replica of the new one (which then relays
    // publications too); the subscription notices the role and moves to the new master.
    herald_testkit::eventually(
        Duration::from_secs(30),
        "the old master to report ROLE slave (demoted)",
        || async { master.cli(&["ROLE"]).starts_with("slave") },
    )
    .await;
    eventually("subscription moved", || {
        *rec.reconnects.lock().unwrap() >= 1
    })
    .await;
    herald_testkit::eventually(
        Duration::from_secs(10),
        "a publish accepted after the subscription moved",
        || async {
            a.publish(
                &ch,
                Bytes::from_static(b"3"),
                None,
                &PublishOptions::default(),
            )
            .await
            .is_ok()
        },
    )
    .await;
    eventually("after the move", || rec.offsets(&ch).len() >= 3).await;
}
