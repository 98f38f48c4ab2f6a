//! `herald-bench`: run a scenario (`herald-bench broadcast -n 10000 …`), or, re-invoked by the
//! coordinator, be one of its workers (`herald-bench worker`, parameters on stdin).

use std::io::Write as _;

use anyhow::{Context, Result};
use clap::Parser;
use herald_bench::coordinator::{self, Servers, WorkerInit};
use herald_bench::params::{Params, Scenario, Transport};
use herald_bench::{report, worker};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// Load generator for Herald. Every scenario follows the rules of docs/benchmarking.md;
/// measured results are in docs/benchmarks.md.
#[derive(Debug, Parser)]
#[command(name = "herald-bench", version)]
struct Cli {
    /// Scenario to run.
    #[arg(value_enum)]
    scenario: Scenario,
    #[command(flatten)]
    params: Params,
    /// Write parameters, merged and raw results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Write a self-contained report here (`.html`, or `.svg` for the charts alone); repeatable.
    #[arg(long)]
    report: Vec<String>,
    /// Run twice, with W and 2W worker processes, and show whether the figures move
    /// (docs/benchmarking.md rule 2).
    #[arg(long)]
    self_check: bool,
    /// Start the server under test with this command line (repeat for several nodes; in `--api`
    /// order). It is started fresh for every run and stopped afterwards; its pid is sampled.
    #[arg(long = "server-cmd")]
    server_cmds: Vec<String>,
    /// Pid(s) of an already running server to sample for RSS and CPU.
    #[arg(long = "server-pid")]
    server_pids: Vec<u32>,
    /// Directory for the started servers' logs (default: discarded).
    #[arg(long)]
    server_log: Option<String>,
}

fn main() -> Result<()> {
    // Descriptors: use the whole hard limit (20,000 here) in every process.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if std::env::args().nth(1).as_deref() == Some("worker") {
        return rt.block_on(worker_main());
    }
    let cli = Cli::parse();
    rt.block_on(coordinate(cli))
}

async fn coordinate(cli: Cli) -> Result<()> {
    if let Some(ca) = &cli.params.tls_ca {
        herald_bench::tls::trust(ca, cli.params.tls_resume)?;
    }
    if cli.params.transport == Transport::Sse {
        anyhow::ensure!(
            matches!(cli.scenario, Scenario::Idle | Scenario::Broadcast) && !cli.params.pusher,
            "--transport sse: idle and broadcast only, without --pusher"
        );
    }
    if cli.params.centrifugo {
        anyhow::ensure!(
            matches!(
                cli.scenario,
                Scenario::Idle | Scenario::Broadcast | Scenario::Jitter | Scenario::Storm
            ) && cli.params.transport == Transport::Ws,
            "--centrifugo: idle, broadcast, jitter and storm over WebSocket only"
        );
    }
    for (flag, json) in [
        ("--tags", &cli.params.tags),
        ("--tags-filter", &cli.params.tags_filter),
    ] {
        if let Some(json) = json {
            let v: serde_json::Value =
                serde_json::from_str(json).map_err(|e| anyhow::anyhow!("{flag}: not JSON: {e}"))?;
            anyhow::ensure!(v.is_object(), "{flag}: a JSON object");
        }
    }
    if cli.params.tags_filter.is_some() {
        anyhow::ensure!(
            cli.params.transport == Transport::Ws,
            "--tags-filter: WebSocket only"
        );
    }
    if cli.params.socketio {
        anyhow::ensure!(
            matches!(cli.scenario, Scenario::Idle | Scenario::Broadcast)
                && cli.params.transport == Transport::Ws,
            "--socketio: idle and broadcast over WebSocket only (Socket.IO cannot recover)"
        );
    }
    if cli.params.no_history {
        anyhow::ensure!(
            matches!(cli.scenario, Scenario::Idle | Scenario::Broadcast),
            "--no-history: idle and broadcast only (a server without history cannot recover)"
        );
    }
    cli.params.plain_pusher().map_err(anyhow::Error::msg)?;
    if cli.params.pusher_app.is_some() {
        anyhow::ensure!(
            matches!(cli.scenario, Scenario::Idle | Scenario::Broadcast)
                && cli.params.transport == Transport::Ws,
            "--pusher-app: idle and broadcast over WebSocket only (a plain Pusher server cannot recover)"
        );
    }
    let mut runs = Vec::new();
    let base_workers = cli.params.worker_count();
    let plan: Vec<usize> = if cli.self_check {
        vec![base_workers, base_workers * 2]
    } else {
        vec![base_workers]
    };
    for w in plan {
        let mut p = cli.params.clone();
        p.workers = w;
        let mut servers = Servers::start(
            &cli.server_cmds,
            &cli.server_pids,
            &p,
            cli.server_log.as_deref(),
        )
        .await?;
        let r = coordinator::run_once(p, cli.scenario, &mut servers).await;
        servers.stop().await;
        let r = r?;
        print!("{}", report::table(&r));
        runs.push(r);
    }
    if runs.len() > 1 {
        print!("{}", report::self_check_table(&runs));
    }
    if let Some(path) = &cli.json {
        let doc = serde_json::json!({
            "tool": "herald-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "scenario": cli.scenario.name(),
            "self_check": cli.self_check,
            "server_cmds": cli.server_cmds,
            "runs": runs,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {path}"))?;
    }
    for path in &cli.report {
        let body = if path.ends_with(".svg") {
            report::svg(&runs)
        } else {
            report::html(&runs)
        };
        std::fs::write(path, body).with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// Worker process: first stdin line is the [`WorkerInit`], then commands; events go to stdout.
async fn worker_main() -> Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let init: WorkerInit =
        serde_json::from_str(&lines.next_line().await?.context("no init line on stdin")?)?;
    if let Some(ca) = &init.params.tls_ca {
        herald_bench::tls::trust(ca, init.params.tls_resume)?;
    }
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            match serde_json::from_str::<worker::Command>(&l) {
                Ok(c) => {
                    if cmd_tx.send(c).is_err() {
                        break;
                    }
                }
                Err(e) => eprintln!("worker: bad command {l:?}: {e}"),
            }
        }
        // Coordinator gone: the channel closes and the worker finishes on its own.
    });
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(async move {
        while let Some(ev) = ev_rx.recv().await {
            let done = matches!(ev, worker::Event::Result(_));
            {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", serde_json::to_string(&ev).unwrap_or_default());
                let _ = out.flush();
            }
            if done {
                break;
            }
        }
    });
    worker::run(init.params, init.scenario, init.shard, cmd_rx, ev_tx).await?;
    let _ = writer.await;
    // The stdin reader sits in a blocking read that cannot be cancelled; leave without waiting.
    std::process::exit(0)
}
