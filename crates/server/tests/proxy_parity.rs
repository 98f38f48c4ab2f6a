//! Proxy hooks' answers beyond allow/deny, against the real binary and a real HTTP backend
//! served by this test: rights a subscription is granted (`allow`), per-subscription options
//! (`override`), the connect hook's server-side `subs` with options, the connection's `meta`
//! sent back to later hooks, a namespace's own hook URLs and timeout, and the client's headers
//! as HTTP headers of the hook request.
//!
//! The backend answers what the client asks it to: the connect hook returns the `connect`
//! command's `data.result`, the subscribe hook the `subscribe` command's `data` as its result,
//! and the rpc hook the `meta` it was sent; under `/slow/` it answers after 1.5 s. Every request it
//! gets is recorded.

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// One request the backend got.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: hyper::HeaderMap,
    body: Value,
}

/// An HTTP backend on a free port, answering every hook as the module docs say.
struct Backend {
    scheme: &'static str,
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(path: &str, body: &Value) -> Value {
    match path {
        "/connect" => json!({"result": body["data"]["result"]}),
        "/subscribe" => json!({"result": body.get("data").cloned().unwrap_or(json!({}))}),
        "/rpc" => json!({"result": {"data": {"meta": body.get("meta")}}}),
        "/publish" => json!({"result": {}}),
        _ => json!({"error": {"code": 1404, "message": "no such hook"}}),
    }
}

impl Backend {
    async fn start() -> Backend {
        Backend::start_with(None).await
    }

    /// Over TLS with `acceptor` (its URLs are `https://`).
    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Backend {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let record = record.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let headers = req.headers().clone();
                            let bytes = req.into_body().collect().await.unwrap().to_bytes();
                            let body: Value = serde_json::from_slice(&bytes).unwrap();
                            let hook = match path.strip_prefix("/slow") {
                                Some(hook) => {
                                    tokio::time::sleep(std::time::Duration::from_millis(1500))
                                        .await;
                                    hook
                                }
                                None => &path,
                            };
                            let reply = answer(hook, &body);
                            record.lock().unwrap().push(Seen {
                                path,
                                headers,
                                body,
                            });
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                                reply.to_string(),
                            ))))
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        // A client without an acceptable certificate fails the handshake.
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(tcp).await {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(tcp), service).await;
                        }
                    }
                });
            }
        });
        Backend {
            port,
            seen,
            task,
            scheme,
        }
    }

    fn url(&self, hook: &str) -> String {
        format!("{}://127.0.0.1:{}/{hook}", self.scheme, self.port)
    }

    /// The HTTP headers of the requests to `path` so far.
    fn headers(&self, path: &str) -> Vec<hyper::HeaderMap> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.headers.clone())
            .collect()
    }

    /// The requests to `path` so far.
    fn requests(&self, path: &str) -> Vec<Value> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.body.clone())
            .collect()
    }
}

/// `room` asks the subscribe hook and lets subscribers read history and presence (not publish);
/// `nohist` keeps no history.
async fn node(backend: &Backend) -> (Node, ConfigFile) {
    let cfg = config_file(
        "herald.toml",
        &format!(
            r#"
[proxy]
connect_url = {:?}
subscribe_url = {:?}
rpc_url = {:?}
timeout_ms = 3000

[[namespaces]]
name = "room"
subscribe = "token"
subscribe_proxy = true
publish = false
history_size = 10
presence = true
join_leave = true

[[namespaces]]
name = "nohist"
subscribe = "token"
subscribe_proxy = true
history_size = 0
"#,
            backend.url("connect"),
            backend.url("subscribe"),
            backend.url("rpc"),
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    (node, cfg)
}

/// A client the connect hook answered with `result`; returns it and the `connect` reply.
async fn connected(node: &Node, result: Value) -> (Client, Value) {
    let mut c = Client::open(node.addr, &[]).await;
    let r = c.call("connect", json!({"data": {"result": result}})).await;
    assert!(r.get("connect").is_some(), "connect failed: {r}");
    (c, r["connect"].clone())
}

/// Subscribe with the subscribe hook answering `result`.
async fn subscribe(c: &mut Client, channel: &str, result: Value) -> Value {
    c.call("subscribe", json!({"channel": channel, "data": result}))
        .await
}

/// Whether publish, history and presence succeed on `channel`.
async fn rights(c: &mut Client, channel: &str) -> [bool; 3] {
    let mut out = [false; 3];
    let calls = [
        ("publish", json!({"channel": channel, "data": {"n": 1}})),
        ("history", json!({"channel": channel})),
        ("presence", json!({"channel": channel})),
    ];
    for (i, (method, params)) in calls.into_iter().enumerate() {
        let r = c.call(method, params).await;
        out[i] = match r.get(method) {
            Some(_) => true,
            None => {
                assert_eq!(r["error"]["code"], 103, "{method} on {channel}: {r}");
                false
            }
        };
    }
    out
}

#[tokio::test]
async fn rights_listed_by_the_subscribe_hook_are_exactly_what_the_subscription_may_do() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend).await;
    let (mut alice, _) = connected(&node, json!({"user": "alice"})).await;

    // No list: the namespace's rules (subscribers read, nobody publishes).
    let r = subscribe(&mut alice, "room:plain", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(rights(&mut alice, "room:plain").await, [false, true, true]);

    // Centrifugo's short name: publish although the namespace says no, and nothing else.
    let r = subscribe(&mut alice, "room:writer", json!({"allow": ["pub"]})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(
        rights(&mut alice, "room:writer").await,
        [true, false, false]
    );

    let r = subscribe(
        &mut alice,
        "room:all",
        json!({"allow": ["publish", "history", "presence"]}),
    )
    .await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(rights(&mut alice, "room:all").await, [true, true, true]);

    // An empty list: receive only.
    let r = subscribe(&mut alice, "room:reader", json!({"allow": []})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert_eq!(
        rights(&mut alice, "room:reader").await,
        [false, false, false]
    );

    // After unsubscribing, the grant is gone with the subscription.
    let r = alice
        .call("unsubscribe", json!({"channel": "room:writer"}))
        .await;
    assert!(r.get("unsubscribe").is_some(), "{r}");
    let r = alice
        .call("publish", json!({"channel": "room:writer", "data": {}}))
        .await;
    assert_eq!(r["error"]["code"], 103, "{r}");

    // What Herald does not know is a bad answer (error 100), never silently dropped.
    for (channel, result) in [
        ("room:sub", json!({"allow": ["sub"]})),
        ("room:caps", json!({"caps": []})),
        ("room:info", json!({"info": {"x": 1}})),
        (
            "room:positioning",
            json!({"override": {"force_positioning": {"value": true}}}),
        ),
    ] {
        let r = subscribe(&mut alice, channel, result).await;
        assert_eq!(r["error"]["code"], 100, "{channel}: {r}");
    }
}

#[tokio::test]
async fn the_subscribe_hook_overrides_presence_and_recovery_per_subscription() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend).await;
    let (mut alice, _) = connected(&node, json!({"user": "alice"})).await;
    let (mut ghost, _) = connected(&node, json!({"user": "ghost"})).await;

    // Not in presence, so no join either.
    let r = subscribe(&mut alice, "room:quiet", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = subscribe(
        &mut ghost,
        "room:quiet",
        json!({"override": {"presence": {"value": false}}}),
    )
    .await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = alice
        .call("presence", json!({"channel": "room:quiet"}))
        .await;
    let users: Vec<&Value> = r["presence"]["clients"]
        .as_object()
        .unwrap_or_else(|| panic!("{r}"))
        .values()
        .map(|c| &c["user"])
        .collect();
    assert_eq!(users, [&json!("alice")], "{r}");
    while let Some(m) = alice
        .next_within(std::time::Duration::from_millis(300))
        .await
    {
        assert!(
            !m.to_string().contains("ghost"),
            "a join for a subscription outside presence: {m}"
        );
    }

    // Recovery turned off for one subscription: its `since` is not honoured.
    let r = subscribe(&mut alice, "room:rec", json!({})).await;
    let epoch = r["subscribe"]["epoch"].clone();
    alice
        .call("unsubscribe", json!({"channel": "room:rec"}))
        .await;
    node.publish("room:rec", json!({"n": 1})).await;
    node.publish("room:rec", json!({"n": 2})).await;
    let since = json!({"epoch": epoch, "offset": 0});
    let r = alice
        .call(
            "subscribe",
            json!({"channel": "room:rec", "since": since,
                   "data": {"override": {"recovery": {"value": false}}}}),
        )
        .await;
    let sub = &r["subscribe"];
    assert!(sub.get("recovered").is_none(), "{r}");
    assert!(sub.get("publications").is_none(), "{r}");
    // The same `since` without the override recovers both.
    let r = ghost
        .call(
            "subscribe",
            json!({"channel": "room:rec", "since": since, "data": {}}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(
        r["subscribe"]["publications"].as_array().map(Vec::len),
        Some(2),
        "{r}"
    );

    // Overrides the namespace cannot honour are bad answers.
    let r = subscribe(
        &mut alice,
        "nohist:x",
        json!({"override": {"force_recovery": {"value": true}}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 100, "{r}");
    let r = subscribe(
        &mut alice,
        "nohist:y",
        json!({"override": {"join_leave": {"value": true}}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 100, "{r}");
}

#[tokio::test]
async fn connect_meta_travels_with_later_hook_calls_and_subs_carry_options() {
    let backend = Backend::start().await;
    let (node, _cfg) = node(&backend).await;
    let (mut alice, connect) = connected(
        &node,
        json!({
            "user": "alice",
            "meta": {"tenant": "t1", "plan": "pro"},
            "subs": {"room:srv": {"data": {"hello": 1}, "allow": ["history"]}},
        }),
    )
    .await;
    // Server-side subscription with the hook's data and rights.
    assert_eq!(connect["subs"]["room:srv"]["data"], json!({"hello": 1}));
    assert!(
        connect["subs"]["room:srv"]["epoch"].is_string(),
        "{connect}"
    );
    assert_eq!(rights(&mut alice, "room:srv").await, [false, true, false]);
    // Meta is the backend's, not the client's.
    assert!(!connect.to_string().contains("tenant"), "{connect}");

    // Every later hook call carries it.
    let r = alice
        .call("rpc", json!({"method": "whoami", "data": {}}))
        .await;
    assert_eq!(
        r["rpc"]["data"]["meta"],
        json!({"tenant": "t1", "plan": "pro"}),
        "{r}"
    );
    subscribe(&mut alice, "room:later", json!({})).await;
    let subscribes = backend.requests("/subscribe");
    assert_eq!(subscribes.len(), 1, "{subscribes:?}");
    assert_eq!(
        subscribes[0]["meta"],
        json!({"tenant": "t1", "plan": "pro"})
    );
    // A connection without meta sends none.
    let (mut bob, _) = connected(&node, json!({"user": "bob"})).await;
    let r = bob.call("rpc", json!({"method": "whoami"})).await;
    assert_eq!(r["rpc"]["data"]["meta"], Value::Null, "{r}");

    // Meta that is not an object, or too big, is a bad answer: error 100, then close 4005.
    for meta in [json!([1]), json!({"big": "x".repeat(5000)})] {
        let mut c = Client::open(node.addr, &[]).await;
        let r = c
            .call(
                "connect",
                json!({"data": {"result": {"user": "carol", "meta": meta}}}),
            )
            .await;
        assert_eq!(r["error"]["code"], 100, "{r}");
        assert_eq!(c.closed().await.code, Some(4005));
    }
}

#[tokio::test]
async fn a_namespace_with_its_own_hook_urls_and_timeout_is_called_there() {
    let main = Backend::start().await;
    let own = Backend::start().await;
    let cfg = config_file(
        "herald.toml",
        &format!(
            r#"
[proxy]
connect_url = {:?}
subscribe_url = {:?}
timeout_ms = 3000

[[proxy.namespaces]]
name = "own"
subscribe_url = {:?}
publish_url = {:?}

[[proxy.namespaces]]
name = "hurried"
subscribe_url = {:?}
timeout_ms = 200

[[namespaces]]
name = "room"
subscribe = "token"
subscribe_proxy = true

[[namespaces]]
name = "own"
subscribe = "token"
subscribe_proxy = true
publish_proxy = true

[[namespaces]]
name = "hurried"
subscribe_proxy = true
"#,
            main.url("connect"),
            main.url("subscribe"),
            own.url("subscribe"),
            own.url("publish"),
            main.url("slow/subscribe"),
        ),
    );
    let node = Node::start(&["--config", &cfg], &[]).await;
    let (mut alice, _) = connected(&node, json!({"user": "alice"})).await;

    let r = subscribe(&mut alice, "own:x", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let r = alice
        .call("publish", json!({"channel": "own:x", "data": {"n": 1}}))
        .await;
    assert!(r.get("publish").is_some(), "{r}");
    let r = subscribe(&mut alice, "room:x", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    let channels = |b: &Backend, path: &str| -> Vec<Value> {
        b.requests(path)
            .iter()
            .map(|r| r["channel"].clone())
            .collect()
    };
    assert_eq!(channels(&own, "/subscribe"), [json!("own:x")]);
    assert_eq!(channels(&own, "/publish"), [json!("own:x")]);
    assert_eq!(channels(&main, "/subscribe"), [json!("room:x")]);

    // 200 ms for `hurried`: a 1.5 s answer is too late (112); `[proxy]`'s 3 s waits for it.
    let r = subscribe(&mut alice, "hurried:x", json!({})).await;
    assert_eq!(r["error"]["code"], 112, "{r}");
    drop(node);
    let patient = config_file(
        "herald.toml",
        &format!(
            "[proxy]\nconnect_url = {:?}\nsubscribe_url = {:?}\ntimeout_ms = 3000\n\
             [[namespaces]]\nname = \"patient\"\nsubscribe_proxy = true\n",
            main.url("connect"),
            main.url("slow/subscribe"),
        ),
    );
    let node = Node::start(&["--config", &patient], &[]).await;
    let (mut alice, _) = connected(&node, json!({"user": "alice"})).await;
    let r = subscribe(&mut alice, "patient:x", json!({})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
}

#[tokio::test]
async fn allow_listed_headers_travel_as_http_headers_too_unless_turned_off() {
    for http_headers in [true, false] {
        let backend = Backend::start().await;
        let cfg = config_file(
            "herald.toml",
            &format!(
                "[proxy]\nconnect_url = {:?}\nrpc_url = {:?}\n\
                 headers = [\"X-App-Version\", \"Content-Type\"]\nhttp_headers = {http_headers}\n",
                backend.url("connect"),
                backend.url("rpc"),
            ),
        );
        let node = Node::start(&["--config", &cfg], &[]).await;
        let mut c = Client::open(
            node.addr,
            &[
                ("X-App-Version", "7"),
                ("Content-Type", "text/plain"),
                ("X-Other", "never"),
            ],
        )
        .await;
        let r = c
            .call("connect", json!({"data": {"result": {"user": "alice"}}}))
            .await;
        assert!(r.get("connect").is_some(), "{r}");
        c.call("rpc", json!({"method": "m"})).await;
        for path in ["/connect", "/rpc"] {
            let headers = backend.headers(path);
            assert_eq!(headers.len(), 1, "{path}");
            let h = &headers[0];
            let version = h.get("x-app-version").map(|v| v.to_str().unwrap());
            assert_eq!(version, http_headers.then_some("7"), "{path}: {h:?}");
            // Herald's own request keeps its own type; unlisted headers never travel.
            assert_eq!(h["content-type"], "application/json", "{path}");
            assert!(h.get("x-other").is_none(), "{path}");
            // The body has them either way.
            let body = &backend.requests(path)[0];
            assert_eq!(body["headers"]["x-app-version"], "7", "{path}");
        }
    }
}

/// A private CA, the backend's certificate for 127.0.0.1 and Herald's client certificate, as
/// PEM files; the backend's TLS acceptor requires a client certificate from that CA.
struct Pki {
    _dir: tempfile::TempDir,
    ca_file: String,
    client_cert_file: String,
    client_key_file: String,
    stranger_cert_file: String,
    stranger_key_file: String,
    acceptor: tokio_rustls::TlsAcceptor,
}

fn pki() -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf = |purpose: ExtendedKeyUsagePurpose,
                issuer: Option<(&rcgen::Certificate, &KeyPair)>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
        params.extended_key_usages = vec![purpose];
        let cert = match issuer {
            Some((ca, ca_key)) => params.signed_by(&key, ca, ca_key).unwrap(),
            None => params.self_signed(&key).unwrap(),
        };
        (cert, key)
    };
    let (server, server_key) = leaf(ExtendedKeyUsagePurpose::ServerAuth, Some((&ca, &ca_key)));
    let (client, client_key) = leaf(ExtendedKeyUsagePurpose::ClientAuth, Some((&ca, &ca_key)));
    // Self-signed: not from the CA the backend trusts.
    let (stranger, stranger_key) = leaf(ExtendedKeyUsagePurpose::ClientAuth, None);

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![server.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .unwrap();

    let dir = tempfile::Builder::new()
        .prefix("herald-proxy-tls-")
        .tempdir()
        .unwrap();
    let write = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    Pki {
        ca_file: write("ca.pem", ca.pem()),
        client_cert_file: write("client.pem", client.pem()),
        client_key_file: write("client.key", client_key.serialize_pem()),
        stranger_cert_file: write("stranger.pem", stranger.pem()),
        stranger_key_file: write("stranger.key", stranger_key.serialize_pem()),
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        _dir: dir,
    }
}

#[tokio::test]
async fn an_https_backend_with_a_private_ca_and_a_client_certificate() {
    let pki = pki();
    let backend = Backend::start_with(Some(pki.acceptor.clone())).await;
    // Whether a connect through the hook succeeds with these `[proxy]` TLS keys.
    let connects = |tls: String| {
        let url = backend.url("connect");
        async move {
            let cfg = config_file(
                "herald.toml",
                &format!("[proxy]\nconnect_url = {url:?}\ntimeout_ms = 3000\n{tls}"),
            );
            let node = Node::start(&["--config", &cfg], &[]).await;
            let mut c = Client::open(node.addr, &[]).await;
            let r = c
                .call("connect", json!({"data": {"result": {"user": "alice"}}}))
                .await;
            match r.get("connect") {
                Some(_) => true,
                None => {
                    // The TLS handshake failed: the backend is unavailable to Herald.
                    assert_eq!(r["error"]["code"], 112, "{r}");
                    false
                }
            }
        }
    };
    let ca = format!("tls_ca_file = {:?}\n", pki.ca_file);
    let client = format!(
        "tls_cert_file = {:?}\ntls_key_file = {:?}\n",
        pki.client_cert_file, pki.client_key_file
    );
    let stranger = format!(
        "tls_cert_file = {:?}\ntls_key_file = {:?}\n",
        pki.stranger_cert_file, pki.stranger_key_file
    );
    assert!(
        connects(format!("{ca}{client}")).await,
        "CA and client certificate"
    );
    assert!(
        !connects(client.clone()).await,
        "the backend's CA is not trusted"
    );
    assert!(!connects(ca.clone()).await, "no client certificate");
    assert!(
        !connects(format!("{ca}{stranger}")).await,
        "a client certificate from another CA"
    );
    assert_eq!(backend.requests("/connect").len(), 1);
}
