//! Centrifugo's own Python server SDK, `cent` (pinned, from PyPI), against a real node: the
//! application side of a migration where only `api_url` changed. Herald WebSocket clients
//! check that what the SDK published arrived and that its `disconnect` closed them.
//!
//! The SDK lives in a virtualenv under the target directory (`centrifugo-venv`), made and
//! filled by the test on first use (pip, about 10 s) and reused after.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The `cent` release the test pins (Centrifugo v5/v6 API).
const CENT_VERSION: &str = "5.2.0";

/// A virtualenv with `cent` installed, made once.
fn venv_python() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let venv = target.join("centrifugo-venv");
    let python = venv.join("bin/python");
    let installed = |python: &PathBuf| {
        std::process::Command::new(python)
            .args([
                "-c",
                &format!("import cent, importlib.metadata as m; assert m.version('cent') == '{CENT_VERSION}'"),
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if installed(&python) {
        return python;
    }
    let status = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv (install python3 and python3-venv)");
    assert!(
        status.success(),
        "python3 -m venv {} failed",
        venv.display()
    );
    let status = std::process::Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--timeout",
            "60",
            &format!("cent=={CENT_VERSION}"),
        ])
        .status()
        .expect("pip install cent");
    assert!(status.success(), "pip install cent=={CENT_VERSION} failed");
    assert!(
        installed(&python),
        "cent {CENT_VERSION} is not importable after pip install"
    );
    python
}

/// The `cent.js` release the Node test pins.
const CENT_JS_VERSION: &str = "6.1.0";

/// A folder under the target directory with `cent.js` installed from npm, made once.
fn cent_js_dir() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let dir = target.join("centrifugo-node");
    let manifest = dir.join("node_modules/cent.js/package.json");
    let installed = || {
        std::fs::read_to_string(&manifest)
            .is_ok_and(|m| m.contains(&format!("\"version\": \"{CENT_JS_VERSION}\"")))
    };
    if installed() {
        return dir;
    }
    std::fs::create_dir_all(&dir).expect("create the cent.js folder");
    let status = std::process::Command::new("npm")
        .args([
            "install",
            "--silent",
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--prefix",
        ])
        .arg(&dir)
        .arg(format!("cent.js@{CENT_JS_VERSION}"))
        .status()
        .expect("npm install cent.js (install Node.js 20+ and npm)");
    assert!(
        status.success(),
        "npm install cent.js@{CENT_JS_VERSION} failed"
    );
    assert!(
        installed(),
        "cent.js {CENT_JS_VERSION} is not in {}",
        dir.display()
    );
    dir
}

/// A connection as `user`, subscribed to `channels`.
async fn user(node: &Node, user: &str, channels: &[&str]) -> Client {
    let mut c = node.client().await;
    let subs: serde_json::Map<String, Value> = channels
        .iter()
        .map(|ch| (ch.to_string(), json!({})))
        .collect();
    let t = token(json!({"sub": user}));
    let r = c.call("connect", json!({"token": t, "subs": subs})).await;
    assert!(r["connect"]["client"].is_string(), "connect failed: {r}");
    c
}

/// The next `pub` or `subscribe` push, skipping presence pushes.
async fn next_push(c: &mut Client) -> Value {
    loop {
        let m = c.next().await;
        if m.get("pub").is_some() || m.get("subscribe").is_some() {
            return m;
        }
        assert!(
            m.get("join").is_some() || m.get("leave").is_some(),
            "unexpected {m}"
        );
    }
}

#[tokio::test]
async fn centrifugo_python_sdk_works_against_herald() {
    let python = tokio::task::spawn_blocking(venv_python)
        .await
        .expect("venv");
    let node = Node::dev().await;
    let mut alice = user(&node, "alice", &["cent_room", "cent_b1", "cent_b2"]).await;
    let mut bob = user(&node, "bob", &["cent_room"]).await;

    let script = fixture("centrifugo_cent.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", node.addr))
        .arg(API_KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cent script did not finish within 60 s")
        .expect("run the cent script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the cent script failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the script's output is not JSON ({e}): {stdout}"));

    // What the SDK was answered.
    assert_eq!(out["publish"]["offset"], 1, "{out}");
    assert_eq!(
        out["publish_again"], out["publish"],
        "idempotency key: {out}"
    );
    assert_eq!(out["publish_b64"]["offset"], 2, "{out}");
    assert_eq!(
        out["broadcast"],
        json!([{"offset": 1}, {"offset": 1}, {"error": 102}]),
        "{out}"
    );
    assert_eq!(out["history"]["data"], json!([{"n": 1}, {"n": 2}]), "{out}");
    assert_eq!(out["history"]["offsets"], json!([1, 2]), "{out}");
    assert_eq!(out["history"]["epoch"], out["publish"]["epoch"], "{out}");
    assert_eq!(
        out["history_position"],
        json!({"count": 0, "offset": 2}),
        "{out}"
    );
    assert_eq!(out["history_reverse"], json!([2]), "{out}");
    assert_eq!(out["presence"], json!(["alice", "bob"]), "{out}");
    assert_eq!(
        out["presence_stats"],
        json!({"num_clients": 2, "num_users": 2}),
        "{out}"
    );
    assert_eq!(
        out["channels"],
        json!({"cent_room": 2, "cent_b1": 1, "cent_b2": 1}),
        "{out}"
    );
    let name = out["info"][0]["name"].as_str().unwrap_or_default();
    assert!(name.starts_with("herald-"), "{out}");
    assert_eq!(out["info"][0]["num_clients"], 2, "{out}");
    assert_eq!(
        out["batch"],
        json!({"publish_offset": 3, "num_clients": 2}),
        "{out}"
    );
    assert_eq!(out["errors"]["tags"]["code"], 107, "{out}");
    assert_eq!(out["errors"]["unknown_namespace"]["code"], 102, "{out}");
    assert_eq!(
        out["errors"]["wrong_key"],
        json!({"unauthorized": true}),
        "{out}"
    );
    assert_eq!(out["errors"]["unrecoverable"]["code"], 112, "{out}");

    // What the subscribers received: every publication once, in order.
    let mut room = Vec::new();
    let mut other = Vec::new();
    let mut subscribed = Vec::new();
    while room.len() < 3 || other.len() < 2 || subscribed.is_empty() {
        let m = next_push(&mut alice).await;
        if let Some(s) = m.get("subscribe") {
            subscribed.push(s["channel"].clone());
            continue;
        }
        let p = &m["pub"];
        if p["channel"] == "cent_room" {
            room.push(p["data"].clone());
        } else {
            other.push((p["channel"].clone(), p["data"].clone()));
        }
    }
    assert_eq!(subscribed, [json!("cent_server_side")]);
    assert_eq!(room, [json!({"n": 1}), json!({"n": 2}), json!({"n": 3})]);
    other.sort_by_key(|(c, _)| c.to_string());
    assert_eq!(
        other,
        [
            (json!("cent_b1"), json!({"b": 1})),
            (json!("cent_b2"), json!({"b": 1})),
        ]
    );
    // Bob got the room's publications, then the SDK's disconnect with its code.
    for n in 1..=3 {
        assert_eq!(next_push(&mut bob).await["pub"]["data"], json!({"n": n}));
    }
    let closed = bob.closed().await;
    assert_eq!(closed.code, Some(4510), "{closed:?}");
}

/// Centrifugo's Node server SDK, `cent.js` (npm), with its base URL at Herald's `/api`: the
/// requests carry `X-API-Key`, so Herald answers them in Centrifugo's shape.
#[tokio::test]
async fn centrifugo_node_sdk_works_against_herald_on_the_api_path() {
    let dir = tokio::task::spawn_blocking(cent_js_dir)
        .await
        .expect("cent.js");
    let node = Node::dev().await;
    let mut carol = user(&node, "carol", &["js_room", "js_other"]).await;
    let run = tokio::process::Command::new("node")
        .arg(fixture("centrifugo_centjs.js"))
        .arg(format!("http://{}", node.addr))
        .arg(API_KEY)
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cent.js script did not finish within 60 s")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the cent.js script failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the script's output is not JSON ({e}): {stdout}"));
    assert_eq!(out["publish"]["offset"], 1, "{out}");
    assert_eq!(
        out["broadcast"]["responses"][0]["result"]["offset"], 2,
        "{out}"
    );
    assert_eq!(out["history"]["data"], json!([{"j": 1}, {"j": 2}]), "{out}");
    assert_eq!(out["presence"], json!(["carol"]), "{out}");
    assert_eq!(
        out["presence_stats"],
        json!({"num_clients": 1, "num_users": 1}),
        "{out}"
    );
    assert_eq!(
        out["channels"],
        json!({"js_room": 1, "js_other": 1}),
        "{out}"
    );
    assert_eq!(out["info_nodes"], 1, "{out}");
    // cent.js raises CentException on a reply with "error" (the codes are checked in
    // tests/centrifugo_api.rs; its exception does not keep them).
    assert_eq!(
        out["history_removed"], 0,
        "history_remove left publications: {out}"
    );
    for e in ["tags", "wrong_key"] {
        assert_eq!(
            out["errors"][e],
            json!({"thrown": "CentException"}),
            "{out}"
        );
    }

    let mut got = Vec::new();
    while got.len() < 3 {
        let m = next_push(&mut carol).await;
        got.push((m["pub"]["channel"].clone(), m["pub"]["data"].clone()));
    }
    got.sort_by_key(|(c, d)| (c.to_string(), d.to_string()));
    assert_eq!(
        got,
        [
            (json!("js_other"), json!({"j": 2})),
            (json!("js_room"), json!({"j": 1})),
            (json!("js_room"), json!({"j": 2})),
        ]
    );
    let closed = carol.closed().await;
    assert_eq!(closed.code, Some(4502), "{closed:?}");
}
