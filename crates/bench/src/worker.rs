//! A worker: holds its share of the client connections (one task each on a current-thread
//! runtime), keeps each subscription's delivery accounting and the latency histograms, and answers
//! the coordinator's commands. The same code runs in a child process (`herald-bench worker`) and,
//! in tests, in-process.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::net::TcpSocket;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;
use tokio_websockets::{ClientBuilder, Message, WebSocketStream};

use crate::accounting::{Delivery, Expected, Seen, SubAccount};
use crate::hist::{self, new_hist};
use crate::params::{place, Params, Scenario, Shard, Transport};
use crate::sse::{self, SseConn};
use crate::tls;
use crate::wire::{self, Since};

/// Nanoseconds since the UNIX epoch on the realtime clock: the one clock publisher and receivers
/// share (same machine; docs/benchmarking.md rule 3).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Timelines stop growing after this many seconds.
const MAX_TIMELINE_S: usize = 24 * 3600;
/// Per-publication "reached everyone" tracking stops after this many sequence numbers.
const MAX_SEQ: usize = 2_000_000;

/// What the coordinator tells a worker (one JSON line on its stdin).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Drop every connection at `at_ns` and reconnect at once (`storm`).
    Drop {
        /// When, ns since the UNIX epoch.
        at_ns: u64,
    },
    /// The coordinator sends the node SIGTERM at `at_ns` (`drain`): clients told to reconnect
    /// wait the push's `after_ms`, then come back with `since`; time to back counts from `at_ns`.
    Drain {
        /// When, ns since the UNIX epoch.
        at_ns: u64,
    },
    /// Publishing is over: stop dropping, wait for the owed publications (or `drain` seconds of no
    /// progress), then report.
    Finish {
        /// Offsets published per channel.
        expect: BTreeMap<String, Expected>,
    },
}

/// What a worker tells the coordinator (one JSON line on its stdout).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// Every connection of the share was attempted.
    Ready {
        /// Worker index.
        index: usize,
        /// Connections subscribed.
        connected: u64,
        /// Connections that failed.
        failed: u64,
        /// Failure causes and counts.
        errors: BTreeMap<String, u64>,
        /// When the first attempt started and the last finished, ns since the UNIX epoch.
        span_ns: (u64, u64),
    },
    /// Once a second.
    Progress {
        /// Worker index.
        index: usize,
        /// Connections currently subscribed.
        connected: u64,
        /// Publications received so far (duplicates included).
        deliveries: u64,
    },
    /// After a `Drop` or `Drain`: everyone is back, or the retry window ran out.
    StormDone {
        /// Worker index.
        index: usize,
        /// Clients back and re-subscribed.
        back: u64,
        /// Clients that were dropped.
        dropped: u64,
    },
    /// Final figures.
    Result(Box<WorkerResult>),
}

/// A worker's raw results; the coordinator merges these.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerResult {
    /// Worker index.
    pub index: usize,
    /// Connections this worker was asked for.
    pub connections: u64,
    /// Connections that subscribed on the first attempt.
    pub connected: u64,
    /// Connection failures (first attempts and reconnects that gave up).
    pub failed: u64,
    /// Failure causes and counts.
    pub errors: BTreeMap<String, u64>,
    /// Delivery accounting against what was published.
    pub delivery: Delivery,
    /// Live delivery latency (µs from the scheduled send time), histogram, V2+base64.
    pub latency: String,
    /// Time to connect and subscribe (µs), first attempts.
    pub connect: String,
    /// Reconnect to recovered reply (µs), for reconnects with `since`.
    pub recovery: String,
    /// `storm`: time from the drop to back and re-subscribed (µs).
    pub storm: String,
    /// Unique deliveries per second since the run's t0.
    pub timeline: Vec<u64>,
    /// Per publication sequence number: the highest latency (µs) any of our subscribers saw.
    pub per_seq_max_us: Vec<u64>,
    /// Other counters.
    pub counters: Counters,
}

/// Event counters of a worker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Reconnects that succeeded.
    pub reconnects: u64,
    /// Reconnect replies with `recovered: true`.
    pub recovered: u64,
    /// Reconnect replies with `recovered: false` (or none).
    pub not_recovered: u64,
    /// Epoch changed across a reconnect.
    pub epoch_changes: u64,
    /// Drops the client did on purpose (`jitter`, `storm`).
    pub client_drops: u64,
    /// Connections the server closed or that broke.
    pub server_closes: u64,
    /// `{}` pings answered.
    pub pings: u64,
    /// `disconnect` pushes.
    pub disconnect_pushes: u64,
    /// `unsub` pushes.
    pub unsub_pushes: u64,
    /// Presence `join` pushes.
    pub joins: u64,
    /// Presence `leave` pushes.
    pub leaves: u64,
    /// Error replies.
    pub error_replies: u64,
    /// Lines that did not parse.
    pub parse_errors: u64,
    /// Publications received, duplicates included.
    pub deliveries: u64,
    /// WebSocket connections that negotiated permessage-deflate (`--compression`).
    #[serde(default)]
    pub compressed: u64,
    /// Reconnect attempts that failed (refused, timed out, broken handshake) and were retried.
    #[serde(default)]
    pub retried_attempts: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Control {
    Run,
    Drop(u64),
    Finish,
    Stop,
}

struct Shared {
    latency: Histogram<u64>,
    connect: Histogram<u64>,
    recovery: Histogram<u64>,
    storm: Histogram<u64>,
    timeline: Vec<u64>,
    per_seq_max: Vec<u64>,
    errors: BTreeMap<String, u64>,
    counters: Counters,
    failed: u64,
}

struct Ctx {
    p: Params,
    scenario: Scenario,
    shard: Shard,
    nodes: Vec<(SocketAddr, String)>,
    shared: Mutex<Shared>,
    control: watch::Receiver<Control>,
    connect_slots: Semaphore,
    attempted: AtomicU64,
    connected_now: AtomicU64,
    connected_first: AtomicU64,
    unique: AtomicU64,
    deliveries: AtomicU64,
    back: AtomicU64,
    /// `drain`: when the node was sent SIGTERM (ns since the UNIX epoch); 0 before that.
    drain_at_ns: AtomicU64,
    first_start_ns: AtomicU64,
    last_done_ns: AtomicU64,
}

impl Ctx {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, kind: String) {
        let mut s = self.shared();
        s.failed += 1;
        *s.errors.entry(kind).or_default() += 1;
    }
}

/// `ws://host:port/path` (or `wss://`) → the address to dial.
fn ws_addr(url: &str) -> Result<SocketAddr> {
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .with_context(|| format!("only ws:// and wss:// URLs are supported: {url}"))?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.replace("localhost", "127.0.0.1");
    authority
        .parse()
        .with_context(|| format!("{url}: host must be an IP literal"))
}

/// Runs one worker until it has reported its result.
///
/// # Errors
/// Bad URLs in the parameters.
pub async fn run(
    p: Params,
    scenario: Scenario,
    shard: Shard,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<()> {
    let nodes = p
        .ws_urls
        .iter()
        .map(|u| Ok((ws_addr(u)?, u.clone())))
        .collect::<Result<Vec<_>>>()?;
    let (control_tx, control_rx) = watch::channel(Control::Run);
    let share = (shard.end - shard.start) as u64;
    let ctx = Arc::new(Ctx {
        connect_slots: Semaphore::new(p.connect_concurrency.max(1)),
        p,
        scenario,
        shard,
        nodes,
        shared: Mutex::new(Shared {
            latency: new_hist(),
            connect: new_hist(),
            recovery: new_hist(),
            storm: new_hist(),
            timeline: Vec::new(),
            per_seq_max: Vec::new(),
            errors: BTreeMap::new(),
            counters: Counters::default(),
            failed: 0,
        }),
        control: control_rx,
        attempted: AtomicU64::new(0),
        connected_now: AtomicU64::new(0),
        connected_first: AtomicU64::new(0),
        unique: AtomicU64::new(0),
        deliveries: AtomicU64::new(0),
        back: AtomicU64::new(0),
        drain_at_ns: AtomicU64::new(0),
        first_start_ns: AtomicU64::new(u64::MAX),
        last_done_ns: AtomicU64::new(0),
    });
    let mut tasks = Vec::with_capacity(share as usize);
    for i in ctx.shard.start..ctx.shard.end {
        tasks.push(tokio::spawn(tls::as_client(i, client(ctx.clone(), i))));
    }
    let index = ctx.shard.index;

    // Progress once a second until the worker reports its result.
    let progress = {
        let ctx = ctx.clone();
        let events = events.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let ev = Event::Progress {
                    index,
                    connected: ctx.connected_now.load(Relaxed),
                    deliveries: ctx.deliveries.load(Relaxed),
                };
                if events.send(ev).is_err() {
                    break;
                }
            }
        })
    };

    // Ready when every connection of the share has been attempted.
    while ctx.attempted.load(Relaxed) < share {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (errors, failed) = {
        let s = ctx.shared();
        (s.errors.clone(), s.failed)
    };
    let _ = events.send(Event::Ready {
        index,
        connected: ctx.connected_first.load(Relaxed),
        failed,
        errors,
        span_ns: (
            ctx.first_start_ns.load(Relaxed),
            ctx.last_done_ns.load(Relaxed),
        ),
    });

    let expect = loop {
        match cmds.recv().await {
            Some(Command::Drop { at_ns }) => {
                let dropped = ctx.connected_now.load(Relaxed);
                ctx.back.store(0, Relaxed);
                let _ = control_tx.send(Control::Drop(at_ns));
                report_when_back(ctx.clone(), events.clone(), at_ns, dropped);
            }
            Some(Command::Drain { at_ns }) => {
                let dropped = ctx.connected_now.load(Relaxed);
                ctx.back.store(0, Relaxed);
                ctx.drain_at_ns.store(at_ns, Relaxed);
                // Extra time: the node spreads its `after_ms` over `drain_ms` (5 s by default).
                report_when_back(ctx.clone(), events.clone(), at_ns + 10_000_000_000, dropped);
            }
            Some(Command::Finish { expect }) => break expect,
            None => break BTreeMap::new(),
        }
    };
    let _ = control_tx.send(Control::Finish);

    // Wait for what is owed: every new offset we receive is one the publisher was told about.
    let owed: u64 = (ctx.shard.start..ctx.shard.end)
        .map(|i| {
            expect
                .get(&place(&ctx.p, scenario, i).channel)
                .map_or(0, |e| e.count)
        })
        .sum();
    let drain = Duration::from_secs_f64(ctx.p.drain);
    let (mut last_seen, mut last_change) = (ctx.unique.load(Relaxed), Instant::now());
    while ctx.unique.load(Relaxed) < owed {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let u = ctx.unique.load(Relaxed);
        if u != last_seen {
            (last_seen, last_change) = (u, Instant::now());
        } else if last_change.elapsed() > drain {
            break;
        }
    }
    let _ = control_tx.send(Control::Stop);

    let mut delivery = Delivery::default();
    for t in tasks {
        if let Ok((channel, Some(acct))) = t.await {
            delivery.add_sub(&acct, &channel, &expect);
        }
    }
    progress.abort();
    let s = ctx.shared();
    let result = WorkerResult {
        index,
        connections: share,
        connected: ctx.connected_first.load(Relaxed),
        failed: s.failed,
        errors: s.errors.clone(),
        delivery,
        latency: hist::encode(&s.latency),
        connect: hist::encode(&s.connect),
        recovery: hist::encode(&s.recovery),
        storm: hist::encode(&s.storm),
        timeline: s.timeline.clone(),
        per_seq_max_us: s.per_seq_max.clone(),
        counters: Counters {
            deliveries: ctx.deliveries.load(Relaxed),
            ..s.counters.clone()
        },
    };
    drop(s);
    let _ = events.send(Event::Result(Box::new(result)));
    Ok(())
}

/// Sends `StormDone` once `dropped` clients are back, or `retry_for` + 5 s after `at_ns`.
fn report_when_back(ctx: Arc<Ctx>, events: mpsc::UnboundedSender<Event>, at_ns: u64, dropped: u64) {
    tokio::spawn(async move {
        let deadline = Instant::now()
            + Duration::from_secs_f64(ctx.p.retry_for + 5.0)
            + Duration::from_nanos(at_ns.saturating_sub(now_ns()));
        while ctx.back.load(Relaxed) < dropped && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = events.send(Event::StormDone {
            index: ctx.shard.index,
            back: ctx.back.load(Relaxed),
            dropped,
        });
    });
}

/// Why a client is (re)connecting.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Why {
    First,
    Jitter,
    Storm(u64),
    Broken,
}

type Ws = WebSocketStream<tls::Stream>;

/// A client's connection: WebSocket, or (`--transport sse`) an SSE stream whose events come out
/// as the WebSocket protocol's lines, so both go through the same accounting.
enum Conn {
    Ws(Ws),
    Sse(SseConn),
}

/// What [`Conn::recv`] got.
enum Got {
    /// A WebSocket message (text or other).
    Ws(Message),
    /// One SSE event as a protocol line.
    Sse(String),
    /// The connection ended (close, reset, EOF).
    Closed,
}

impl Conn {
    /// The next message; cancel-safe (both readers keep what they read).
    async fn recv(&mut self) -> Got {
        match self {
            Conn::Ws(ws) => match ws.next().await {
                Some(Ok(m)) if !m.is_close() => Got::Ws(m),
                _ => Got::Closed,
            },
            Conn::Sse(sse) => loop {
                match sse.next_event().await {
                    None => return Got::Closed,
                    Some(ev) => {
                        if let Some(line) = ev.as_line() {
                            return Got::Sse(line);
                        }
                    }
                }
            },
        }
    }

    /// Answer a ping: WebSocket clients send `pong`; an SSE stream has nothing to answer with.
    async fn pong(&mut self, pong: &'static str) -> bool {
        match self {
            Conn::Ws(ws) => ws.send(Message::text(pong)).await.is_ok(),
            Conn::Sse(_) => true,
        }
    }
}

/// One client: connect and subscribe, receive until told to stop, reconnect with `since` after a
/// drop. Returns its channel and accounting.
async fn client(ctx: Arc<Ctx>, i: usize) -> (String, Option<SubAccount>) {
    let pl = place(&ctx.p, ctx.scenario, i);
    let (addr, url) = ctx.nodes[pl.node % ctx.nodes.len()].clone();
    let mut ctl = ctx.control.clone();
    let mut acct: Option<SubAccount> = None;
    let mut epoch = String::new();
    let mut why = Why::First;
    loop {
        // 1. Connect and subscribe (with `since` after the first time).
        let started = Instant::now();
        let since = acct.as_ref().map(|a| Since {
            epoch: epoch.clone(),
            offset: a.last,
        });
        let (ws, rest) =
            match connect_retrying(&ctx, addr, &url, &pl.channel, since.as_ref(), why, &mut ctl)
                .await
            {
                Ok(Some((ws, mut reply))) => {
                    let rest = reply.rest.take();
                    on_subscribed(&ctx, &mut acct, &mut epoch, reply, why, started);
                    (ws, rest)
                }
                Ok(None) => return (pl.channel, acct),
                Err(kind) => {
                    ctx.error(kind);
                    if why == Why::First {
                        ctx.attempted.fetch_add(1, Relaxed);
                    }
                    return (pl.channel, acct);
                }
            };
        ctx.connected_now.fetch_add(1, Relaxed);
        // 2. Receive until the connection ends one way or another.
        // Publications scheduled before this (re)subscription are catch-up, not live: they
        // count as delivered but stay out of the latency histogram.
        let live_from = if why == Why::First { 0 } else { now_ns() };
        let next = receive(
            &ctx,
            ws,
            &pl.channel,
            acct.as_mut().expect("set on subscribe"),
            &mut ctl,
            rest,
            live_from,
        )
        .await;
        ctx.connected_now.fetch_sub(1, Relaxed);
        match next {
            None => return (pl.channel, acct),
            Some(w) => why = w,
        }
    }
}

/// The subscribe reply's figures, owned so the frame they came in can go.
struct Reply {
    epoch: String,
    offset: u64,
    recovered: Option<bool>,
    /// Recovered publications: (offset, sent_ns, seq).
    publications: Vec<(u64, u64, u64)>,
    /// Messages that followed the reply in the same frame (the server batches).
    rest: Option<String>,
    /// The WebSocket negotiated permessage-deflate.
    compressed: bool,
}

fn on_subscribed(
    ctx: &Ctx,
    acct: &mut Option<SubAccount>,
    epoch: &mut String,
    reply: Reply,
    why: Why,
    started: Instant,
) {
    let took_us = started.elapsed().as_micros() as u64;
    let mut s = ctx.shared();
    if reply.compressed && why == Why::First {
        s.counters.compressed += 1;
    }
    match acct {
        None => {
            *acct = Some(SubAccount::new(reply.offset));
            if why == Why::First {
                s.connect.saturating_record(took_us.max(1));
                ctx.connected_first.fetch_add(1, Relaxed);
                ctx.attempted.fetch_add(1, Relaxed);
                ctx.last_done_ns.fetch_max(now_ns(), Relaxed);
            }
        }
        Some(a) => {
            s.counters.reconnects += 1;
            if !epoch.is_empty() && *epoch != reply.epoch {
                s.counters.epoch_changes += 1;
            }
            if reply.recovered == Some(true) {
                s.counters.recovered += 1;
                s.recovery.saturating_record(took_us.max(1));
            } else {
                s.counters.not_recovered += 1;
            }
            let now = now_ns();
            for (offset, sent, seq) in reply.publications {
                ctx.deliveries.fetch_add(1, Relaxed);
                match a.on_pub(offset) {
                    Seen::Duplicate | Seen::Stale => {}
                    _ => {
                        ctx.unique.fetch_add(1, Relaxed);
                        count_delivery(ctx, &mut s, now, sent, seq, false);
                    }
                }
            }
            if let Why::Storm(at) = why {
                s.storm
                    .saturating_record((now.saturating_sub(at) / 1000).max(1));
                ctx.back.fetch_add(1, Relaxed);
            }
        }
    }
    *epoch = reply.epoch;
}

/// Timeline and per-publication bookkeeping for one delivery; `live` ones also go into the latency
/// histogram (recovered ones are late by design and would only measure the offline window).
/// A publication a subscriber received at `now`: counted, and unless it repeats one already seen
/// (by `offset`), counted as unique with its latency recorded.
fn on_delivery(
    ctx: &Ctx,
    s: &mut Shared,
    acct: &mut SubAccount,
    offset: u64,
    now: u64,
    data: &wire::Data,
    live_from: u64,
) {
    ctx.deliveries.fetch_add(1, Relaxed);
    match acct.on_pub(offset) {
        Seen::Duplicate | Seen::Stale => {}
        _ => {
            ctx.unique.fetch_add(1, Relaxed);
            count_delivery(ctx, s, now, data.t, data.s, data.t >= live_from);
        }
    }
}

fn count_delivery(ctx: &Ctx, s: &mut Shared, now: u64, sent: u64, seq: u64, live: bool) {
    let sec = (now.saturating_sub(ctx.shard.t0_ns) / 1_000_000_000) as usize;
    if sec < MAX_TIMELINE_S {
        if s.timeline.len() <= sec {
            s.timeline.resize(sec + 1, 0);
        }
        s.timeline[sec] += 1;
    }
    if live && sent > 0 {
        let us = (now.saturating_sub(sent) / 1000).max(1);
        s.latency.saturating_record(us);
        let seq = seq as usize;
        if seq < MAX_SEQ {
            if s.per_seq_max.len() <= seq {
                s.per_seq_max.resize(seq + 1, 0);
            }
            s.per_seq_max[seq] = s.per_seq_max[seq].max(us);
        }
    }
}

/// Connects, retrying reconnects (not first attempts) with backoff until `retry_for` passes.
/// `Ok(None)`: told to stop meanwhile.
async fn connect_retrying(
    ctx: &Ctx,
    addr: SocketAddr,
    url: &str,
    channel: &str,
    since: Option<&Since>,
    why: Why,
    ctl: &mut watch::Receiver<Control>,
) -> Result<Option<(Conn, Reply)>, String> {
    let give_up = Instant::now() + Duration::from_secs_f64(ctx.p.retry_for);
    let mut backoff = Duration::from_millis(50);
    loop {
        if *ctl.borrow() == Control::Stop {
            return Ok(None);
        }
        let permit = if why == Why::First {
            Some(ctx.connect_slots.acquire().await.expect("never closed"))
        } else {
            None
        };
        ctx.first_start_ns.fetch_min(now_ns(), Relaxed);
        let timeout = Duration::from_secs_f64(ctx.p.connect_timeout);
        let res = match tokio::time::timeout(
            timeout,
            connect_once(ctx.shard.source, addr, url, channel, since, &ctx.p),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err("timeout".to_string()),
        };
        drop(permit);
        match res {
            Ok(ok) => return Ok(Some(ok)),
            Err(e) if why == Why::First || Instant::now() > give_up => return Err(e),
            Err(_) => {
                ctx.shared().counters.retried_attempts += 1;
                let wait = backoff + Duration::from_millis(rand::rng().random_range(0..50));
                backoff = (backoff * 2).min(Duration::from_secs(1));
                if sleep_or_stop(wait, ctl).await {
                    return Ok(None);
                }
            }
        }
    }
}

/// Sleeps unless told to stop first (true: stop).
async fn sleep_or_stop(d: Duration, ctl: &mut watch::Receiver<Control>) -> bool {
    let until = Instant::now() + d;
    loop {
        if *ctl.borrow_and_update() == Control::Stop {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return false,
            r = ctl.changed() => if r.is_err() { return true },
        }
    }
}

fn io_kind(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(24) => "EMFILE: the worker's descriptor limit".into(),
        Some(99) => "EADDRNOTAVAIL: source ports exhausted".into(),
        Some(111) => "ECONNREFUSED".into(),
        Some(104) => "ECONNRESET".into(),
        Some(110) => "ETIMEDOUT".into(),
        _ => format!("io: {:?}", e.kind()),
    }
}

/// One attempt: TCP from our source address, WebSocket upgrade, `connect` with `subs`, its reply.
async fn connect_once(
    source: Ipv4Addr,
    addr: SocketAddr,
    url: &str,
    channel: &str,
    since: Option<&Since>,
    p: &Params,
) -> Result<(Conn, Reply), String> {
    let sock = TcpSocket::new_v4().map_err(|e| io_kind(&e))?;
    sock.bind(SocketAddr::new(source.into(), 0))
        .map_err(|e| format!("bind {source}: {}", io_kind(&e)))?;
    let tcp = sock.connect(addr).await.map_err(|e| io_kind(&e))?;
    let _ = tcp.set_nodelay(true);
    let tcp = tls::wrap(tcp, tls::is_tls_url(url), tls::url_host(url)).await?;
    if p.transport == Transport::Sse {
        return sse_subscribe(tcp, url, channel, since).await;
    }
    let mut builder = ClientBuilder::new()
        .uri(url)
        .map_err(|e| format!("bad url: {e}"))?;
    if p.compression {
        // No `client_max_window_bits`: this client always compresses with a 15-bit window.
        builder = builder
            .add_header(
                http::header::SEC_WEBSOCKET_EXTENSIONS,
                http::HeaderValue::from_static("permessage-deflate"),
            )
            .map_err(|e| format!("extension header: {e}"))?;
    }
    let (mut ws, response) = builder
        .connect_on(tcp)
        .await
        .map_err(|e| format!("websocket handshake: {e}"))?;
    let compressed = p.compression
        && response
            .headers()
            .get(http::header::SEC_WEBSOCKET_EXTENSIONS)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("permessage-deflate"));
    ws.set_compression(compressed);
    if p.pusher {
        let extension = p.pusher_app.is_none();
        let (ws, mut reply) = pusher_subscribe(ws, channel, since, extension).await?;
        reply.compressed = compressed;
        return Ok((Conn::Ws(ws), reply));
    }
    if p.centrifugo {
        let (ws, mut reply) = centrifugo_subscribe(ws, channel, since).await?;
        reply.compressed = compressed;
        return Ok((Conn::Ws(ws), reply));
    }
    if p.socketio {
        let (ws, mut reply) = socketio_subscribe(ws, channel).await?;
        reply.compressed = compressed;
        return Ok((Conn::Ws(ws), reply));
    }
    // With a tag filter the subscription is the reply to a second command (id 2).
    let filter = p
        .tags_filter
        .as_deref()
        .map(serde_json::from_str::<serde_json::Value>)
        .transpose()
        .map_err(|e| format!("--tags-filter: {e}"))?;
    let frames = match &filter {
        Some(tf) => wire::filtered_connect_subscribe(channel, since, tf).to_vec(),
        None => vec![wire::connect_cmd(&[(channel, since)])],
    };
    let reply_id = frames.len() as u64;
    for frame in frames {
        ws.send(Message::text(frame))
            .await
            .map_err(|e| format!("send connect: {e}"))?;
    }
    loop {
        let text = next_text(&mut ws, "connect reply").await?;
        for (line, end) in lines(&text) {
            let inc = wire::parse(line).map_err(|e| format!("bad reply: {e}"))?;
            let Some(id @ 1..) = inc.id else { continue };
            if inc.error.is_some() {
                let what = if id == 1 { "connect" } else { "subscribe" };
                return Err(format!(
                    "{what} error reply: {}",
                    inc.error.map(|e| e.get().to_string()).unwrap_or_default()
                ));
            }
            if id != reply_id {
                continue;
            }
            let rest = text
                .get(end + 1..)
                .filter(|r| !r.trim().is_empty())
                .map(str::to_owned);
            let sub = match (inc.subscribe, inc.connect) {
                (Some(sub), _) => sub,
                (None, Some(mut c)) => c
                    .subs
                    .remove(channel)
                    .ok_or("connect reply without our subscription")?,
                (None, None) => return Err("reply without a result".into()),
            };
            if let Some(e) = sub.error {
                return Err(format!("subscribe error: {}", e.get()));
            }
            let publications = sub
                .publications
                .iter()
                .map(|p| (p.offset, p.data.t, p.data.s))
                .collect();
            return Ok((
                Conn::Ws(ws),
                Reply {
                    epoch: sub.epoch,
                    offset: sub.offset,
                    recovered: sub.recovered,
                    publications,
                    rest,
                    compressed,
                },
            ));
        }
    }
}

/// `--transport sse`: open the stream and read up to the position the node sets before the
/// first publication (the id-only block after `connected`), which stands for the `connect`
/// reply's offset.
async fn sse_subscribe(
    tcp: tls::Stream,
    url: &str,
    channel: &str,
    since: Option<&Since>,
) -> Result<(Conn, Reply), String> {
    let mut conn = SseConn::open(tcp, &sse::endpoint(url), channel, since).await?;
    let mut connected = false;
    loop {
        let Some(ev) = conn.next_event().await else {
            return Err(match connected {
                true => "sse closed before the position".into(),
                false => "sse closed before connected".into(),
            });
        };
        match (ev.event.as_deref(), &ev.id, &ev.data) {
            (Some("connected"), _, _) => connected = true,
            (Some("sub_error"), _, data) => {
                return Err(format!(
                    "subscribe error: {}",
                    data.as_deref().unwrap_or("")
                ))
            }
            (Some("disconnect"), _, data) => {
                return Err(format!("sse disconnect: {}", data.as_deref().unwrap_or("")))
            }
            (None, Some(id), None) if connected => {
                let (epoch, offset) =
                    sse::position(id).ok_or_else(|| format!("bad sse event id {id:?}"))?;
                return Ok((
                    Conn::Sse(conn),
                    Reply {
                        epoch,
                        offset,
                        recovered: since.map(|_| true),
                        publications: Vec::new(),
                        rest: None,
                        compressed: false,
                    },
                ));
            }
            (None, _, Some(_)) => return Err("sse publication before the position".into()),
            _ => {}
        }
    }
}

/// `--pusher`: after `pusher:connection_established`, subscribe with the catch-up extension and
/// wait for `subscription_succeeded`. Recovered events follow it as ordinary events.
async fn pusher_subscribe(
    mut ws: Ws,
    channel: &str,
    since: Option<&Since>,
    extension: bool,
) -> Result<(Ws, Reply), String> {
    let name = wire::pusher_channel(channel);
    let mut subscribed = false;
    loop {
        let text = next_text(&mut ws, "subscription_succeeded").await?;
        let inc: wire::PusherIncoming<'_> =
            serde_json::from_str(&text).map_err(|e| format!("bad message: {e}"))?;
        match inc.event.as_ref() {
            "pusher:connection_established" if !subscribed => {
                ws.send(Message::text(wire::pusher_subscribe(
                    name, since, extension,
                )))
                .await
                .map_err(|e| format!("send subscribe: {e}"))?;
                subscribed = true;
            }
            "pusher_internal:subscription_succeeded" if inc.channel.as_deref() == Some(name) => {
                #[derive(serde::Deserialize)]
                struct Succeeded {
                    #[serde(default)]
                    herald: wire::PusherPosition,
                }
                let data: String = inc
                    .data
                    .and_then(|d| serde_json::from_str(d.get()).ok())
                    .unwrap_or_default();
                let s: Succeeded = serde_json::from_str(&data)
                    .map_err(|e| format!("bad subscription_succeeded: {e}"))?;
                return Ok((
                    ws,
                    Reply {
                        epoch: s.herald.epoch,
                        offset: s.herald.offset,
                        recovered: s.herald.recovered,
                        publications: Vec::new(),
                        rest: None,
                        compressed: false,
                    },
                ));
            }
            "pusher:subscription_error" | "pusher:error" => {
                return Err(format!(
                    "{}: {}",
                    inc.event,
                    inc.data.map(|d| d.get().to_string()).unwrap_or_default()
                ))
            }
            _ => {}
        }
    }
}

/// The next text frame of the handshake (others skipped); an error naming `what` when the
/// connection ends first.
async fn next_text(ws: &mut Ws, what: &str) -> Result<String, String> {
    loop {
        let msg = match ws.next().await {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(format!("closed before {what}: {e}")),
            None => return Err(format!("closed before {what}")),
        };
        if msg.is_close() {
            let code = msg.as_close().map(|(c, _)| u16::from(c)).unwrap_or(0);
            return Err(format!("closed with {code} before {what}"));
        }
        if let Some(text) = msg.as_text() {
            return Ok(text.to_owned());
        }
    }
}

/// A frame's non-empty newline-separated messages, each with the byte offset just past it (what
/// follows the reply in the same frame is handed on).
fn lines(text: &str) -> impl Iterator<Item = (&str, usize)> {
    let mut at = 0;
    text.split('\n').filter_map(move |line| {
        let end = at + line.len();
        at = end + 1;
        (!line.is_empty()).then_some((line, end))
    })
}

/// `--centrifugo`: `connect` and `subscribe` in one frame, then read until the subscribe reply
/// (id 2). Messages after it in the same frame (publications) are handed on as `rest`.
async fn centrifugo_subscribe(
    mut ws: Ws,
    channel: &str,
    since: Option<&Since>,
) -> Result<(Ws, Reply), String> {
    ws.send(Message::text(wire::centrifugo_connect_subscribe(
        channel, since,
    )))
    .await
    .map_err(|e| format!("send connect: {e}"))?;
    loop {
        let text = next_text(&mut ws, "subscribe reply").await?;
        for (line, end) in lines(&text) {
            let inc = wire::parse_centrifugo(line).map_err(|e| format!("bad reply: {e}"))?;
            if let Some(e) = &inc.error {
                let what = match inc.id {
                    Some(1) => "connect",
                    _ => "subscribe",
                };
                return Err(format!("{what} error reply: {}", e.get()));
            }
            if inc.id != Some(2) {
                continue;
            }
            let sub = inc.subscribe.ok_or("subscribe reply without result")?;
            let rest = text
                .get(end + 1..)
                .filter(|r| !r.trim().is_empty())
                .map(str::to_owned);
            let publications = sub
                .publications
                .iter()
                .map(|p| (p.offset, p.data.t, p.data.s))
                .collect();
            return Ok((
                ws,
                Reply {
                    epoch: sub.epoch,
                    offset: sub.offset,
                    recovered: since.map(|_| sub.recovered),
                    publications,
                    rest,
                    compressed: false,
                },
            ));
        }
    }
}

/// `--socketio`: after Engine.IO's `open`, connect to the main namespace, then emit `subscribe`
/// with an ack id and wait for the ack (the server has joined the room). Socket.IO has no
/// positions: the reply carries none, and a reconnect cannot ask for what it missed.
async fn socketio_subscribe(mut ws: Ws, channel: &str) -> Result<(Ws, Reply), String> {
    use wire::SocketIo;
    loop {
        let text = next_text(&mut ws, "subscribe ack").await?;
        let send = match wire::parse_socketio(&text)? {
            SocketIo::Open(_) => wire::SOCKETIO_CONNECT.to_string(),
            SocketIo::Connected => wire::socketio_subscribe(channel),
            SocketIo::Ping => wire::SOCKETIO_PONG.to_string(),
            SocketIo::Ack(wire::SOCKETIO_SUBSCRIBE_ACK, args) => {
                let args: Vec<serde_json::Value> =
                    serde_json::from_str(args).map_err(|e| format!("bad subscribe ack: {e}"))?;
                if let Some(e) = args.first() {
                    return Err(format!("subscribe error: {e}"));
                }
                return Ok((
                    ws,
                    Reply {
                        epoch: String::new(),
                        offset: 0,
                        recovered: None,
                        publications: Vec::new(),
                        rest: None,
                        compressed: false,
                    },
                ));
            }
            SocketIo::ConnectError(e) => return Err(format!("connect error: {e}")),
            SocketIo::Close => return Err("closed by the server before the subscribe ack".into()),
            SocketIo::Ack(..) | SocketIo::Event(_) | SocketIo::Other => continue,
        };
        ws.send(Message::text(send))
            .await
            .map_err(|e| format!("send: {e}"))?;
    }
}

/// Receives until the connection ends; returns why to reconnect, or `None` to stop.
async fn receive(
    ctx: &Ctx,
    mut ws: Conn,
    channel: &str,
    acct: &mut SubAccount,
    ctl: &mut watch::Receiver<Control>,
    first: Option<String>,
    live_from: u64,
) -> Option<Why> {
    let pong = if ctx.p.pusher {
        wire::PUSHER_PONG
    } else if ctx.p.socketio {
        wire::SOCKETIO_PONG
    } else {
        "{}"
    };
    // What events name the channel: Pusher events carry the name without the app's prefix
    // (worked out once here, not once per event).
    let channel = if ctx.p.pusher {
        wire::pusher_channel(channel)
    } else {
        channel
    };
    // The reconnect hint of a `disconnect` push, if one came.
    let mut after_ms = None;
    if let Some(text) = first {
        if on_frame(ctx, &text, channel, acct, live_from, &mut after_ms) && !ws.pong(pong).await {
            ctx.shared().counters.server_closes += 1;
            return Some(Why::Broken);
        }
    }
    // One look at the control before waiting on its changes: `changed()` below only wakes for
    // later sends, so a Stop sent while this client was (re)connecting ends it here, or it would
    // wait for publications forever and its worker would never report.
    let current = *ctl.borrow_and_update();
    if current == Control::Stop {
        return None;
    }
    let jitter = ctx.scenario == Scenario::Jitter && current == Control::Run;
    let mut drop_at = jitter.then(|| {
        let (lo, hi) = (
            ctx.p.drop_every[0],
            ctx.p.drop_every[1].max(ctx.p.drop_every[0]),
        );
        Instant::now() + Duration::from_secs_f64(rand::rng().random_range(lo..=hi))
    });
    // A storm drop already under way (we reconnected before it fired) must not fire twice.
    let seen_drop = match current {
        Control::Drop(at) => Some(at),
        _ => None,
    };
    loop {
        tokio::select! {
            m = ws.recv() => {
                let text = match &m {
                    Got::Ws(msg) => match msg.as_text() {
                        Some(t) => t,
                        None => continue,
                    },
                    Got::Sse(line) => line.as_str(),
                    Got::Closed => {
                        ctx.shared().counters.server_closes += 1;
                        let drain_at = ctx.drain_at_ns.load(Relaxed);
                        if drain_at == 0 {
                            return Some(Why::Broken);
                        }
                        // Drain: do what the SDK does, wait the hint, then back with `since`.
                        let wait = Duration::from_millis(after_ms.unwrap_or(0));
                        if sleep_or_stop(wait, ctl).await {
                            return None;
                        }
                        return Some(Why::Storm(drain_at));
                    }
                };
                if on_frame(ctx, text, channel, acct, live_from, &mut after_ms) && !ws.pong(pong).await {
                    ctx.shared().counters.server_closes += 1;
                    return Some(Why::Broken);
                }
            }
            _ = tokio::time::sleep_until(drop_at.unwrap_or_else(Instant::now)), if drop_at.is_some() => {
                // Jitter: drop TCP without a close handshake, stay away, come back with `since`.
                drop(ws);
                ctx.shared().counters.client_drops += 1;
                let (lo, hi) = (ctx.p.offline[0], ctx.p.offline[1].max(ctx.p.offline[0]));
                let away = Duration::from_secs_f64(rand::rng().random_range(lo..=hi));
                if sleep_or_stop(away, ctl).await {
                    return None;
                }
                return Some(Why::Jitter);
            }
            r = ctl.changed() => {
                if r.is_err() {
                    return None;
                }
                let c = *ctl.borrow_and_update();
                match c {
                    Control::Stop => return None,
                    Control::Finish => drop_at = None,
                    Control::Drop(at) if seen_drop != Some(at) => {
                        // Storm: everyone drops at the same instant and comes straight back.
                        let wait = Duration::from_nanos(at.saturating_sub(now_ns()));
                        tokio::time::sleep(wait).await;
                        drop(ws);
                        ctx.shared().counters.client_drops += 1;
                        let j = ctx.p.reconnect_jitter_ms;
                        if j > 0 {
                            let d = Duration::from_millis(rand::rng().random_range(0..j));
                            if sleep_or_stop(d, ctl).await {
                                return None;
                            }
                        }
                        return Some(Why::Storm(at));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Handles one text frame; true if it held a ping to answer.
/// A `disconnect` push's reconnect hint goes into `after_ms`.
/// `channel`: as events name it (for `--pusher`, without the app prefix).
fn on_frame(
    ctx: &Ctx,
    text: &str,
    channel: &str,
    acct: &mut SubAccount,
    live_from: u64,
    after_ms: &mut Option<u64>,
) -> bool {
    if ctx.p.pusher {
        return on_pusher_message(ctx, text, channel, acct, live_from);
    }
    if ctx.p.centrifugo {
        return on_centrifugo_frame(ctx, text, channel, acct, live_from);
    }
    if ctx.p.socketio {
        return on_socketio_message(ctx, text, channel, acct, live_from);
    }
    let now = now_ns();
    let mut ping = false;
    let mut s = ctx.shared();
    for line in text.split('\n').filter(|l| !l.is_empty()) {
        let inc = match wire::parse(line) {
            Ok(i) => i,
            Err(_) => {
                s.counters.parse_errors += 1;
                continue;
            }
        };
        if let Some(p) = inc.publication {
            if p.channel.as_deref().is_some_and(|c| c != channel) {
                continue;
            }
            on_delivery(ctx, &mut s, acct, p.offset, now, &p.data, live_from);
        } else if let Some(d) = &inc.disconnect {
            s.counters.disconnect_pushes += 1;
            *after_ms = wire::reconnect_after_ms(d);
        } else if inc.unsub.is_some() {
            s.counters.unsub_pushes += 1;
        } else if inc.join.is_some() {
            s.counters.joins += 1;
        } else if inc.leave.is_some() {
            s.counters.leaves += 1;
        } else if inc.error.is_some() {
            s.counters.error_replies += 1;
        } else if inc.is_ping() {
            s.counters.pings += 1;
            ping = true;
        }
    }
    ping
}

/// `--pusher`: one message (Pusher sends one per WebSocket message); true if it was a ping.
/// `channel` is the Pusher channel name ([`wire::pusher_channel`]).
fn on_pusher_message(
    ctx: &Ctx,
    text: &str,
    channel: &str,
    acct: &mut SubAccount,
    live_from: u64,
) -> bool {
    let now = now_ns();
    let mut s = ctx.shared();
    let Ok(inc) = serde_json::from_str::<wire::PusherIncoming<'_>>(text) else {
        s.counters.parse_errors += 1;
        return false;
    };
    match inc.event.as_ref() {
        "pusher:ping" => {
            s.counters.pings += 1;
            return true;
        }
        "pusher:error" => s.counters.error_replies += 1,
        "herald:reset" => s.counters.unsub_pushes += 1,
        wire::PUSHER_EVENT => {
            if inc.channel.as_deref() != Some(channel) {
                return false;
            }
            let data = inc.payload();
            // A plain Pusher server (`--pusher-app`) sends no offsets: the payload's
            // sequence number stands for one.
            let offset = match (inc.herald_offset, ctx.p.plain_offsets()) {
                (Some(o), _) => o,
                (None, true) if data.t > 0 => wire::plain_offset(data.s, ctx.p.channels),
                _ => {
                    s.counters.parse_errors += 1;
                    return false;
                }
            };
            on_delivery(ctx, &mut s, acct, offset, now, &data, live_from);
        }
        _ => {}
    }
    false
}

/// `--socketio`: one message (one Engine.IO packet); true if it was a ping. Offsets are the
/// payload's sequence numbers ([`wire::plain_offset`]): Socket.IO numbers nothing.
fn on_socketio_message(
    ctx: &Ctx,
    text: &str,
    channel: &str,
    acct: &mut SubAccount,
    live_from: u64,
) -> bool {
    use wire::SocketIo;
    let now = now_ns();
    let mut s = ctx.shared();
    match wire::parse_socketio(text) {
        Ok(SocketIo::Ping) => {
            s.counters.pings += 1;
            return true;
        }
        Ok(SocketIo::Event(array)) => {
            let Some((ch, data)) = wire::socketio_publication(array) else {
                s.counters.parse_errors += 1;
                return false;
            };
            if ch != channel || data.t == 0 {
                return false;
            }
            let offset = wire::plain_offset(data.s, ctx.p.channels);
            on_delivery(ctx, &mut s, acct, offset, now, &data, live_from);
        }
        Ok(SocketIo::ConnectError(_)) => s.counters.error_replies += 1,
        Ok(SocketIo::Close) => s.counters.disconnect_pushes += 1,
        Ok(_) => {}
        Err(_) => s.counters.parse_errors += 1,
    }
    false
}

/// `--centrifugo`: one frame (one message a line); true if it held a `{}` ping to answer.
fn on_centrifugo_frame(
    ctx: &Ctx,
    text: &str,
    channel: &str,
    acct: &mut SubAccount,
    live_from: u64,
) -> bool {
    let now = now_ns();
    let mut ping = false;
    let mut s = ctx.shared();
    for line in text.split('\n').filter(|l| !l.is_empty()) {
        let inc = match wire::parse_centrifugo(line) {
            Ok(i) => i,
            Err(_) => {
                s.counters.parse_errors += 1;
                continue;
            }
        };
        if let Some(push) = inc.push {
            if push.channel.as_deref().is_some_and(|c| c != channel) {
                continue;
            }
            if let Some(p) = push.publication {
                // Without history (`--no-history`) Centrifugo sends no offsets.
                let offset = if ctx.p.no_history {
                    wire::plain_offset(p.data.s, ctx.p.channels)
                } else {
                    p.offset
                };
                on_delivery(ctx, &mut s, acct, offset, now, &p.data, live_from);
            } else if push.unsub.is_some() {
                s.counters.unsub_pushes += 1;
            } else if push.disconnect.is_some() {
                s.counters.disconnect_pushes += 1;
            } else if push.join.is_some() {
                s.counters.joins += 1;
            } else if push.leave.is_some() {
                s.counters.leaves += 1;
            }
        } else if inc.error.is_some() {
            s.counters.error_replies += 1;
        } else if inc.is_ping() {
            s.counters.pings += 1;
            ping = true;
        }
    }
    ping
}
