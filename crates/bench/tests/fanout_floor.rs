//! herald-fanout-floor speaks enough of the protocol for `broadcast`: every publication reaches
//! every subscriber, in order, with the offsets the publish API answered.

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
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald-bench"))
        .args(["broadcast", "-n", "20", "-c", "2", "-r", "40", "-d", "1"])
        .args(["--drain", "1", "--workers", "2"])
        .arg("--ws")
        .arg(format!("ws://127.0.0.1:{port}/ws"))
        .arg("--api")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--server-cmd")
        .arg(format!("{floor} --port {port} --writers 2"))
        .arg("--json")
        .arg(&json)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
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
