//! `herald-room-bench`: the large-room chat scenario (docs/benchmarks.md, "large rooms").
//!
//! One message to a room of K members is one broadcast to K personal channels. The tool opens
//! `ceil(K / per_connection)` connections, each subscribed to `per_connection` personal channels
//! (so 100,000 channels fit in the 20,000 descriptors a process may hold), then sends `messages`
//! broadcasts `interval_ms` apart through one way in:
//!
//! - `api`: `POST /api/broadcast` naming all K channels;
//! - `outbox`: one row inserted (and committed) into the PostgreSQL outbox a node drains;
//! - `kafka`: one record produced to the Kafka topic a node consumes.
//!
//! For each message it reports the time to publish (the API round trip, the insert's commit, the
//! produce's acknowledgement), the time until the last member had it (from just before the
//! publish call, on this process's one clock), delivered and duplicates. Every client runs in this
//! one process, so one clock measures both ends; on a 2-core machine the rig shares the CPU with
//! the server, which the report says beside the figures.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use herald_bench::http::{Client, Target};
use herald_bench::wire::{self, make_data};
use herald_bench::worker::now_ns;
use serde_json::json;
use tokio::net::TcpSocket;
use tokio::sync::{mpsc, Semaphore};
use tokio_websockets::{ClientBuilder, Message};

/// How a broadcast reaches Herald.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Via {
    /// `POST /api/broadcast`.
    Api,
    /// One row inserted (autocommit) into the PostgreSQL outbox table a node drains.
    Outbox,
    /// One record produced to the Kafka topic a node consumes.
    Kafka,
}

#[derive(Debug, Parser)]
#[command(name = "herald-room-bench", version)]
struct Cli {
    /// The node's WebSocket URL.
    #[arg(long, default_value = "ws://127.0.0.1:8000/ws")]
    ws: String,
    /// The node's HTTP API base URL (`--via api`).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    api: String,
    /// HTTP API key.
    #[arg(long, env = "HERALD_API_KEY", default_value = "benchkey")]
    api_key: String,
    /// Members of the room: personal channels one message goes to.
    #[arg(short, default_value_t = 1000)]
    k: usize,
    /// Personal channels each connection subscribes.
    #[arg(long, default_value_t = 1)]
    per_connection: usize,
    /// Messages sent to the room.
    #[arg(long, default_value_t = 10)]
    messages: u64,
    /// Milliseconds between messages.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Size in bytes of each message's `data` JSON.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// The way in.
    #[arg(long, value_enum, default_value_t = Via::Api)]
    via: Via,
    /// PostgreSQL connection string (`--via outbox`).
    #[arg(long, default_value = "host=127.0.0.1 user=postgres dbname=postgres")]
    pg_dsn: String,
    /// The outbox table (`--via outbox`).
    #[arg(long, default_value = "herald_outbox")]
    pg_table: String,
    /// Kafka bootstrap brokers (`--via kafka`).
    #[arg(long, default_value = "127.0.0.1:9092")]
    kafka_brokers: String,
    /// The Kafka topic the node consumes (`--via kafka`).
    #[arg(long, default_value = "herald-rooms")]
    kafka_topic: String,
    /// Connection handshakes in flight while connecting.
    #[arg(long, default_value_t = 200)]
    connect_concurrency: usize,
    /// Seconds to wait for the last deliveries after the last message.
    #[arg(long, default_value_t = 10.0)]
    drain: f64,
    /// First loopback source address; connection i dials from this + i / 15,000.
    #[arg(long, default_value = "127.0.0.2")]
    source_base: std::net::Ipv4Addr,
    /// Channel name prefix (a random suffix keeps runs apart).
    #[arg(long, default_value = "room")]
    prefix: String,
    /// Write parameters and per-message results as JSON here.
    #[arg(long)]
    json: Option<String>,
}

/// What the members saw of one message.
#[derive(Default)]
struct SeqStat {
    delivered: AtomicU64,
    last_ns: AtomicU64,
}

struct Shared {
    seqs: Vec<SeqStat>,
    duplicates: AtomicU64,
    foreign: AtomicU64,
}

fn main() -> Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let cli = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> Result<()> {
    if cli.payload < 48 {
        bail!("--payload must be at least 48 bytes (the data carries the send time and a sequence number)");
    }
    if cli.messages == 0 || cli.messages > 64 {
        bail!("--messages must be 1 to 64 (duplicates are tracked in one 64-bit word per channel)");
    }
    let per = cli.per_connection.max(1);
    let conns = cli.k.div_ceil(per);
    let prefix = format!("{}{:x}-", cli.prefix, now_ns() % 0xffff_ffff);
    let channel = |j: usize| format!("{prefix}u{j}");
    let shared = Arc::new(Shared {
        seqs: (0..cli.messages).map(|_| SeqStat::default()).collect(),
        duplicates: AtomicU64::new(0),
        foreign: AtomicU64::new(0),
    });

    // Connect everyone.
    let url = cli.ws.replace("localhost", "127.0.0.1");
    let addr: SocketAddr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .context("--ws must be ws://IP:PORT/…")?;
    let gate = Arc::new(Semaphore::new(cli.connect_concurrency.max(1)));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<Result<(), String>>();
    let (hist_tx, mut hist_rx) = mpsc::unbounded_channel::<Histogram<u64>>();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let connect_started = Instant::now();
    for i in 0..conns {
        let chans: Vec<String> = (i * per..((i + 1) * per).min(cli.k)).map(channel).collect();
        let o = cli.source_base.octets();
        let source =
            std::net::Ipv4Addr::new(o[0], o[1], o[2], o[3].wrapping_add((i / 15_000) as u8));
        let (gate, url, shared, ready, hist, stop) = (
            gate.clone(),
            url.clone(),
            shared.clone(),
            ready_tx.clone(),
            hist_tx.clone(),
            stop_rx.clone(),
        );
        tokio::spawn(async move {
            let permit = gate.acquire_owned().await;
            let ws = connect(source, addr, &url, &chans).await;
            drop(permit);
            match ws {
                Ok(ws) => {
                    let _ = ready.send(Ok(()));
                    let h = member(ws, &chans, &shared, stop).await;
                    let _ = hist.send(h);
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            }
        });
    }
    drop((ready_tx, hist_tx));
    let mut failed: BTreeMap<String, u64> = BTreeMap::new();
    let mut connected = 0;
    for _ in 0..conns {
        match ready_rx.recv().await {
            Some(Ok(())) => connected += 1,
            Some(Err(e)) => *failed.entry(e).or_default() += 1,
            None => break,
        }
    }
    let connect_s = connect_started.elapsed().as_secs_f64();
    eprintln!(
        "{connected}/{conns} connections ({} channels) in {connect_s:.1} s",
        cli.k
    );
    if !failed.is_empty() {
        eprintln!("connect failures: {failed:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Send the messages.
    let channels_json = serde_json::to_string(&(0..cli.k).map(channel).collect::<Vec<_>>())?;
    let mut api = Client::new(Target::parse(&cli.api)?, Some(&cli.api_key));
    let way_in = WayIn::open(&cli).await?;
    let mut sent = Vec::new();
    let start = Instant::now();
    for m in 0..cli.messages {
        tokio::time::sleep_until((start + Duration::from_millis(cli.interval_ms * m)).into()).await;
        let t0 = now_ns();
        let data = make_data(t0, m, cli.payload);
        let outcome = match cli.via {
            Via::Api => {
                let body = format!(
                    "{{\"channels\":{channels_json},\"data\":{data},\"idempotency_key\":\"{prefix}m{m}\"}}"
                );
                match api.request("POST", "/api/broadcast", Some(&body)).await {
                    Ok(r) if r.status == 200 => {
                        let v: serde_json::Value = serde_json::from_slice(&r.body)?;
                        match v["failed"].as_u64() {
                            Some(0) => Ok(()),
                            _ => Err(format!("{} channels failed", v["failed"])),
                        }
                    }
                    Ok(r) => Err(format!(
                        "HTTP {}: {}",
                        r.status,
                        String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                    )),
                    Err(e) => Err(format!("request: {e}")),
                }
            }
            Via::Outbox | Via::Kafka => {
                let payload = format!(
                    "{{\"channels\":{channels_json},\"data\":{data},\"idempotency_key\":\"{prefix}m{m}\"}}"
                );
                way_in.send(&payload).await
            }
        };
        let publish_ms = (now_ns() - t0) as f64 / 1e6;
        if let Err(e) = &outcome {
            eprintln!("message {m}: {e}");
        }
        sent.push((t0, publish_ms, outcome.is_ok()));
    }

    // Wait for the last deliveries.
    let want = cli.k as u64;
    let deadline = Instant::now() + Duration::from_secs_f64(cli.drain);
    while Instant::now() < deadline
        && shared
            .seqs
            .iter()
            .any(|s| s.delivered.load(Ordering::Relaxed) < want)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    while let Some(h) = hist_rx.recv().await {
        latency.add(h)?;
    }

    // Report.
    let mut rows = Vec::new();
    let (mut publish, mut last) = (Vec::new(), Vec::new());
    let mut delivered_total = 0;
    println!("message  publish_ms  last_member_ms  delivered");
    for (m, (t0, publish_ms, ok)) in sent.iter().enumerate() {
        let s = &shared.seqs[m];
        let delivered = s.delivered.load(Ordering::Relaxed);
        let last_ns = s.last_ns.load(Ordering::Relaxed);
        let last_ms = (last_ns > 0).then(|| last_ns.saturating_sub(*t0) as f64 / 1e6);
        delivered_total += delivered;
        println!(
            "{m:>7}  {publish_ms:>10.1}  {:>14}  {delivered}/{want}",
            last_ms.map_or("-".into(), |l| format!("{l:.1}"))
        );
        publish.push(*publish_ms);
        if delivered == want {
            last.push(last_ms.unwrap_or_default());
        }
        rows.push(json!({"message": m, "published": ok, "publish_ms": publish_ms, "last_member_ms": last_ms, "delivered": delivered}));
    }
    let pct = |v: &mut Vec<f64>, q: f64| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize])
    };
    let expected = want * cli.messages;
    let summary = json!({
        "via": format!("{:?}", cli.via).to_lowercase(),
        "k": cli.k,
        "per_connection": per,
        "connections": conns,
        "connected": connected,
        "connect_s": connect_s,
        "messages": cli.messages,
        "interval_ms": cli.interval_ms,
        "payload": cli.payload,
        "publish_ms_p50": pct(&mut publish, 0.5),
        "publish_ms_max": pct(&mut publish, 1.0),
        "last_member_ms_p50": pct(&mut last, 0.5),
        "last_member_ms_max": pct(&mut last, 1.0),
        "messages_complete": last.len(),
        "delivery_ms_p50": latency.value_at_quantile(0.5) as f64 / 1000.0,
        "delivery_ms_p99": latency.value_at_quantile(0.99) as f64 / 1000.0,
        "delivered": delivered_total,
        "expected": expected,
        "delivered_pct": 100.0 * delivered_total as f64 / expected.max(1) as f64,
        "duplicates": shared.duplicates.load(Ordering::Relaxed),
        "foreign": shared.foreign.load(Ordering::Relaxed),
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if let Some(path) = &cli.json {
        let out = json!({"summary": summary, "messages": rows, "connect_failures": failed});
        std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
    }
    Ok(())
}

/// The outbox's database connection or the Kafka producer, opened before the first message so
/// that only the insert or the produce is timed.
enum WayIn {
    Api,
    Outbox {
        db: tokio_postgres::Client,
        insert: String,
    },
    Kafka {
        producer: rdkafka::producer::FutureProducer,
        topic: String,
    },
}

impl WayIn {
    async fn open(cli: &Cli) -> Result<WayIn> {
        Ok(match cli.via {
            Via::Api => WayIn::Api,
            Via::Outbox => {
                let (db, conn) = tokio_postgres::connect(&cli.pg_dsn, tokio_postgres::NoTls)
                    .await
                    .context("connect to PostgreSQL (--pg-dsn)")?;
                tokio::spawn(conn);
                let insert = format!(
                    "INSERT INTO {} (method, payload, partition) VALUES ('broadcast', $1::text::jsonb, 0)",
                    cli.pg_table
                );
                WayIn::Outbox { db, insert }
            }
            Via::Kafka => {
                let producer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", &cli.kafka_brokers)
                    .set("enable.idempotence", "true")
                    .set("linger.ms", "0")
                    // A broadcast to 100,000 channels names them all: about 2 MB.
                    .set("message.max.bytes", "16777216")
                    .create()
                    .context("Kafka producer (--kafka-brokers)")?;
                WayIn::Kafka {
                    producer,
                    topic: cli.kafka_topic.clone(),
                }
            }
        })
    }

    /// Write one broadcast (`payload` in the HTTP API's shape); returns once it is committed or
    /// acknowledged.
    async fn send(&self, payload: &str) -> std::result::Result<(), String> {
        match self {
            WayIn::Api => Err("the API is not sent through WayIn".into()),
            WayIn::Outbox { db, insert } => db
                .execute(insert.as_str(), &[&payload])
                .await
                .map(|_| ())
                .map_err(|e| format!("insert: {e}")),
            WayIn::Kafka { producer, topic } => {
                let value = format!("{{\"method\":\"broadcast\",\"payload\":{payload}}}");
                producer
                    .send(
                        rdkafka::producer::FutureRecord::<(), str>::to(topic)
                            .partition(0)
                            .payload(&value),
                        Duration::from_secs(30),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| format!("produce: {e}"))
            }
        }
    }
}

type Ws = tokio_websockets::WebSocketStream<tokio::net::TcpStream>;

/// TCP from `source`, the WebSocket upgrade, `connect` with every channel, its reply.
async fn connect(
    source: std::net::Ipv4Addr,
    addr: SocketAddr,
    url: &str,
    chans: &[String],
) -> Result<Ws, String> {
    let sock = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    sock.bind(SocketAddr::new(source.into(), 0))
        .map_err(|e| format!("bind {source}: {e}"))?;
    let tcp = sock.connect(addr).await.map_err(|e| e.kind().to_string())?;
    let _ = tcp.set_nodelay(true);
    let (mut ws, _) = ClientBuilder::new()
        .uri(url)
        .map_err(|e| e.to_string())?
        .connect_on(tcp)
        .await
        .map_err(|e| format!("websocket handshake: {e}"))?;
    let subs: Vec<(&str, Option<&wire::Since>)> =
        chans.iter().map(|c| (c.as_str(), None)).collect();
    ws.send(Message::text(wire::connect_cmd(&subs)))
        .await
        .map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(Duration::from_secs(30), ws.next())
        .await
        .map_err(|_| "no connect reply in 30 s".to_string())?;
    match reply {
        Some(Ok(m)) if m.as_text().is_some_and(|t| t.contains("\"connect\"")) => Ok(ws),
        Some(Ok(m)) => Err(format!(
            "unexpected connect reply: {}",
            m.as_text()
                .unwrap_or("(not text)")
                .chars()
                .take(120)
                .collect::<String>()
        )),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("closed before the connect reply".into()),
    }
}

/// One member connection: count each message once per channel, note duplicates, answer pings.
async fn member(
    mut ws: Ws,
    chans: &[String],
    shared: &Shared,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Histogram<u64> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("static bounds");
    let mut seen = vec![0u64; chans.len()];
    loop {
        let msg = tokio::select! {
            m = ws.next() => m,
            _ = stop.changed() => break,
        };
        let Some(Ok(msg)) = msg else { break };
        let Some(text) = msg.as_text() else { continue };
        for line in text.split('\n').filter(|l| !l.is_empty()) {
            let Ok(inc) = wire::parse(line) else { continue };
            if inc.is_ping() {
                let _ = ws.send(Message::text("{}")).await;
                continue;
            }
            let Some(p) = inc.publication else { continue };
            let at = now_ns();
            let idx = p
                .channel
                .as_deref()
                .and_then(|c| chans.iter().position(|x| x == c));
            let (Some(idx), Some(stat)) = (idx, shared.seqs.get(p.data.s as usize)) else {
                shared.foreign.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let bit = 1u64 << p.data.s;
            if seen[idx] & bit != 0 {
                shared.duplicates.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            seen[idx] |= bit;
            stat.delivered.fetch_add(1, Ordering::Relaxed);
            stat.last_ns.fetch_max(at, Ordering::Relaxed);
            latency.saturating_record((at.saturating_sub(p.data.t) / 1000).max(1));
        }
    }
    latency
}
