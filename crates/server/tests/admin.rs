//! The admin UI (`/admin`): off by default, the password and its session, the CSRF token and
//! the `Origin` check, the client API key kept out, and the cluster view over two real nodes on
//! a real Redis and on a real NATS.

mod common;

use std::net::Ipv4Addr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use herald_testkit::{eventually, eventually_some};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const PASSWORD: &str = "admin-pw";

/// A raw HTTP exchange with extra headers: status, response headers (lower-case names) and the
/// body as JSON (or a string).
async fn request(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Vec<(String, String)>, Value) {
    request_from(Ipv4Addr::LOCALHOST, node, method, path, headers, body).await
}

/// [`request`] from the source address `from` (any 127.x.y.z is this machine).
async fn request_from(
    from: Ipv4Addr,
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Vec<(String, String)>, Value) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind((from, 0).into())
        .expect("bind the source address");
    let mut stream = tokio::time::timeout(Duration::from_secs(10), socket.connect(node.addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        node.addr,
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("timeout")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (status, headers, value)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

async fn admin_node(extra_env: &[(&str, &str)]) -> Node {
    let mut env = vec![
        ("HERALD_ADMIN__ENABLED", "true"),
        ("HERALD_ADMIN__PASSWORD", PASSWORD),
    ];
    env.extend_from_slice(extra_env);
    Node::start(&["--dev"], &env).await
}

/// Log in; returns the cookie pair (`herald_admin=…`) and the CSRF token.
async fn login(node: &Node) -> (String, String) {
    let (status, headers, body) = request(
        node,
        "POST",
        "/admin/login",
        &[],
        Some(json!({ "password": PASSWORD })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let cookie = header(&headers, "set-cookie").expect("set-cookie");
    let pair = cookie.split(';').next().unwrap().to_owned();
    (pair, body["csrf"].as_str().expect("csrf").to_owned())
}

#[tokio::test]
async fn admin_is_off_unless_enabled() {
    // Not --dev and no [admin]: nothing under /admin.
    let node = Node::start(&[], &[]).await;
    let (status, _, _) = request(&node, "GET", "/admin/", &[], None).await;
    assert_eq!(status, 404);
    let (status, _, _) = request(
        &node,
        "GET",
        "/admin/api/overview",
        &[("Authorization", &format!("Bearer {API_KEY}"))],
        None,
    )
    .await;
    assert_eq!(status, 404);
    // Enabled: the page is served from the binary.
    let on = admin_node(&[]).await;
    let (status, headers, body) = request(&on, "GET", "/admin/", &[], None).await;
    assert_eq!(status, 200);
    assert!(body.as_str().unwrap().contains("Herald admin"));
    assert!(header(&headers, "content-security-policy").is_some());
    let (status, _, _) = request(&on, "GET", "/admin/app.js", &[], None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_or_missing_credentials_are_refused() {
    let node = admin_node(&[]).await;
    for body in [
        json!({"password": "wrong"}),
        json!({}),
        json!({"password": ""}),
    ] {
        let (status, headers, reply) =
            request(&node, "POST", "/admin/login", &[], Some(body.clone())).await;
        assert_eq!(status, 401, "{body} → {reply}");
        assert_eq!(reply["error"]["code"], 101);
        assert!(header(&headers, "set-cookie").is_none());
    }
    // No credentials, a made-up cookie, a wrong bearer token.
    for headers in [
        vec![],
        vec![("Cookie", "herald_admin=0123456789abcdef")],
        vec![("Authorization", "Bearer nope")],
    ] {
        let (status, _, _) = request(&node, "GET", "/admin/api/overview", &headers, None).await;
        assert_eq!(status, 401, "{headers:?}");
    }
    // The right password: an HttpOnly, SameSite=Strict session cookie that opens the API.
    let (status, headers, _) = request(
        &node,
        "POST",
        "/admin/login",
        &[],
        Some(json!({"password": PASSWORD})),
    )
    .await;
    assert_eq!(status, 200);
    let cookie = header(&headers, "set-cookie").unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let (cookie, _) = login(&node).await;
    let (status, _, body) = request(
        &node,
        "GET",
        "/admin/api/overview",
        &[("Cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["nodes"].is_array());
    // Logged out, the same cookie no longer works.
    request(&node, "POST", "/admin/logout", &[("Cookie", &cookie)], None).await;
    let (status, _, _) = request(
        &node,
        "GET",
        "/admin/api/overview",
        &[("Cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn the_client_api_key_does_not_reach_the_admin_api() {
    let node = admin_node(&[]).await;
    let key = format!("Bearer {API_KEY}");
    // The key works on the client API …
    let (status, _) = node.api("/api/info", None).await;
    assert_eq!(status, 200);
    // … and nowhere in the admin API, nor as a login password.
    for (method, path, body) in [
        ("GET", "/admin/api/overview", None),
        ("GET", "/admin/api/config", None),
        (
            "POST",
            "/admin/api/publish",
            Some(json!({"channel": "chat", "data": 1})),
        ),
        (
            "POST",
            "/admin/api/disconnect",
            Some(json!({"user": "alice"})),
        ),
    ] {
        let (status, _, reply) =
            request(&node, method, path, &[("Authorization", &key)], body).await;
        assert_eq!(status, 401, "{method} {path}: {reply}");
    }
    let (status, _, _) = request(
        &node,
        "POST",
        "/admin/login",
        &[],
        Some(json!({"password": API_KEY})),
    )
    .await;
    assert_eq!(status, 401);
    // The admin token works for scripts, without a CSRF token.
    let admin = format!("Bearer {PASSWORD}");
    let (status, _, reply) = request(
        &node,
        "POST",
        "/admin/api/publish",
        &[("Authorization", &admin)],
        Some(json!({"channel": "chat", "data": {"n": 1}})),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["offset"], 1);
    // The configuration view masks secrets.
    let (_, _, config) = request(
        &node,
        "GET",
        "/admin/api/config",
        &[("Authorization", &admin)],
        None,
    )
    .await;
    let text = config.to_string();
    assert!(
        !text.contains(PASSWORD) && !text.contains(API_KEY) && !text.contains(SECRET),
        "{text}"
    );
    assert_eq!(config["admin"]["password"], "***");
}

#[tokio::test]
async fn state_changes_need_the_csrf_token_and_the_same_origin() {
    let node = admin_node(&[]).await;
    let (cookie, csrf) = login(&node).await;
    let publish = json!({"channel": "chat", "data": {"from": "admin"}});
    let own_origin = format!("http://{}", node.addr);

    // Cookie alone (what a cross-site form would send): refused.
    let (status, _, reply) = request(
        &node,
        "POST",
        "/admin/api/publish",
        &[("Cookie", &cookie)],
        Some(publish.clone()),
    )
    .await;
    assert_eq!(status, 403, "{reply}");
    // A wrong token: refused.
    let (status, _, _) = request(
        &node,
        "POST",
        "/admin/api/publish",
        &[("Cookie", &cookie), ("X-Herald-CSRF", "0000")],
        Some(publish.clone()),
    )
    .await;
    assert_eq!(status, 403);
    // The right token from another origin: refused, and so is a login from there.
    for (path, body) in [
        ("/admin/api/publish", publish.clone()),
        ("/admin/login", json!({"password": PASSWORD})),
    ] {
        let (status, _, reply) = request(
            &node,
            "POST",
            path,
            &[
                ("Cookie", &cookie),
                ("X-Herald-CSRF", &csrf),
                ("Origin", "http://evil.example"),
            ],
            Some(body),
        )
        .await;
        assert_eq!(status, 403, "{path}: {reply}");
    }
    // Reads from another origin are refused too (the answers hold live data).
    let (status, _, _) = request(
        &node,
        "GET",
        "/admin/api/overview",
        &[("Cookie", &cookie), ("Origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 403);
    // Token and own origin: published.
    let (status, _, reply) = request(
        &node,
        "POST",
        "/admin/api/publish",
        &[
            ("Cookie", &cookie),
            ("X-Herald-CSRF", &csrf),
            ("Origin", &own_origin),
        ],
        Some(publish),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    // The session answer (which holds the token) is refused to another origin …
    let (status, _, _) = request(
        &node,
        "GET",
        "/admin/session",
        &[("Cookie", &cookie), ("Origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 403);
    // … and gives the token back to a reloaded page.
    let (_, _, session) =
        request(&node, "GET", "/admin/session", &[("Cookie", &cookie)], None).await;
    assert_eq!(session["csrf"], json!(csrf));
}

#[tokio::test]
async fn dev_without_a_password_opens_the_ui_but_keeps_csrf() {
    let node = Node::dev().await;
    let (_, _, session) = request(&node, "GET", "/admin/session", &[], None).await;
    assert_eq!(session["password_required"], false, "{session}");
    assert_eq!(session["logged_in"], false);
    // Any password logs in (the page sends none) …
    let (status, headers, reply) =
        request(&node, "POST", "/admin/login", &[], Some(json!({}))).await;
    assert_eq!(status, 200, "{reply}");
    let cookie = header(&headers, "set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    // … but a session still needs its CSRF token to change anything, and no login means 401.
    let publish = json!({"channel": "chat", "data": 1});
    let (status, _, _) = request(
        &node,
        "POST",
        "/admin/api/publish",
        &[("Cookie", &cookie)],
        Some(publish.clone()),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _) = request(&node, "POST", "/admin/api/publish", &[], Some(publish)).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn channel_history_pages_go_backwards() {
    let node = admin_node(&[]).await;
    for n in 1..=5 {
        node.publish("paged", json!({ "n": n })).await;
    }
    let admin = format!("Bearer {PASSWORD}");
    let auth = [("Authorization", admin.as_str())];
    let page = |query: String| {
        let node = &node;
        async move {
            let (status, _, body) = request(
                node,
                "GET",
                &format!("/admin/api/channel?name=paged&limit=2{query}"),
                &auth,
                None,
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let offsets: Vec<u64> = body["history"]["publications"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["offset"].as_u64().unwrap())
                .collect();
            (
                offsets,
                body["history"]["epoch"].as_str().unwrap().to_owned(),
            )
        }
    };
    let (newest, epoch) = page(String::new()).await;
    assert_eq!(newest, [4, 5]);
    let (older, _) = page(format!("&before=4&epoch={epoch}")).await;
    assert_eq!(older, [2, 3]);
    let (oldest, _) = page(format!("&before=2&epoch={epoch}")).await;
    assert_eq!(oldest, [1]);
    let (none, _) = page(format!("&before=1&epoch={epoch}")).await;
    assert!(none.is_empty());
}

#[tokio::test]
async fn outside_dev_admin_needs_a_password_and_not_the_api_key() {
    for (env, why) in [
        (
            vec![("HERALD_ADMIN__ENABLED", "true")],
            "without a password",
        ),
        (
            vec![
                ("HERALD_ADMIN__ENABLED", "true"),
                ("HERALD_ADMIN__PASSWORD", API_KEY),
            ],
            "with the API key as password",
        ),
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.args(["serve", "--port", "0"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("HERALD_API_KEY", API_KEY);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                panic!("herald started {why}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "herald started {why}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("[admin]"), "{why}: {stderr}");
    }
}

#[tokio::test]
async fn the_cluster_view_covers_every_node_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    cluster_view_covers_every_node(&redis.url()).await;
}

#[tokio::test]
async fn the_cluster_view_covers_every_node_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    cluster_view_covers_every_node(&nats.url()).await;
}

async fn cluster_view_covers_every_node(url: &str) {
    let url = url.to_owned();
    let a = admin_node(&[("HERALD_BROKER_URL", &url), ("HERALD_NODE_NAME", "node-a")]).await;
    let b = admin_node(&[("HERALD_BROKER_URL", &url), ("HERALD_NODE_NAME", "node-b")]).await;
    // Two clients on B, one on A, all in "room".
    let _b1 = b.connected(&["room"]).await;
    let _b2 = b.connected(&["room"]).await;
    let _a1 = a.connected(&["room", "lobby"]).await;
    let admin = format!("Bearer {PASSWORD}");
    let auth = [("Authorization", admin.as_str())];
    let overview = eventually_some(
        Duration::from_secs(15),
        "node A's overview to show node-a with 1 connection and node-b with 2",
        || async {
            let (status, _, o) = request(&a, "GET", "/admin/api/overview", &auth, None).await;
            assert_eq!(status, 200, "{o}");
            let conns = |name: &str| {
                o["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|n| n["name"] == name)
                    .map(|n| n["connections"].clone())
            };
            (conns("node-a") == Some(json!(1)) && conns("node-b") == Some(json!(2))).then_some(o)
        },
    )
    .await;
    assert_eq!(overview["node"], "node-a");
    // The series is sampled at the tick: a sample taken after all three connected has the total.
    eventually(
        Duration::from_secs(15),
        "the overview's latest series sample to count 3 connections",
        || async {
            let (_, _, o) = request(&a, "GET", "/admin/api/overview", &auth, None).await;
            o["series"].as_array().unwrap().last().unwrap()["connections"] == 3
        },
    )
    .await;
    // The channel list sums subscribers over both nodes.
    let (_, _, ch) = request(&a, "GET", "/admin/api/channels?q=roo", &auth, None).await;
    assert_eq!(
        ch["channels"],
        json!([{"channel": "room", "subscribers": 3}]),
        "{ch}"
    );
    // The channel view shows presence from both nodes.
    let (_, _, room) = request(&a, "GET", "/admin/api/channel?name=room", &auth, None).await;
    assert_eq!(
        room["presence"]["clients"].as_array().unwrap().len(),
        3,
        "{room}"
    );
    assert_eq!(room["subscribers"], 3);
    // Each presence entry names the node that hosts it (asked of every node).
    let mut hosts: Vec<&str> = room["presence"]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["node"].as_str().unwrap_or("none"))
        .collect();
    hosts.sort();
    assert_eq!(hosts, ["node-a", "node-b", "node-b"], "{room}");
    // A user's connections (here the anonymous user "") are asked of every node.
    let (status, _, found) = request(&a, "GET", "/admin/api/connections?user=", &auth, None).await;
    assert_eq!(status, 200, "{found}");
    let per_node: Vec<(String, usize)> = found["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap().to_owned(),
                n["clients"].as_array().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(
        per_node,
        [("node-a".to_owned(), 1), ("node-b".to_owned(), 2)],
        "{found}"
    );
    assert_eq!(found["missing"], json!([]));
}

/// An admin node whose stderr (its log) is collected: the node, its process (killed on drop) and
/// the log so far.
async fn admin_node_with_log(
    extra_env: &[(&str, &str)],
) -> (Node, tokio::process::Child, Arc<Mutex<String>>) {
    let mut cmd = tokio::process::Command::new(herald_bin());
    cmd.args(["serve", "--dev", "--port", "0"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HERALD_API_KEY", API_KEY)
        .env("HERALD_ADMIN__ENABLED", "true")
        .env("HERALD_ADMIN__PASSWORD", PASSWORD)
        .env("RUST_LOG", "info")
        .envs(extra_env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn herald");
    let log = Arc::new(Mutex::new(String::new()));
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let into = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = err.next_line().await {
            let mut log = into.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(15), out.next_line())
        .await
        .expect("herald did not start in time")
        .expect("read stdout")
        .expect("herald exited before listening");
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    let addr = line
        .split_whitespace()
        .nth(3)
        .and_then(|u| u.strip_prefix("http://"))
        .expect("listening line")
        .parse()
        .expect("address");
    (Node::attach("admin", addr), child, log)
}

async fn login_from(node: &Node, from: Ipv4Addr, password: &str) -> (u16, Option<u64>) {
    let (status, headers, _) = request_from(
        from,
        node,
        "POST",
        "/admin/login",
        &[],
        Some(json!({ "password": password })),
    )
    .await;
    let retry = header(&headers, "retry-after").map(|v| v.parse().expect("Retry-After secs"));
    (status, retry)
}

/// The sum of `key=N` over the log's summary lines of failed logins, and how many there are.
fn summaries(log: &str, key: &str) -> (u64, usize) {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed logins"))
        .collect();
    let sum = lines
        .iter()
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix(key)))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum();
    (sum, lines.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_logins_are_limited_per_source_and_overall() {
    const WINDOW: u64 = 5;
    let (node, _process, log) = admin_node_with_log(&[
        ("HERALD_ADMIN__MAX_FAILED_LOGINS_PER_IP", "5"),
        ("HERALD_ADMIN__MAX_FAILED_LOGINS", "8"),
        ("HERALD_ADMIN__LOGIN_WINDOW_S", "5"),
    ])
    .await;
    let a = Ipv4Addr::new(127, 0, 0, 1);
    let elsewhere = Ipv4Addr::new(127, 0, 0, 9);
    let started = Instant::now();

    // 100 guesses at once from one address: only 5 are compared with the password.
    let guesses = (0..100).map(|i| {
        let node = &node;
        async move { login_from(node, a, &format!("guess-{i}")).await }
    });
    let answers = futures_util::future::join_all(guesses).await;
    let compared = answers.iter().filter(|(s, _)| *s == 401).count();
    let limited: Vec<_> = answers.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(compared, 5, "guesses compared: {answers:?}");
    assert_eq!(limited.len(), 95, "{answers:?}");
    assert!(limited
        .iter()
        .all(|(_, retry)| retry.is_some_and(|r| (1..=WINDOW).contains(&r))));
    // That address is locked, the correct password included; another one is not.
    assert_eq!(login_from(&node, a, PASSWORD).await.0, 429);
    assert_eq!(login_from(&node, elsewhere, PASSWORD).await.0, 200);

    // Guesses from three more addresses reach the overall limit (8) after 3 more.
    let spread = (0..15).map(|i| {
        let node = &node;
        let from = Ipv4Addr::new(127, 0, 0, 2 + (i % 3) as u8);
        async move { login_from(node, from, &format!("guess-b{i}")).await }
    });
    let answers = futures_util::future::join_all(spread).await;
    assert_eq!(
        answers.iter().filter(|(s, _)| *s == 401).count(),
        3,
        "{answers:?}"
    );
    // Now the correct password is refused from anywhere, as a login or a bearer token.
    let (status, retry) = login_from(&node, elsewhere, PASSWORD).await;
    assert_eq!(status, 429, "a correct password does not lift the lockout");
    let (status, headers, reply) = request_from(
        elsewhere,
        &node,
        "GET",
        "/admin/api/overview",
        &[("Authorization", &format!("Bearer {PASSWORD}"))],
        None,
    )
    .await;
    assert_eq!(status, 429, "{reply}");
    assert!(header(&headers, "retry-after").is_some());
    assert!(
        reply["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("too many failed logins, retry after")),
        "{reply}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(WINDOW),
        "the test ran past the window ({:?}); its counts are meaningless",
        started.elapsed()
    );

    // After Retry-After, the correct password works again, from the locked address too.
    let retry = retry.expect("Retry-After");
    // Waits out the Retry-After period it was given: that period is what is tested.
    tokio::time::sleep(Duration::from_millis(retry * 1000 + 200)).await;
    assert_eq!(login_from(&node, elsewhere, PASSWORD).await.0, 200);
    assert_eq!(login_from(&node, a, PASSWORD).await.0, 200);

    // The log: a summary per window, not a line per failure, and never a password.
    let logged = |key| summaries(&log.lock().unwrap(), key).0;
    eventually(
        Duration::from_secs(3 * WINDOW),
        "a logged summary of the 8 failures and 110 refusals",
        || async { logged("failed=") >= 8 && logged("refused=") >= 110 },
    )
    .await;
    let log = log.lock().unwrap().clone();
    let (failed, lines) = summaries(&log, "failed=");
    assert_eq!(failed, 8, "{log}");
    assert!(lines <= 3, "one line per window, not per failure: {log}");
    // 95 + 1 from the first address, 12 from the others, 2 with the correct password.
    assert_eq!(summaries(&log, "refused=").0, 110, "{log}");
    assert!(
        !log.contains("guess-") && !log.contains(PASSWORD),
        "a password reached the log: {log}"
    );
}

#[tokio::test]
async fn the_new_admin_endpoints_need_credentials_and_csrf() {
    let node = admin_node(&[]).await;
    let key = format!("Bearer {API_KEY}");
    let calls: [(&str, &str, Option<Value>); 6] = [
        (
            "POST",
            "/admin/api/broadcast",
            Some(json!({"channels": ["a"], "data": 1})),
        ),
        (
            "POST",
            "/admin/api/subscribe",
            Some(json!({"user": "u", "channel": "a"})),
        ),
        (
            "POST",
            "/admin/api/unsubscribe",
            Some(json!({"user": "u", "channel": "a"})),
        ),
        ("GET", "/admin/api/audit", None),
        (
            "POST",
            "/admin/api/history_remove",
            Some(json!({"channel": "a"})),
        ),
        ("GET", "/admin/api/history_channels", None),
    ];
    let (cookie, _csrf) = login(&node).await;
    for (method, path, body) in calls {
        let (status, _, r) = request(&node, method, path, &[], body.clone()).await;
        assert_eq!(status, 401, "{path} without credentials: {r}");
        let (status, _, r) = request(
            &node,
            method,
            path,
            &[("Authorization", &key)],
            body.clone(),
        )
        .await;
        assert_eq!(status, 401, "{path} with the client API key: {r}");
        if method == "POST" {
            let (status, _, r) = request(&node, method, path, &[("Cookie", &cookie)], body).await;
            assert_eq!(status, 403, "{path} from a session without CSRF: {r}");
        }
    }
    // Bad input is refused with a clear error, not ignored.
    let admin = format!("Bearer {PASSWORD}");
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/subscribe",
        &[("Authorization", &admin)],
        Some(json!({"user": "u", "channel": "a", "extra": 1})),
    )
    .await;
    assert_eq!(status, 400, "{r}");
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/broadcast",
        &[("Authorization", &admin)],
        Some(json!({"channels": ["a"], "data": 1, "bogus": true})),
    )
    .await;
    assert_eq!(status, 400, "{r}");
}

/// The next `pub` push of `channel`, skipping presence pushes and other channels' pushes.
async fn next_pub_of(c: &mut Client, channel: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Some(m) = c.next_within(Duration::from_secs(1)).await else {
            continue;
        };
        if m["pub"]["channel"] == channel {
            return m["pub"].clone();
        }
    }
    panic!("no publication on {channel} within 10 s");
}

/// The next push with `key` (skipping others), within 10 s.
async fn next_push(c: &mut Client, key: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(m) = c.next_within(Duration::from_secs(1)).await {
            if let Some(v) = m.get(key) {
                return v.clone();
            }
        }
    }
    panic!("no {key} push within 10 s");
}

#[tokio::test]
async fn admin_actions_reach_clients_and_are_audited() {
    let (node, _child, log) = admin_node_with_log(&[("HERALD_TOKEN_HMAC_SECRET", SECRET)]).await;
    let mut alice = node.client().await;
    let t = token(json!({"sub": "alice"}));
    let r = alice
        .call(
            "connect",
            json!({"token": t, "subs": {"news": {}, "sport": {}}}),
        )
        .await;
    assert!(r["connect"]["client"].is_string(), "{r}");
    // A browser session broadcasts to two channels.
    let (cookie, csrf) = login(&node).await;
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/broadcast",
        &[("Cookie", &cookie), ("X-Herald-CSRF", &csrf)],
        Some(json!({"channels": ["news", "sport"], "data": {"n": 1}})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (r["published"].clone(), r["failed"].clone()),
        (json!(2), json!(0))
    );
    for channel in ["news", "sport"] {
        let p = next_pub_of(&mut alice, channel).await;
        assert_eq!(p["data"], json!({"n": 1}), "{p}");
    }
    // A script subscribes alice to a third channel server-side, then unsubscribes her.
    let admin = format!("Bearer {PASSWORD}");
    let auth = [("Authorization", admin.as_str())];
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/subscribe",
        &auth,
        Some(json!({"user": "alice", "channel": "extra"})),
    )
    .await;
    assert_eq!((status, r), (200, json!({})));
    assert_eq!(next_push(&mut alice, "subscribe").await["channel"], "extra");
    node.publish("extra", json!("x")).await;
    assert_eq!(next_pub_of(&mut alice, "extra").await["data"], "x");
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/unsubscribe",
        &auth,
        Some(json!({"user": "alice", "channel": "extra"})),
    )
    .await;
    assert_eq!((status, r), (200, json!({})));
    assert_eq!(next_push(&mut alice, "unsub").await["channel"], "extra");
    // A refused publish is recorded as failed.
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/publish",
        &auth,
        Some(json!({"channel": "ghost:x", "data": 1})),
    )
    .await;
    assert_eq!(status, 404, "{r}");
    let (status, _, r) = request(
        &node,
        "POST",
        "/admin/api/disconnect",
        &auth,
        Some(json!({"user": "alice"})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    // The audit log, newest first: who (never a secret), action, target, result.
    let (status, _, audit) = request(&node, "GET", "/admin/api/audit", &auth, None).await;
    assert_eq!(status, 200, "{audit}");
    let entries: Vec<(String, String, String, bool)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e["at_ms"].as_u64().unwrap() > 0, "{e}");
            assert_eq!(e["source"], "127.0.0.1", "{e}");
            (
                e["who"].as_str().unwrap().to_owned(),
                e["action"].as_str().unwrap().to_owned(),
                e["target"].as_str().unwrap().to_owned(),
                e["ok"].as_bool().unwrap(),
            )
        })
        .collect();
    let want = [
        ("password", "disconnect", "user=alice", true),
        ("password", "publish", "ghost:x", false),
        ("password", "unsubscribe", "user=alice channel=extra", true),
        ("password", "subscribe", "user=alice channel=extra", true),
        ("session-1", "broadcast", "news,sport", true),
        ("session-1", "login", "", true),
    ]
    .map(|(w, a, t, ok)| (w.to_owned(), a.to_owned(), t.to_owned(), ok));
    assert_eq!(entries, want, "{audit}");
    let text = audit.to_string();
    for secret in [PASSWORD, csrf.as_str(), cookie.split('=').nth(1).unwrap()] {
        assert!(!text.contains(secret), "a secret in the audit log: {text}");
    }
    // Each action is also a structured log line, without secrets.
    let log_has = |what: &str| log.lock().unwrap().contains(what);
    eventually(
        Duration::from_secs(5),
        "the broadcast's audit log line",
        || async { log_has("admin action") && log_has("action=\"broadcast\"") },
    )
    .await;
    assert!(log_has("who=\"session-1\""), "{}", log.lock().unwrap());
    assert!(!log_has(PASSWORD), "the password in the log");
}

#[tokio::test]
async fn rate_limit_refusals_show_in_the_series() {
    let node = admin_node(&[
        ("HERALD_LIMITS__HANDSHAKES_PER_IP_PER_S", "1"),
        ("HERALD_LIMITS__HANDSHAKE_BURST_PER_IP", "1"),
    ])
    .await;
    let admin = format!("Bearer {PASSWORD}");
    let auth = [("Authorization", admin.as_str())];
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        node.addr
    );
    let mut refused = 0;
    for _ in 0..5 {
        let mut tcp = tokio::net::TcpStream::connect(node.addr).await.unwrap();
        tcp.write_all(upgrade.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
            .await
            .expect("an answer to the upgrade")
            .unwrap();
        if String::from_utf8_lossy(&buf[..n]).contains(" 429 ") {
            refused += 1;
        }
    }
    assert!(refused >= 3, "{refused} upgrades refused");
    eventually(
        Duration::from_secs(10),
        "a series sample with rate-limited handshakes",
        || async {
            let (_, _, o) = request(&node, "GET", "/admin/api/overview", &auth, None).await;
            o["series"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["rate_limited_per_s"].as_f64().unwrap() > 0.0)
        },
    )
    .await;
    let (_, _, o) = request(&node, "GET", "/admin/api/overview", &auth, None).await;
    let last = o["series"].as_array().unwrap().last().unwrap().clone();
    for key in ["errors_per_s", "slow_consumers_per_s", "rate_limited_per_s"] {
        assert!(last[key].is_number(), "{key} missing: {last}");
    }
}

#[tokio::test]
async fn a_node_that_stops_answering_is_shown_lost() {
    let redis = herald_testkit::redis::RedisServer::start();
    let url = redis.url();
    let a = admin_node(&[("HERALD_BROKER_URL", &url), ("HERALD_NODE_NAME", "node-a")]).await;
    let b = admin_node(&[("HERALD_BROKER_URL", &url), ("HERALD_NODE_NAME", "node-b")]).await;
    let admin = format!("Bearer {PASSWORD}");
    let auth = [("Authorization", admin.as_str())];
    let state_of_b = || async {
        let (_, _, o) = request(&a, "GET", "/admin/api/overview", &auth, None).await;
        let b = o["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "node-b")
            .cloned();
        (o, b)
    };
    eventually(Duration::from_secs(15), "node-b live on node A", || async {
        state_of_b().await.1.is_some_and(|b| b["state"] == "live")
    })
    .await;
    let killed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    b.kill().await;
    let (o, lost) = eventually_some(
        Duration::from_secs(15),
        "node-b shown as lost on node A",
        || async {
            let (o, b) = state_of_b().await;
            b.filter(|b| b["state"] == "lost").map(|b| (o, b))
        },
    )
    .await;
    let since = lost["lost_since_ms"].as_u64().expect("lost_since_ms");
    assert!(
        since + 3_000 >= killed_ms && since <= killed_ms + 3_000,
        "lost since {since}, killed at {killed_ms}: {lost}"
    );
    // Left out of the totals: a sample taken since counts node A alone (the series is sampled
    // once a second, so the newest sample may still be from before B was seen lost).
    eventually(
        Duration::from_secs(5),
        "a sample counting node A alone",
        || async {
            let (o, _) = state_of_b().await;
            o["series"].as_array().unwrap().last().unwrap()["nodes"] == 1
        },
    )
    .await;
    assert_eq!(o["lost_kept_ms"], 600_000);
    let a_row = o["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "node-a")
        .cloned()
        .unwrap();
    assert_eq!(a_row["state"], "live", "{o}");
    assert!(a_row.get("lost_since_ms").is_none(), "{o}");
}

/// `GET path` with the admin password as bearer token; the status must be 200.
async fn admin_get(node: &Node, path: &str) -> Value {
    let admin = format!("Bearer {PASSWORD}");
    let (status, _, body) = request(node, "GET", path, &[("Authorization", &admin)], None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// `POST path` with the admin password as bearer token: (status, body).
async fn admin_post(node: &Node, path: &str, body: Value) -> (u16, Value) {
    let admin = format!("Bearer {PASSWORD}");
    let (status, _, body) =
        request(node, "POST", path, &[("Authorization", &admin)], Some(body)).await;
    (status, body)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn history_rows_have_a_time_and_history_can_be_removed_in_memory() {
    history_rows_have_a_time_and_history_can_be_removed(&admin_node(&[]).await).await;
}

#[tokio::test]
async fn history_rows_have_a_time_and_history_can_be_removed_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    let node = admin_node(&[("HERALD_BROKER_URL", &redis.url())]).await;
    history_rows_have_a_time_and_history_can_be_removed(&node).await;
}

#[tokio::test]
async fn history_rows_have_a_time_and_history_can_be_removed_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    let node = admin_node(&[("HERALD_BROKER_URL", &nats.url())]).await;
    history_rows_have_a_time_and_history_can_be_removed(&node).await;
}

async fn history_rows_have_a_time_and_history_can_be_removed(node: &Node) {
    // The store's clock (Redis, NATS) is this machine's: allow a second either way.
    let before = unix_ms() - 1000;
    for n in 1..=3 {
        node.publish("gone", json!({ "n": n })).await;
    }
    let after = unix_ms() + 1000;
    let view = admin_get(node, "/admin/api/channel?name=gone").await;
    let h = &view["history"];
    let epoch = h["epoch"].as_str().expect("epoch").to_owned();
    let rows = h["publications"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{view}");
    for row in rows {
        let at = row["time_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no time: {row}"));
        assert!(
            (before..=after).contains(&at),
            "time {at} not in [{before}, {after}]: {row}"
        );
    }
    // Removing needs the CSRF token from a browser session.
    let (cookie, csrf) = login(node).await;
    let remove = json!({"channel": "gone"});
    let (status, _, r) = request(
        node,
        "POST",
        "/admin/api/history_remove",
        &[("Cookie", &cookie)],
        Some(remove.clone()),
    )
    .await;
    assert_eq!(status, 403, "{r}");
    let (status, _, r) = request(
        node,
        "POST",
        "/admin/api/history_remove",
        &[("Cookie", &cookie), ("X-Herald-CSRF", &csrf)],
        Some(remove),
    )
    .await;
    assert_eq!((status, &r), (200, &json!({})));
    // The publications are gone; the epoch and the top offset stay, and offsets continue.
    let view = admin_get(node, "/admin/api/channel?name=gone").await;
    assert_eq!(view["history"]["publications"], json!([]), "{view}");
    assert_eq!(view["history"]["epoch"], epoch.as_str(), "{view}");
    assert_eq!(view["history"]["offset"], 3, "{view}");
    let p = node.publish("gone", json!({ "n": 4 })).await;
    assert_eq!(
        (p["epoch"].as_str(), p["offset"].as_u64()),
        (Some(epoch.as_str()), Some(4)),
        "{p}"
    );
    let view = admin_get(node, "/admin/api/channel?name=gone").await;
    let offsets: Vec<u64> = view["history"]["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [4], "{view}");
    // Bad input gets a clear error.
    for (body, status) in [
        (json!({"channel": "gone", "extra": 1}), 400),
        (json!({}), 400),
        (json!({"channel": "bad{name}"}), 400),
    ] {
        let (got, r) = admin_post(node, "/admin/api/history_remove", body.clone()).await;
        assert_eq!(got, status, "{body}: {r}");
        assert!(r["error"]["message"].is_string(), "{r}");
    }
    // Audited, with who did it.
    let audit = admin_get(node, "/admin/api/audit").await;
    let removals: Vec<(&str, &str, bool)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "history_remove")
        .map(|e| {
            (
                e["who"].as_str().unwrap(),
                e["target"].as_str().unwrap(),
                e["ok"].as_bool().unwrap(),
            )
        })
        .collect();
    // Newest first; a body that does not parse is refused before any action, a bad name by it.
    assert_eq!(
        removals,
        [
            ("password", "bad{name}", false),
            ("session-1", "gone", true)
        ],
        "{audit}"
    );
}

#[tokio::test]
async fn channels_with_only_history_are_listed_in_pages_in_memory() {
    channels_with_only_history_are_listed_in_pages(&admin_node(&[]).await, None).await;
}

#[tokio::test]
async fn channels_with_only_history_are_listed_in_pages_on_redis() {
    let redis = herald_testkit::redis::RedisServer::start();
    let node = admin_node(&[("HERALD_BROKER_URL", &redis.url())]).await;
    // Redis's cursor is `<shard>:<SCAN cursor>`: one with a shard it does not have is refused.
    channels_with_only_history_are_listed_in_pages(&node, Some("9:0")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_with_only_history_are_listed_in_pages_on_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(herald_testkit::redis::RedisCluster::start)
        .await
        .expect("start the Redis Cluster");
    let node = admin_node(&[("HERALD_BROKER_URL", &cluster.url())]).await;
    // The cursor is `<master index>:<SCAN cursor>`: one with a master it does not have is refused.
    channels_with_only_history_are_listed_in_pages(&node, Some("9:0")).await;
}

#[tokio::test]
async fn channels_with_only_history_are_listed_in_pages_on_nats() {
    let nats = herald_testkit::nats::NatsServer::start();
    let node = admin_node(&[("HERALD_BROKER_URL", &nats.url())]).await;
    // The cursor is `<server page offset>:<subject token>`: a token with a dot is none.
    channels_with_only_history_are_listed_in_pages(&node, Some("0:a.b")).await;
}

/// `bad_cursor`: a cursor the broker must refuse (the memory broker's cursor is a channel name,
/// so none there).
async fn channels_with_only_history_are_listed_in_pages(node: &Node, bad_cursor: Option<&str>) {
    let quiet: Vec<String> = (1..=7).map(|n| format!("quiet{n}")).collect();
    for c in &quiet {
        node.publish(c, json!(1)).await;
    }
    // A channel with a subscriber is in the subscribers' list, not this one; a channel whose
    // history was removed holds none.
    let _sub = node.connected(&["busy"]).await;
    node.publish("busy", json!(1)).await;
    node.publish("emptied", json!(1)).await;
    let (status, r) = admin_post(
        node,
        "/admin/api/history_remove",
        json!({"channel": "emptied"}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    eventually(
        Duration::from_secs(10),
        "the cluster view to count busy's subscriber",
        || async {
            let ch = admin_get(node, "/admin/api/channels?q=busy").await;
            ch["channels"] == json!([{"channel": "busy", "subscribers": 1}])
        },
    )
    .await;
    // Follow the cursor to the end, 3 at a time.
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 50, "the listing did not end: {listed:?}");
        let more = cursor
            .as_ref()
            .map(|c| {
                format!(
                    "&cursor={}",
                    form_urlencoded::byte_serialize(c.as_bytes()).collect::<String>()
                )
            })
            .unwrap_or_default();
        let page = admin_get(node, &format!("/admin/api/history_channels?limit=3{more}")).await;
        assert_eq!(page["available"], true, "{page}");
        let names = page["channels"].as_array().unwrap();
        listed.extend(names.iter().map(|n| n.as_str().unwrap().to_owned()));
        match page["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    listed.sort();
    listed.dedup();
    assert_eq!(listed, quiet, "pages: {pages}");
    // The name search applies to each page.
    let page = admin_get(node, "/admin/api/history_channels?limit=100&q=quiet3").await;
    assert_eq!(page["channels"], json!(["quiet3"]), "{page}");
    // A cursor no page gave, or a bad limit, is refused.
    let mut bad = vec![
        "cursor=".to_owned(),
        "limit=0".to_owned(),
        "limit=x".to_owned(),
    ];
    bad.extend(bad_cursor.map(|c| format!("cursor={c}")));
    for query in bad {
        let admin = format!("Bearer {PASSWORD}");
        let (status, _, r) = request(
            node,
            "GET",
            &format!("/admin/api/history_channels?{query}"),
            &[("Authorization", &admin)],
            None,
        )
        .await;
        assert_eq!(status, 400, "{query}: {r}");
    }
}
