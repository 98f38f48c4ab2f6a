//! `herald-presence-storm`: a join storm into one presence channel (docs/benchmarks.md,
//! "Presence join storm").
//!
//! N members connect, spread round-robin over the `--ws` nodes, each subscribing to one channel
//! of a namespace with `join_leave_counts` (docs/config.md), and read the `presence_count` pushes
//! until their count is N. Reported: the storm (last member's `connect` answered), the time until
//! every member's count was right, `presence_count` pushes per member until then, and, with
//! `--redis-url`, the broker's `used_memory` before and after.
//!
//! A process may hold 20,000 descriptors, so the members are split over `--shards` child
//! processes (this same binary with `--shard`); every member stays connected until all shards
//! are done (a member leaving early would change everyone's count), and one clock (the parent's
//! start time, handed to the children) measures all of them.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use herald_bench::worker::now_ns;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::{watch, Semaphore};
use tokio_websockets::{ClientBuilder, Message};

#[derive(Debug, Clone, Parser)]
#[command(name = "herald-presence-storm", version)]
struct Cli {
    /// The nodes' WebSocket URLs; members go round-robin.
    #[arg(long = "ws", required = true)]
    ws: Vec<String>,
    /// Members in all.
    #[arg(short, default_value_t = 1000)]
    n: usize,
    /// The presence channel (its namespace needs `join_leave_counts`; members connect
    /// anonymously, so it needs `subscribe = "anonymous"` too).
    #[arg(long, default_value = "crowd:room")]
    channel: String,
    /// Child processes the members are split over (each holds n / shards connections).
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Connection handshakes in flight at once, over all shards.
    #[arg(long, default_value_t = 200)]
    concurrency: usize,
    /// Longest wait, seconds, for any one member's count to be right.
    #[arg(long, default_value_t = 600)]
    limit_s: u64,
    /// The broker's Redis, for `used_memory` before and after (read with `redis-cli`).
    #[arg(long)]
    redis_url: Option<String>,
    /// Internal: run as shard I of `--shards`.
    #[arg(long, hide = true)]
    shard: Option<usize>,
    /// Internal: the parent's start, ns since the UNIX epoch.
    #[arg(long, hide = true)]
    t0: Option<u64>,
}

/// What one shard reports: per member, seconds from the start.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ShardResult {
    connected_s: Vec<f64>,
    right_s: Vec<f64>,
    pushes: Vec<u64>,
    failed: Vec<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.shard {
        Some(i) => rt.block_on(shard(cli.clone(), i)),
        None => rt.block_on(parent(cli)),
    }
}

async fn parent(cli: Cli) -> Result<()> {
    anyhow::ensure!(
        cli.shards > 0 && cli.n > 0,
        "-n and --shards must be positive"
    );
    let memory_before = used_memory(cli.redis_url.as_deref()).await?;
    let t0 = now_ns();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for i in 0..cli.shards {
        let mut cmd = tokio::process::Command::new(&exe);
        for ws in &cli.ws {
            cmd.args(["--ws", ws]);
        }
        cmd.args(["-n", &cli.n.to_string(), "--channel", &cli.channel])
            .args(["--shards", &cli.shards.to_string()])
            .args(["--concurrency", &cli.concurrency.to_string()])
            .args(["--limit-s", &cli.limit_s.to_string()])
            .args(["--shard", &i.to_string(), "--t0", &t0.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        children.push(cmd.spawn().context("start a shard")?);
    }
    let mut all = ShardResult::default();
    // Each shard prints its one line when its members are right (or gave up); bounded by the
    // members' own limit plus the connect time.
    let wait = Duration::from_secs(cli.limit_s + 120);
    for (i, c) in children.iter_mut().enumerate() {
        let out = c.stdout.take().context("shard stdout")?;
        let mut line = String::new();
        tokio::time::timeout(wait, BufReader::new(out).read_line(&mut line))
            .await
            .with_context(|| format!("shard {i} did not report within {wait:?}"))??;
        let r: ShardResult =
            serde_json::from_str(&line).with_context(|| format!("shard {i} reported {line:?}"))?;
        all.connected_s.extend(r.connected_s);
        all.right_s.extend(r.right_s);
        all.pushes.extend(r.pushes);
        all.failed.extend(r.failed);
    }
    let memory_after = used_memory(cli.redis_url.as_deref()).await?;
    // Closing their stdin ends the shards (and every member's connection) together.
    for c in children.iter_mut() {
        drop(c.stdin.take());
    }
    for c in children.iter_mut() {
        let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
    }
    all.pushes.sort_unstable();
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let pushes = &all.pushes;
    let pct = |q: f64| {
        pushes
            .get(((pushes.len() as f64 - 1.0) * q) as usize)
            .copied()
    };
    let per_member = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) => Some((a as f64 - b as f64) / cli.n as f64),
        _ => None,
    };
    println!(
        "{}",
        json!({
            "members": cli.n,
            "nodes": cli.ws.len(),
            "shards": cli.shards,
            "concurrency": cli.concurrency,
            "failed": all.failed.len(),
            "failures": all.failed.iter().take(5).collect::<Vec<_>>(),
            "storm_s": max(&all.connected_s),
            "all_counts_right_s": max(&all.right_s),
            "count_pushes_per_member": {
                "mean": pushes.iter().sum::<u64>() as f64 / pushes.len().max(1) as f64,
                "p50": pct(0.5),
                "p99": pct(0.99),
                "max": pushes.last(),
            },
            "redis_used_memory_before": memory_before,
            "redis_used_memory_after": memory_after,
            "redis_bytes_per_member": per_member(memory_before, memory_after),
        })
    );
    if !all.failed.is_empty() {
        bail!("{} of {} members failed", all.failed.len(), cli.n);
    }
    Ok(())
}

/// Redis `used_memory` (bytes), when a URL is given.
async fn used_memory(url: Option<&str>) -> Result<Option<u64>> {
    let Some(url) = url else { return Ok(None) };
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new("redis-cli")
            .args(["-u", url, "INFO", "memory"])
            .output(),
    )
    .await
    .context("redis-cli INFO memory took over 10 s")??;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no used_memory in redis-cli's answer: {text:.200}"))?;
    Ok(Some(v))
}

/// One shard: its members (every `shards`-th), then the report, then hold until stdin closes.
async fn shard(cli: Cli, index: usize) -> Result<()> {
    let t0 = cli.t0.context("--shard needs --t0")?;
    let since_t0 = move || now_ns().saturating_sub(t0) as f64 / 1e9;
    let gate = Arc::new(Semaphore::new((cli.concurrency / cli.shards).max(1)));
    let (stop_tx, stop) = watch::channel(false);
    let limit = Duration::from_secs(cli.limit_s);
    let mut tasks = Vec::new();
    for m in (index..cli.n).step_by(cli.shards) {
        let url = cli.ws[m % cli.ws.len()].clone();
        let (gate, channel, mut stop) = (gate.clone(), cli.channel.clone(), stop.clone());
        let (want, right_tx) = (cli.n as u64, tokio::sync::oneshot::channel());
        tasks.push((
            tokio::spawn(async move {
                // A handshake slot, held until the `connect` reply.
                let mut permit = Some(gate.acquire_owned().await.expect("gate"));
                let (mut ws, _) = tokio::time::timeout(
                    Duration::from_secs(30),
                    ClientBuilder::new()
                        .uri(&url)
                        .map_err(|e| format!("bad url: {e}"))?
                        .connect(),
                )
                .await
                .map_err(|_| "websocket handshake over 30 s".to_string())?
                .map_err(|e| format!("websocket handshake: {e}"))?;
                let connect = json!({"id": 1, "connect": {"subs": {&channel: {}}}});
                ws.send(Message::text(connect.to_string()))
                    .await
                    .map_err(|e| format!("send connect: {e}"))?;
                let mut connected = None;
                let mut pushes = 0u64;
                let deadline = tokio::time::Instant::now() + limit;
                let mut right_tx = Some(right_tx.0);
                loop {
                    // Until the count is right, bounded by the limit; then only until stopped.
                    let until = match right_tx.is_some() {
                        true => deadline,
                        false => tokio::time::Instant::now() + Duration::from_secs(3600),
                    };
                    let msg = tokio::select! {
                        m = tokio::time::timeout_at(until, ws.next()) => m.map_err(|_| {
                            format!("count not right within {limit:?} ({pushes} pushes)")
                        })?,
                        _ = stop.changed() => return Ok::<_, String>(()),
                    };
                    let msg = match msg {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => return Err(format!("connection: {e}")),
                        None => return Err("closed by the node".into()),
                    };
                    if msg.is_close() {
                        let code = msg.as_close().map(|(c, _)| u16::from(c)).unwrap_or(0);
                        return Err(format!("closed by the node with {code}"));
                    }
                    let Some(text) = msg.as_text() else { continue };
                    for line in text.split('\n').filter(|l| !l.is_empty()) {
                        let v: Value =
                            serde_json::from_str(line).map_err(|e| format!("bad frame: {e}"))?;
                        if v.as_object().is_some_and(|o| o.is_empty()) {
                            let _ = ws.send(Message::text("{}")).await;
                        } else if v["id"] == 1 {
                            if let Some(e) = v
                                .get("error")
                                .or(v["connect"]["subs"][&channel].get("error"))
                            {
                                return Err(format!("connect refused: {e}"));
                            }
                            connected = Some(since_t0());
                            drop(permit.take());
                        } else if let Some(c) = v.get("presence_count") {
                            if right_tx.is_some() {
                                pushes += 1;
                                if c["num_clients"].as_u64() == Some(want) {
                                    let at = since_t0();
                                    if let Some(tx) = right_tx.take() {
                                        let _ = tx.send((connected.unwrap_or(at), at, pushes));
                                    }
                                }
                            }
                        }
                    }
                }
            }),
            right_tx.1,
        ));
    }
    drop(stop);
    let mut result = ShardResult::default();
    let mut members = Vec::new();
    for (task, right) in tasks {
        match right.await {
            Ok((connected, at, pushes)) => {
                result.connected_s.push(connected);
                result.right_s.push(at);
                result.pushes.push(pushes);
            }
            Err(_) => {
                // The member ended before its count was right; its task (done) says why.
                let why = match task.await {
                    Ok(Err(why)) => why,
                    Ok(Ok(())) => "stopped".into(),
                    Err(e) => format!("member task: {e}"),
                };
                result.failed.push(why);
                continue;
            }
        }
        members.push(task);
    }
    println!("{}", serde_json::to_string(&result)?);
    // Hold every connection until the parent closes stdin.
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    let _ = stop_tx.send(true);
    for t in members {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    Ok(())
}
