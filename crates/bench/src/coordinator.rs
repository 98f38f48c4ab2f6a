//! The coordinator: starts the server(s) when asked, spawns the worker processes (each with its own
//! loopback source address), drives the scenario's phases, publishes, samples the server's and the
//! rig's CPU and memory, and merges what the workers send back (histograms added, counters summed).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write as _};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::accounting::Delivery;
use crate::hist::{self, Summary};
use crate::params::{self, Params, Scenario, Shard};
use crate::publisher::{self, PublishOutcome};
use crate::sysstat::{self, Metrics, ProcSample};
use crate::worker::{self, Counters, Event, WorkerResult};

/// What the worker process reads as its first stdin line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerInit {
    /// Scenario.
    pub scenario: Scenario,
    /// Run parameters.
    pub params: Params,
    /// This worker's share.
    pub shard: Shard,
}

/// Server processes under test: spawned by us, or given by pid.
pub struct Servers {
    /// Pids sampled for RSS and CPU.
    pub pids: Vec<u32>,
    children: Vec<Child>,
    /// The `--server-cmd`s, to start them again (`drain`).
    cmds: Vec<String>,
    log_dir: Option<String>,
    /// Processes told to stop that may still be draining; reaped in [`Servers::stop`].
    stopping: Vec<Child>,
}

impl Servers {
    /// Starts each `--server-cmd` (with `HERALD_API_KEY`) and waits for its `/health`; adds the
    /// `--server-pid`s.
    ///
    /// # Errors
    /// A command that does not start or never becomes healthy.
    pub async fn start(
        cmds: &[String],
        pids: &[u32],
        p: &Params,
        log_dir: Option<&str>,
    ) -> Result<Self> {
        let mut s = Servers {
            pids: pids.to_vec(),
            children: Vec::new(),
            cmds: cmds.to_vec(),
            log_dir: log_dir.map(str::to_owned),
            stopping: Vec::new(),
        };
        for i in 0..cmds.len() {
            let child = s.spawn(i, p, "")?;
            s.pids.push(child.id().context("server exited at once")?);
            s.children.push(child);
            crate::http::wait_healthy(api_url(p, i)?, &p.health_path, Duration::from_secs(20))
                .await?;
        }
        Ok(s)
    }

    /// Spawns `--server-cmd` number `i`; its log (with `--server-log`) is `server{i}{suffix}.log`.
    fn spawn(&self, i: usize, p: &Params, suffix: &str) -> Result<Child> {
        let cmd = &self.cmds[i];
        let mut parts = cmd.split_whitespace();
        let prog = parts.next().context("empty --server-cmd")?;
        let mut c = Command::new(prog);
        c.args(parts)
            .env("HERALD_API_KEY", &p.api_key)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        match &self.log_dir {
            Some(d) => {
                let f = std::fs::File::create(format!("{d}/server{i}{suffix}.log"))?;
                c.stdout(f.try_clone()?).stderr(f);
            }
            None => {
                c.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        c.spawn().with_context(|| format!("starting {cmd}"))
    }

    /// `drain`: sends SIGTERM to every server we started (each drains: its clients get a
    /// `disconnect` with `after_ms` and it closes its listener at once) and starts each command
    /// again on the same port, retrying while the old process still holds it. Returns the seconds
    /// until every replacement answered `/health`; from then on the replacements are sampled.
    ///
    /// # Errors
    /// No server started by us, or a replacement that never became healthy within 20 s.
    pub async fn drain_and_restart(&mut self, p: &Params) -> Result<f64> {
        anyhow::ensure!(
            !self.children.is_empty(),
            "drain needs the server started by the tool (--server-cmd)"
        );
        let t = Instant::now();
        let given = self.pids.len() - self.children.len();
        for c in &self.children {
            if let Some(pid) = c.id() {
                // tokio's Child can only SIGKILL; the drain needs SIGTERM.
                Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await
                    .context("kill -TERM")?;
            }
        }
        for i in 0..self.children.len() {
            // Until the old node has closed its listener, /health would still be its answer.
            let api = api_url(p, i)?;
            let deadline = Instant::now() + Duration::from_secs(20);
            while crate::http::get(api, &p.health_path).await.is_ok() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let fresh = loop {
                let mut c = self.spawn(i, p, "-restarted")?;
                // A replacement that exits at once lost the race for the port: try again.
                let healthy =
                    crate::http::wait_healthy(api, &p.health_path, Duration::from_secs(20));
                tokio::select! {
                    _ = c.wait() => {
                        anyhow::ensure!(Instant::now() < deadline, "the restarted server kept exiting");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    r = healthy => { r?; break c; }
                }
            };
            self.pids[given + i] = fresh.id().context("restarted server exited at once")?;
            let old = std::mem::replace(&mut self.children[i], fresh);
            self.stopping.push(old);
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Stops the servers we started (and reaps those still draining).
    pub async fn stop(mut self) {
        for c in self.children.iter_mut().chain(self.stopping.iter_mut()) {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}

/// The API URL of node `i` (the first one when fewer are given).
fn api_url(p: &Params, i: usize) -> Result<&str> {
    p.api_urls
        .get(i)
        .or(p.api_urls.first())
        .map(String::as_str)
        .context("no --api")
}

/// One server process's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerFigures {
    /// Pid.
    pub pid: u32,
    /// RSS before any client connected, bytes.
    pub rss_before: u64,
    /// RSS once every client was connected, bytes.
    pub rss_connected: u64,
    /// RSS at the end of the measured window, bytes.
    pub rss_end: u64,
    /// CPU over the measured window, % of one core.
    pub cpu_pct: f64,
    /// Of which system (kernel) time: writes, reads, polling.
    #[serde(default)]
    pub system_pct: f64,
    /// CPU over the connect phase, % of one core.
    pub connect_cpu_pct: f64,
}

/// Everything one run measured: parameters, merged results and the raw worker results.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Scenario name.
    pub scenario: String,
    /// Parameters.
    pub params: Option<Params>,
    /// Worker processes used.
    pub workers: usize,
    /// Start, ns since the UNIX epoch.
    pub t0_ns: u64,
    /// Connections asked for.
    pub connections: u64,
    /// Connections subscribed on the first attempt.
    pub connected: u64,
    /// Connection failures.
    pub failed: u64,
    /// Failure causes.
    pub errors: BTreeMap<String, u64>,
    /// Seconds from the first connection attempt to the last subscribe reply.
    pub connect_s: f64,
    /// Connections per second during the connect phase.
    pub connect_rate: f64,
    /// Time to connect and subscribe, µs.
    pub connect_latency: Summary,
    /// Server RSS growth per connected client, bytes (summed over nodes).
    pub rss_per_connection: f64,
    /// Server figures per process.
    pub servers: Vec<ServerFigures>,
    /// Measured window (hold or publish), seconds.
    pub window_s: f64,
    /// The broker's processes (`--broker-pid`): CPU over the window, % of one core, summed.
    #[serde(default)]
    pub broker_cpu_pct: Option<f64>,
    /// The whole machine's CPU over the window (other tenants' builds show up as `nice`).
    pub machine: sysstat::MachineCpu,
    /// Load generator CPU over the window, % of one core: coordinator (publisher) and workers.
    pub rig_cpu_pct: RigCpu,
    /// What the publisher did.
    pub publish: PublishOutcome,
    /// Delivery accounting.
    pub delivery: Delivery,
    /// Delivered / expected, percent.
    pub delivered_pct: f64,
    /// Unique deliveries divided by the publishing window.
    pub deliveries_per_s: f64,
    /// Median and minimum of the per-second delivery counts inside the window.
    pub deliveries_per_s_median: f64,
    /// Lowest full second inside the window.
    pub deliveries_per_s_min: f64,
    /// Live delivery latency from the scheduled send time, µs.
    pub latency: Summary,
    /// Percentile spectrum of the latency for charts: (percentile, µs).
    pub latency_spectrum: Vec<(f64, u64)>,
    /// Per publication, time until every subscriber had it (µs): distribution over publications.
    pub reach_all: Summary,
    /// Reconnect-to-recovered-reply time, µs.
    pub recovery: Summary,
    /// `storm`, `drain`: clients dropped, back, and the time until 95% / 100% were back (ms).
    pub storm: Option<StormFigures>,
    /// `drain`: seconds from SIGTERM until the restarted node(s) answered `/health`.
    #[serde(default)]
    pub restart_s: Option<f64>,
    /// Summed worker counters.
    pub counters: Counters,
    /// Unique deliveries per second since t0 (summed over workers).
    pub timeline: Vec<u64>,
    /// `/metrics` differences per node (before → after).
    pub metrics_delta: Vec<Metrics>,
    /// `/metrics` differences per node from before the run to when every client was connected
    /// (the server's own connection and subscription gauges, to bracket the client-side count).
    pub metrics_connected_delta: Vec<Metrics>,
    /// `rooms`: broker messages received per node vs. the ideal.
    pub broker: Vec<BrokerFigures>,
    /// What stopped or limited the test.
    pub stopped_by: Vec<String>,
    /// Merged latency histogram (V2+base64), for re-analysis.
    pub latency_hist: String,
    /// Raw worker results.
    pub raw_workers: Vec<WorkerResult>,
}

/// The rig's CPU over the window.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RigCpu {
    /// Coordinator (publisher, merging), % of one core.
    pub coordinator: f64,
    /// All workers together, % of one core.
    pub workers: f64,
    /// Workers' peak RSS sum, bytes.
    pub workers_rss: u64,
}

/// `storm` figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StormFigures {
    /// Clients connected when the drop came.
    pub dropped: u64,
    /// Clients back and re-subscribed.
    pub back: u64,
    /// ms until 95% were back.
    pub p95_ms: f64,
    /// ms until the last one was back.
    pub p100_ms: f64,
    /// Full distribution, µs.
    pub back_latency: Summary,
}

/// `rooms`: broker traffic of one node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BrokerFigures {
    /// Node index (order of `--api`).
    pub node: usize,
    /// Broker messages the node received during the run (its `/metrics`), if exposed.
    pub received: Option<f64>,
    /// Publications to rooms that node hosts (what a perfect router would deliver to it).
    pub ideal: u64,
}

struct WorkerProc {
    child: Child,
    stdin: ChildStdin,
    pid: u32,
}

fn sample_all(pids: &[u32]) -> Vec<ProcSample> {
    pids.iter()
        .map(|&p| sysstat::sample(p).unwrap_or_default())
        .collect()
}

/// Progress line on stderr: rewritten in place on a terminal, one line every 5 s otherwise.
struct Progress {
    tty: bool,
    last: Instant,
    connected: Vec<u64>,
    deliveries: Vec<u64>,
    prev: (Instant, u64),
}

impl Progress {
    fn new(workers: usize) -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            connected: vec![0; workers],
            deliveries: vec![0; workers],
            prev: (Instant::now(), 0),
        }
    }

    fn update(
        &mut self,
        index: usize,
        connected: u64,
        deliveries: u64,
        scenario: Scenario,
        t0: Instant,
        total: usize,
    ) {
        self.connected[index] = connected;
        self.deliveries[index] = deliveries;
        let every = if self.tty {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(5)
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let d: u64 = self.deliveries.iter().sum();
        let rate = (d - self.prev.1.min(d)) as f64 / self.prev.0.elapsed().as_secs_f64().max(1e-3);
        self.prev = (Instant::now(), d);
        let line = format!(
            "[{}] {:>6.1}s  connected {}/{}  deliveries {}  ({:.0}/s)",
            scenario.name(),
            t0.elapsed().as_secs_f64(),
            self.connected.iter().sum::<u64>(),
            total,
            d,
            rate
        );
        let mut e = std::io::stderr();
        if self.tty {
            let _ = write!(e, "\r{line}   ");
        } else {
            let _ = writeln!(e, "{line}");
        }
        let _ = e.flush();
    }

    fn done(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// Runs one scenario once with `workers` worker processes.
///
/// # Errors
/// Workers that cannot be started or that die before reporting.
pub async fn run_once(
    mut p: Params,
    scenario: Scenario,
    servers: &mut Servers,
) -> Result<RunResult> {
    for u in &p.api_urls {
        crate::http::Target::parse(u)?;
    }
    if p.payload < 48 {
        bail!("--payload must be at least 48 bytes (the data carries the send time and a sequence number)");
    }
    // A fresh suffix per run keeps every run's channels (and their history) apart.
    p.prefix = format!("{}{:x}-", p.prefix, worker::now_ns() % 0xffff_ffff);
    let nworkers = p.worker_count().min(p.connections.max(1));
    let t0_ns = worker::now_ns();
    let t0 = Instant::now();
    let mut res = RunResult {
        scenario: scenario.name().into(),
        workers: nworkers,
        t0_ns,
        connections: p.connections as u64,
        ..Default::default()
    };

    let scrape_all = |p: &Params| {
        let urls = p.api_urls.clone();
        async move {
            let mut v = Vec::new();
            for u in &urls {
                v.push(sysstat::scrape(u).await.unwrap_or_default());
            }
            v
        }
    };
    let metrics_before = scrape_all(&p).await;
    let srv_before = sample_all(&servers.pids);

    // Workers: worker i owns a contiguous slice of connection indices and source 127.0.0.(2+i).
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<Event>();
    let mut procs = Vec::new();
    let exe = std::env::current_exe()?;
    for i in 0..nworkers {
        let start = p.connections * i / nworkers;
        let end = p.connections * (i + 1) / nworkers;
        let o = p.source_base.octets();
        let source = std::net::Ipv4Addr::new(o[0], o[1], o[2], o[3].wrapping_add(i as u8));
        let init = WorkerInit {
            scenario,
            params: p.clone(),
            shard: Shard {
                index: i,
                start,
                end,
                source,
                t0_ns,
            },
        };
        let mut child = Command::new(&exe)
            .arg("worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawning a worker")?;
        let pid = child.id().unwrap_or(0);
        let mut stdin = child.stdin.take().context("worker stdin")?;
        stdin
            .write_all(format!("{}\n", serde_json::to_string(&init)?).as_bytes())
            .await?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let tx = ev_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                match serde_json::from_str::<Event>(&l) {
                    Ok(ev) => {
                        if tx.send(ev).is_err() {
                            break;
                        }
                    }
                    Err(e) => eprintln!(
                        "worker {i}: bad event line ({e}): {}",
                        l.chars().take(200).collect::<String>()
                    ),
                }
            }
        });
        procs.push(WorkerProc { child, stdin, pid });
    }
    drop(ev_tx);
    let mut progress = Progress::new(nworkers);
    let total = p.connections;

    // Phase 1: connect.
    let mut ready = 0;
    let (mut span_lo, mut span_hi) = (u64::MAX, 0u64);
    while ready < nworkers {
        match ev_rx.recv().await {
            Some(Event::Ready {
                connected,
                failed,
                errors,
                span_ns,
                ..
            }) => {
                ready += 1;
                res.connected += connected;
                res.failed += failed;
                for (k, v) in errors {
                    *res.errors.entry(k).or_default() += v;
                }
                span_lo = span_lo.min(span_ns.0);
                span_hi = span_hi.max(span_ns.1);
            }
            Some(Event::Progress {
                index,
                connected,
                deliveries,
            }) => progress.update(index, connected, deliveries, scenario, t0, total),
            Some(_) => {}
            None => bail!("a worker exited before it was ready (see its stderr above)"),
        }
    }
    if span_hi > span_lo {
        res.connect_s = (span_hi - span_lo) as f64 / 1e9;
        res.connect_rate = res.connected as f64 / res.connect_s;
    }
    let srv_connected = sample_all(&servers.pids);
    let metrics_connected = scrape_all(&p).await;
    let connect_wall = t0.elapsed().as_secs_f64();
    // Let the server settle (queues drained, allocator quiet) before the window opens.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Phase 2: the measured window.
    let worker_pids: Vec<u32> = procs.iter().map(|w| w.pid).collect();
    let w_start = Instant::now();
    let broker_a = sample_all(&p.broker_pids);
    let (srv_a, rig_a, me_a) = (
        sample_all(&servers.pids),
        sample_all(&worker_pids),
        sysstat::sample(0).unwrap_or_default(),
    );
    let machine_a = sysstat::machine();
    let mut workers_rss = 0u64;
    let publish = if scenario.publishes() {
        let chans = params::channels(&p, scenario);
        let pp = p.clone();
        let mut pub_task = tokio::spawn(async move {
            publisher::run(&pp, scenario, &chans, Duration::from_millis(100)).await
        });
        let storms = matches!(scenario, Scenario::Storm | Scenario::Drain);
        let mut storm_sent = !storms;
        let storm_at = Instant::now() + Duration::from_secs_f64((p.duration / 3.0).max(1.0));
        let mut storm_done = 0;
        let mut storm = StormFigures::default();
        let outcome = loop {
            tokio::select! {
                r = &mut pub_task => break r.context("publisher task")?,
                ev = ev_rx.recv() => match ev {
                    Some(Event::Progress { index, connected, deliveries }) => progress.update(index, connected, deliveries, scenario, t0, total),
                    Some(Event::StormDone { back, dropped, .. }) => { storm_done += 1; storm.back += back; storm.dropped += dropped; }
                    Some(_) => {}
                    None => bail!("workers exited during the run"),
                },
                _ = tokio::time::sleep_until(storm_at), if !storm_sent => {
                    storm_sent = true;
                    let cmd = match scenario {
                        Scenario::Drain => worker::Command::Drain { at_ns: worker::now_ns() },
                        _ => worker::Command::Drop { at_ns: worker::now_ns() + 200_000_000 },
                    };
                    for w in &mut procs {
                        w.stdin.write_all(format!("{}\n", serde_json::to_string(&cmd)?).as_bytes()).await?;
                    }
                    if scenario == Scenario::Drain {
                        res.restart_s = Some(servers.drain_and_restart(&p).await?);
                    }
                }
            }
        };
        // A storm may outlast the publisher: wait for every worker's StormDone.
        if storms {
            while storm_done < nworkers {
                match ev_rx.recv().await {
                    Some(Event::StormDone { back, dropped, .. }) => {
                        storm_done += 1;
                        storm.back += back;
                        storm.dropped += dropped;
                    }
                    Some(Event::Progress {
                        index,
                        connected,
                        deliveries,
                    }) => progress.update(index, connected, deliveries, scenario, t0, total),
                    Some(_) => {}
                    None => bail!("workers exited during the storm"),
                }
            }
            res.storm = Some(storm);
        }
        outcome
    } else {
        let until = Instant::now() + Duration::from_secs_f64(p.duration);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                ev = ev_rx.recv() => match ev {
                    Some(Event::Progress { index, connected, deliveries }) => progress.update(index, connected, deliveries, scenario, t0, total),
                    Some(_) => {}
                    None => bail!("workers exited during the hold"),
                },
            }
        }
        PublishOutcome {
            window_s: p.duration,
            ..Default::default()
        }
    };
    for s in sample_all(&worker_pids) {
        workers_rss += s.rss_bytes;
    }
    // The window closes when the last publication is due; stragglers are counted in the drain.
    let window = w_start.elapsed().as_secs_f64();
    let broker_b = sample_all(&p.broker_pids);
    let (srv_b, rig_b, me_b) = (
        sample_all(&servers.pids),
        sample_all(&worker_pids),
        sysstat::sample(0).unwrap_or_default(),
    );
    res.machine = sysstat::machine_cpu(&machine_a, &sysstat::machine());

    // Phase 3: finish, drain, collect.
    let finish = worker::Command::Finish {
        expect: publish.expect.clone(),
    };
    let line = format!("{}\n", serde_json::to_string(&finish)?);
    for w in &mut procs {
        w.stdin.write_all(line.as_bytes()).await?;
    }
    let mut results = Vec::new();
    while results.len() < nworkers {
        match ev_rx.recv().await {
            Some(Event::Result(r)) => results.push(*r),
            Some(Event::Progress {
                index,
                connected,
                deliveries,
            }) => progress.update(index, connected, deliveries, scenario, t0, total),
            Some(_) => {}
            None => bail!("a worker exited without a result"),
        }
    }
    progress.done();
    for w in procs {
        let WorkerProc {
            mut child, stdin, ..
        } = w;
        drop(stdin);
        let _ = child.wait().await;
    }
    let metrics_after = scrape_all(&p).await;

    // Merge: histograms added, counters summed.
    results.sort_by_key(|r| r.index);
    let latency = hist::merge_encoded(results.iter().map(|r| r.latency.as_str()))?;
    let connect = hist::merge_encoded(results.iter().map(|r| r.connect.as_str()))?;
    let recovery = hist::merge_encoded(results.iter().map(|r| r.recovery.as_str()))?;
    let storm_h = hist::merge_encoded(results.iter().map(|r| r.storm.as_str()))?;
    let mut reach = vec![0u64; 0];
    for r in &results {
        res.delivery.add(&r.delivery);
        add_counters(&mut res.counters, &r.counters);
        if res.timeline.len() < r.timeline.len() {
            res.timeline.resize(r.timeline.len(), 0);
        }
        for (i, v) in r.timeline.iter().enumerate() {
            res.timeline[i] += v;
        }
        if reach.len() < r.per_seq_max_us.len() {
            reach.resize(r.per_seq_max_us.len(), 0);
        }
        for (i, v) in r.per_seq_max_us.iter().enumerate() {
            reach[i] = reach[i].max(*v);
        }
    }
    let mut reach_h = hist::new_hist();
    for v in reach.iter().filter(|v| **v > 0) {
        reach_h.saturating_record(*v);
    }
    res.reach_all = Summary::of(&reach_h);
    res.latency = Summary::of(&latency);
    res.latency_spectrum = hist::spectrum(&latency);
    res.latency_hist = hist::encode(&latency);
    res.connect_latency = Summary::of(&connect);
    res.recovery = Summary::of(&recovery);
    if let Some(s) = res.storm.as_mut() {
        s.back_latency = Summary::of(&storm_h);
        if !storm_h.is_empty() {
            s.p95_ms = storm_h.value_at_quantile(0.95) as f64 / 1000.0;
            s.p100_ms = storm_h.max() as f64 / 1000.0;
        }
    }
    res.delivered_pct = res.delivery.delivered_pct();
    res.window_s = window;
    if scenario.publishes() && publish.window_s > 0.0 {
        res.deliveries_per_s = res.delivery.delivered as f64 / publish.window_s;
        // Full seconds strictly inside the publishing window.
        let first = ((w_start - t0).as_secs_f64() + 0.1).ceil() as usize + 1;
        let last = ((w_start - t0).as_secs_f64() + 0.1 + publish.window_s).floor() as usize;
        let mut inner: Vec<u64> = res
            .timeline
            .iter()
            .copied()
            .skip(first)
            .take(last.saturating_sub(first))
            .collect();
        if !inner.is_empty() {
            inner.sort_unstable();
            res.deliveries_per_s_median = inner[inner.len() / 2] as f64;
            res.deliveries_per_s_min = inner[0] as f64;
        }
    }
    for (i, pid) in servers.pids.iter().enumerate() {
        let g = |v: &Vec<ProcSample>| v.get(i).copied().unwrap_or_default();
        res.servers.push(ServerFigures {
            pid: *pid,
            rss_before: g(&srv_before).rss_bytes,
            rss_connected: g(&srv_connected).rss_bytes,
            rss_end: g(&srv_b).rss_bytes,
            cpu_pct: sysstat::cpu_pct(&g(&srv_a), &g(&srv_b), window),
            system_pct: sysstat::system_pct(&g(&srv_a), &g(&srv_b), window),
            connect_cpu_pct: sysstat::cpu_pct(&g(&srv_before), &g(&srv_connected), connect_wall),
        });
    }
    if res.connected > 0 && !res.servers.is_empty() {
        let grow: f64 = res
            .servers
            .iter()
            .map(|s| s.rss_connected as f64 - s.rss_before as f64)
            .sum();
        res.rss_per_connection = grow / res.connected as f64;
    }
    if !p.broker_pids.is_empty() {
        res.broker_cpu_pct = Some(
            broker_a
                .iter()
                .zip(&broker_b)
                .map(|(a, b)| sysstat::cpu_pct(a, b, window))
                .sum(),
        );
    }
    res.rig_cpu_pct = RigCpu {
        coordinator: sysstat::cpu_pct(&me_a, &me_b, window),
        workers: rig_a
            .iter()
            .zip(&rig_b)
            .map(|(a, b)| sysstat::cpu_pct(a, b, window))
            .sum(),
        workers_rss,
    };
    res.metrics_delta = metrics_before
        .iter()
        .zip(&metrics_after)
        .map(|(a, b)| sysstat::metrics_delta(a, b))
        .collect();
    res.metrics_connected_delta = metrics_before
        .iter()
        .zip(&metrics_connected)
        .map(|(a, b)| sysstat::metrics_delta(a, b))
        .collect();
    if scenario == Scenario::Rooms {
        res.broker = broker_figures(&p, &publish, &metrics_before, &metrics_after);
    }
    res.publish = publish;
    res.stopped_by = stopped_by(&p, scenario, &res);
    res.params = Some(p);
    res.raw_workers = results;
    Ok(res)
}

fn add_counters(a: &mut Counters, b: &Counters) {
    a.reconnects += b.reconnects;
    a.recovered += b.recovered;
    a.not_recovered += b.not_recovered;
    a.epoch_changes += b.epoch_changes;
    a.client_drops += b.client_drops;
    a.server_closes += b.server_closes;
    a.pings += b.pings;
    a.disconnect_pushes += b.disconnect_pushes;
    a.unsub_pushes += b.unsub_pushes;
    a.joins += b.joins;
    a.leaves += b.leaves;
    a.error_replies += b.error_replies;
    a.parse_errors += b.parse_errors;
    a.compressed += b.compressed;
    a.retried_attempts += b.retried_attempts;
    a.deliveries += b.deliveries;
}

fn broker_figures(
    p: &Params,
    publish: &PublishOutcome,
    before: &[Metrics],
    after: &[Metrics],
) -> Vec<BrokerFigures> {
    let nodes = p.ws_urls.len().max(1);
    let mut ideal = vec![0u64; nodes];
    let rooms = params::channels(p, Scenario::Rooms);
    for (r, (name, _)) in rooms.iter().enumerate() {
        let pubs = publish.expect.get(name).map_or(0, |e| e.count);
        for n in params::room_nodes(p, r) {
            ideal[n] += pubs;
        }
    }
    (0..nodes)
        .map(|n| {
            let received = match (before.get(n), after.get(n)) {
                (Some(b), Some(a)) => match (
                    sysstat::metric_sum(a, &p.broker_metric),
                    sysstat::metric_sum(b, &p.broker_metric),
                ) {
                    (Some(x), y) => Some(x - y.unwrap_or(0.0)),
                    _ => None,
                },
                _ => None,
            };
            BrokerFigures {
                node: n,
                received,
                ideal: ideal[n],
            }
        })
        .collect()
}

/// Plain-words reasons the run ended where it did, and what limited it
/// (docs/benchmarking.md rule 6).
fn stopped_by(p: &Params, scenario: Scenario, r: &RunResult) -> Vec<String> {
    let mut v = Vec::new();
    if r.failed == 0 {
        v.push(format!(
            "target reached: all {} connections subscribed",
            r.connected
        ));
    } else {
        let mut e: Vec<_> = r.errors.iter().collect();
        e.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = e.iter().take(3).map(|(k, n)| format!("{k} ×{n}")).collect();
        v.push(format!(
            "{} of {} connections failed: {}",
            r.failed,
            r.connections,
            top.join("; ")
        ));
    }
    if scenario.publishes() {
        v.push(format!(
            "fixed schedule ran to its end: {} publications at {}/s over {:.1} s",
            r.publish.scheduled, p.rate, r.publish.window_s
        ));
        if !r.publish.errors.is_empty() {
            v.push(format!("publish errors: {:?}", r.publish.errors));
        }
        let interval_us = 1e6 / p.rate.max(1e-9);
        if r.publish.api_latency.p99 as f64 > interval_us * p.publish_connections as f64 {
            v.push(format!(
                "publisher backlog: API p99 {:.1} ms exceeds {} lanes × the {:.1} ms interval",
                r.publish.api_latency.p99 as f64 / 1000.0,
                p.publish_connections,
                interval_us / 1000.0
            ));
        }
        if r.delivery.missing > 0 {
            v.push(format!(
                "{} owed deliveries missing after a {:.0} s drain",
                r.delivery.missing, p.drain
            ));
        }
    }
    let cores = r.machine.cores.max(1) as f64 * 100.0;
    if r.machine.nice > 5.0 || r.machine.loadavg_start > 3.0 {
        v.push(format!(
            "machine shared with other work: {:.0}% of all CPU went to niced processes (load average {:.1}→{:.1})",
            r.machine.nice, r.machine.loadavg_start, r.machine.loadavg_end
        ));
    }
    let server_cpu: f64 = r.servers.iter().map(|s| s.cpu_pct).sum();
    let rig_cpu = r.rig_cpu_pct.coordinator + r.rig_cpu_pct.workers;
    if server_cpu + rig_cpu > 0.85 * cores {
        v.push(format!(
            "machine CPU saturated: server {server_cpu:.0}% + rig {rig_cpu:.0}% of {cores:.0}% (2 cores shared)"
        ));
    }
    if r.counters.disconnect_pushes > 0 || r.counters.server_closes > 0 {
        v.push(format!(
            "server ended connections: {} disconnect pushes, {} closes",
            r.counters.disconnect_pushes, r.counters.server_closes
        ));
    }
    v
}
