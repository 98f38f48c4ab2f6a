//! The real `herald-bench` binary (coordinator + worker processes) against a small fake Herald with
//! a WebSocket endpoint and an HTTP publish API: the whole pipeline end to end, in about a second;
//! and against herald-fanout-floor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_websockets::{Message, ServerBuilder};

#[derive(Default)]
struct Hub {
    offsets: HashMap<String, u64>,
}

type Shared = Arc<(Mutex<Hub>, broadcast::Sender<(String, String)>)>;

async fn fake_herald() -> (String, String) {
    let hub: Shared = Arc::new((Mutex::new(Hub::default()), broadcast::channel(4096).0));
    let ws = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let urls = (
        format!("ws://{}/ws", ws.local_addr().unwrap()),
        format!("http://{}", api.local_addr().unwrap()),
    );
    let h = hub.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = ws.accept().await.unwrap();
            let hub = h.clone();
            tokio::spawn(async move {
                let Ok((_, mut ws)) = ServerBuilder::new().accept(s).await else {
                    return;
                };
                let Some(Ok(first)) = ws.next().await else {
                    return;
                };
                let cmd: serde_json::Value =
                    serde_json::from_str(first.as_text().unwrap()).unwrap();
                let ch = cmd["connect"]["subs"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .next()
                    .unwrap()
                    .clone();
                let (reply, mut rx) = {
                    let g = hub.0.lock().unwrap();
                    let off = g.offsets.get(&ch).copied().unwrap_or(0);
                    let sub = serde_json::json!({"epoch":"E","offset":off,"recoverable":true});
                    let r = serde_json::json!({"id":1,"connect":{"client":"c","subs":{ch.clone():sub}}});
                    (r.to_string(), hub.1.subscribe())
                };
                if ws.send(Message::text(reply)).await.is_err() {
                    return;
                }
                loop {
                    tokio::select! {
                        m = ws.next() => if !matches!(m, Some(Ok(_))) { return },
                        p = rx.recv() => match p {
                            Ok((c, line)) if c == ch => if ws.send(Message::text(line)).await.is_err() { return },
                            Ok(_) => {}
                            Err(_) => return,
                        },
                    }
                }
            });
        }
    });
    tokio::spawn(async move {
        loop {
            let (s, _) = api.accept().await.unwrap();
            let hub = hub.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let mut len = 0;
                    loop {
                        let mut h = String::new();
                        r.read_line(&mut h).await.unwrap();
                        if h.trim().is_empty() {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).await.unwrap();
                    let out = match path.as_str() {
                        "/api/publish" => {
                            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            let ch = v["channel"].as_str().unwrap().to_string();
                            let mut g = hub.0.lock().unwrap();
                            let o = g.offsets.entry(ch.clone()).or_default();
                            *o += 1;
                            let line = serde_json::json!({"pub":{"channel":ch,"offset":*o,"data":v["data"]}}).to_string();
                            let _ = hub.1.send((ch, line));
                            serde_json::json!({"epoch":"E","offset":*o}).to_string()
                        }
                        "/metrics" => {
                            "# TYPE herald_connections gauge\nherald_connections 1\n".to_string()
                        }
                        _ => "{}".to_string(),
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{out}",
                        out.len()
                    );
                    if r.get_mut().write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    urls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_end_to_end_with_two_worker_processes() {
    let (ws, api) = fake_herald().await;
    let dir = std::env::temp_dir().join(format!("herald-bench-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, html) = (dir.join("r.json"), dir.join("r.html"));
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald-bench"));
    cmd.args([
        "broadcast",
        "--ws",
        &ws,
        "--api",
        &api,
        "-n",
        "20",
        "-c",
        "2",
        "-r",
        "40",
        "-d",
        "1",
    ])
    .args([
        "--drain",
        "1",
        "--workers",
        "2",
        "--server-pid",
        &std::process::id().to_string(),
    ])
    .arg("--json")
    .arg(&json)
    .arg("--report")
    .arg(&html);
    let out = run(cmd).await;
    let (stdout, v) = finished(&out, &json);
    let run = &v["runs"][0];
    assert_eq!(run["workers"], 2);
    assert_eq!(run["connected"], 20);
    // 40 publications round-robin over 2 channels, 10 subscribers each: 20 × 20 owed.
    assert_eq!(run["delivery"]["expected"], 400, "{stdout}");
    assert_eq!(run["delivery"]["delivered"], 400, "{stdout}");
    assert_eq!(run["delivery"]["counts"]["duplicates"], 0);
    assert_eq!(run["raw_workers"].as_array().unwrap().len(), 2);
    let lat = herald_bench::hist::decode(run["latency_hist"].as_str().unwrap()).unwrap();
    assert_eq!(lat.len(), 400);
    assert!(stdout.contains("delivered"), "{stdout}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("polyline"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// How long one `herald-bench` run of these tests may take: a run is about 1 s of publishing
/// plus 1 s of drain, so only a stuck one gets near this.
const RUN_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `herald-bench` to the end, killing it (and failing the test) after [`RUN_WAIT`].
async fn run(mut cmd: tokio::process::Command) -> std::process::Output {
    let out = cmd.kill_on_drop(true).output();
    tokio::time::timeout(RUN_WAIT, out)
        .await
        .unwrap_or_else(|_| panic!("herald-bench did not finish within {RUN_WAIT:?}"))
        .expect("run herald-bench")
}

/// A finished run's stdout and `--json` result; fails the test if the run failed.
fn finished(out: &std::process::Output, json: &std::path::Path) -> (String, serde_json::Value) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    (stdout, v)
}

/// herald-fanout-floor speaks enough of the protocol for `broadcast`: every publication reaches
/// every subscriber, in order, with the offsets the publish API answered.
#[tokio::test(flavor = "current_thread")]
async fn broadcast_against_the_floor_delivers_everything() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("herald-floor-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let floor = env!("CARGO_BIN_EXE_herald-fanout-floor");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald-bench"));
    cmd.args(["broadcast", "-n", "20", "-c", "2", "-r", "40", "-d", "1"])
        .args(["--drain", "1", "--workers", "2"])
        .arg("--ws")
        .arg(format!("ws://127.0.0.1:{port}/ws"))
        .arg("--api")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--server-cmd")
        .arg(format!("{floor} --port {port} --writers 2"))
        .arg("--json")
        .arg(&json);
    let out = run(cmd).await;
    let (stdout, v) = finished(&out, &json);
    let run = &v["runs"][0];
    assert_eq!(run["connected"], 20, "{stdout}");
    // 40 publications round-robin over 2 channels, 10 subscribers each: 20 × 20 owed.
    assert_eq!(run["delivery"]["expected"], 400, "{stdout}");
    assert_eq!(run["delivery"]["delivered"], 400, "{stdout}");
    for count in ["duplicates", "gap_events", "out_of_order"] {
        assert_eq!(run["delivery"]["counts"][count], 0, "{count}: {stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
