//! Delivery accounting against a fake Herald that misbehaves on purpose: it drops, duplicates and
//! reorders publications, and (in the recovery test) answers `since` correctly or off by one. The
//! workers run in-process, exactly as in a child process, over real sockets.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use herald_bench::accounting::Expected;
use herald_bench::params::{Params, Scenario, Shard};
use herald_bench::wire::make_data;
use herald_bench::worker::{self, now_ns, Command, Event, WorkerResult};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio_websockets::{Message, ServerBuilder};

#[derive(Parser)]
struct P {
    #[command(flatten)]
    p: Params,
}

fn params(url: &str, extra: &[&str]) -> Params {
    // The drain ends as soon as everything owed has arrived; it only runs out when something is
    // really missing, so a generous value costs nothing on a healthy run and absorbs a slow CI box.
    let mut args = vec!["t", "--ws", url, "--prefix", "t"];
    args.extend_from_slice(extra);
    if !extra.contains(&"--drain") {
        args.extend_from_slice(&["--drain", "3"]);
    }
    P::parse_from(args).p
}

fn pub_line(offset: u64) -> String {
    format!(
        "{{\"pub\":{{\"channel\":\"t0\",\"offset\":{offset},\"data\":{}}}}}",
        make_data(now_ns(), offset - 1, 64)
    )
}

/// Upper bound of every wait on the worker or the fake server: far above the few seconds a
/// healthy run takes, so only a stuck run fails, and the message names what it waited for.
const WAIT: Duration = Duration::from_secs(30);

/// `f`, or a failure naming `what` once [`WAIT`] passes.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
}

/// An in-process worker over real sockets, driven as the coordinator drives a child process.
struct Worker {
    cmds: mpsc::UnboundedSender<Command>,
    events: mpsc::UnboundedReceiver<Event>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Worker {
    /// Starts a worker holding `n` connections.
    fn start(p: Params, scenario: Scenario, n: usize) -> Worker {
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, events) = mpsc::unbounded_channel();
        let shard = Shard {
            index: 0,
            start: 0,
            end: n,
            source: "127.0.0.2".parse().unwrap(),
            t0_ns: now_ns(),
        };
        let task = tokio::spawn(worker::run(p, scenario, shard, cmd_rx, ev_tx));
        Worker { cmds, events, task }
    }

    /// The next event `pick` accepts, skipping the others, within [`WAIT`]. One deadline for the
    /// whole wait: a timeout per event would never fire, as `Progress` comes every second even
    /// from a worker that is stuck.
    async fn event<T>(&mut self, what: &str, mut pick: impl FnMut(Event) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => panic!("no {what} from the worker within {WAIT:?}"),
                Ok(None) => panic!("the worker ended before its {what}"),
                Ok(Some(ev)) => {
                    if let Some(t) = pick(ev) {
                        return t;
                    }
                }
            }
        }
    }

    /// Waits for `Ready` and checks that all `n` connections subscribed.
    async fn ready(&mut self, n: usize) {
        let got = self
            .event("Ready", |ev| match ev {
                Event::Ready {
                    connected, failed, ..
                } => Some((connected, failed)),
                _ => None,
            })
            .await;
        assert_eq!(got, (n as u64, 0), "(connected, failed)");
    }

    /// Tells the worker publishing is over (`expect` for channel `t0`) and returns its result.
    async fn finish(mut self, expect: Expected) -> WorkerResult {
        let mut m = BTreeMap::new();
        m.insert("t0".to_string(), expect);
        self.cmds.send(Command::Finish { expect: m }).unwrap();
        let r = self
            .event("result", |ev| match ev {
                Event::Result(r) => Some(r),
                _ => None,
            })
            .await;
        within("end of the worker task", self.task)
            .await
            .unwrap()
            .unwrap();
        *r
    }
}

/// When the test tells the worker to finish.
enum Finish {
    /// A fixed time after the worker is ready.
    After(Duration),
    /// Once the worker is ready, the history server publishes everything; then the worker's
    /// finish waits until the dropped clients came back and recovered what they are owed.
    Settled(History),
}

/// Runs one in-process worker over `n` connections and returns its result.
async fn run_worker(
    p: Params,
    scenario: Scenario,
    n: usize,
    before_finish: Finish,
    expect: Expected,
) -> WorkerResult {
    let mut w = Worker::start(p, scenario, n);
    w.ready(n).await;
    match before_finish {
        // The scenario runs for `d` (the point: it drops and reconnects meanwhile).
        Finish::After(d) => tokio::time::sleep(d).await,
        // No pause after the last publication: `finish` waits for every owed publication itself
        // (and gives up only after `--drain` seconds without progress).
        Finish::Settled(history) => history.publish_all().await,
    }
    w.finish(expect).await
}

/// A server that, on every connection, answers `connect` at offset 0 with offset 1 in the same
/// frame, then sends 2, 2, 4, 3, 5, 7, 8, then "9\n10" in one frame (6 never comes), plus a `{}`
/// ping.
async fn misbehaving_server(pongs: Arc<Mutex<u64>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let pongs = pongs.clone();
            tokio::spawn(async move {
                let (_, mut ws) = ServerBuilder::new().accept(s).await.unwrap();
                let first = ws.next().await.unwrap().unwrap();
                assert!(first.as_text().unwrap().contains("\"connect\""));
                // The reply and offset 1 share a frame, as a batching server sends them.
                ws.send(Message::text(format!(
                    "{}\n{}",
                    r#"{"id":1,"connect":{"client":"c","node":"n","ping_interval":25,"subs":{"t0":{"epoch":"E","offset":0,"recoverable":true}}}}"#,
                    pub_line(1)
                )))
                .await
                .unwrap();
                for o in [2, 2, 4, 3, 5, 7, 8] {
                    ws.send(Message::text(pub_line(o))).await.unwrap();
                }
                ws.send(Message::text(format!("{}\n{}", pub_line(9), pub_line(10))))
                    .await
                    .unwrap();
                ws.send(Message::text("{}".to_string())).await.unwrap();
                while let Some(Ok(m)) = ws.next().await {
                    if m.as_text() == Some("{}") {
                        *pongs.lock().unwrap() += 1;
                    }
                }
            });
        }
    });
    format!("ws://{addr}/ws")
}

#[tokio::test(flavor = "current_thread")]
async fn counts_drops_duplicates_reordering_and_gaps() {
    let pongs = Arc::new(Mutex::new(0));
    let url = misbehaving_server(pongs.clone()).await;
    let n = 3;
    let expect = Expected {
        epoch: "E".into(),
        first: 1,
        last: 10,
        count: 10,
    };
    let r = run_worker(
        params(&url, &["--drain", "1"]),
        Scenario::Broadcast,
        n,
        Finish::After(Duration::from_millis(300)),
        expect,
    )
    .await;
    let d = &r.delivery;
    assert_eq!(d.subscriptions, 3);
    assert_eq!(d.expected, 30);
    assert_eq!(d.delivered, 27, "offset 6 never arrives");
    assert_eq!(d.missing, 3);
    assert_eq!(d.subscriptions_missing, 3);
    assert_eq!(d.counts.duplicates, 3, "offset 2 twice per connection");
    assert_eq!(d.counts.out_of_order, 3, "3 after 4");
    assert_eq!(d.counts.gap_events, 6, "2→4 and 5→7 per connection");
    assert!((d.delivered_pct() - 90.0).abs() < 1e-9);
    assert_eq!(r.counters.deliveries, 30);
    assert_eq!(r.counters.pings, 3);
    assert_eq!(*pongs.lock().unwrap(), 3, "every ping answered with {{}}");
    let lat = herald_bench::hist::decode(&r.latency).unwrap();
    assert_eq!(lat.len(), 27, "latency recorded once per unique delivery");
}

/// A publication as a Centrifugo node pushes it (`--centrifugo`): the channel on the push.
fn centrifugo_push(offset: u64) -> String {
    format!(
        "{{\"push\":{{\"channel\":\"t0\",\"pub\":{{\"data\":{},\"offset\":{offset}}}}}}}",
        make_data(now_ns(), offset - 1, 64)
    )
}

/// [`misbehaving_server`] speaking Centrifugo's JSON protocol: it expects `connect` and
/// `subscribe` in the first frame, answers both (the subscribe reply at offset 0) with offset 1
/// in the same frame, then pushes 2, 2, 4, 3, 5, 7, 8, then "9\n10" in one frame (6 never
/// comes), a publication of another channel, and a `{}` ping.
async fn misbehaving_centrifugo(pongs: Arc<Mutex<u64>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let pongs = pongs.clone();
            tokio::spawn(async move {
                let (_, mut ws) = ServerBuilder::new().accept(s).await.unwrap();
                let first = ws.next().await.unwrap().unwrap();
                let cmds: Vec<serde_json::Value> = first
                    .as_text()
                    .unwrap()
                    .split('\n')
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                assert!(cmds[0]["connect"].is_object(), "{cmds:?}");
                assert_eq!(cmds[1]["subscribe"]["channel"], "t0", "{cmds:?}");
                ws.send(Message::text(format!(
                    "{}\n{}\n{}",
                    r#"{"id":1,"connect":{"client":"c","version":"6.9.1","ping":25,"pong":true}}"#,
                    r#"{"id":2,"subscribe":{"recoverable":true,"epoch":"E","positioned":true}}"#,
                    centrifugo_push(1)
                )))
                .await
                .unwrap();
                for o in [2, 2, 4, 3, 5, 7, 8] {
                    ws.send(Message::text(centrifugo_push(o))).await.unwrap();
                }
                let other = centrifugo_push(11).replace("\"t0\"", "\"t1\"");
                ws.send(Message::text(format!(
                    "{}\n{}\n{other}",
                    centrifugo_push(9),
                    centrifugo_push(10)
                )))
                .await
                .unwrap();
                ws.send(Message::text("{}".to_string())).await.unwrap();
                while let Some(Ok(m)) = ws.next().await {
                    if m.as_text() == Some("{}") {
                        *pongs.lock().unwrap() += 1;
                    }
                }
            });
        }
    });
    format!("ws://{addr}/connection/websocket")
}

#[tokio::test(flavor = "current_thread")]
async fn centrifugo_counts_drops_duplicates_reordering_and_gaps() {
    let pongs = Arc::new(Mutex::new(0));
    let url = misbehaving_centrifugo(pongs.clone()).await;
    let n = 3;
    let expect = Expected {
        epoch: "E".into(),
        first: 1,
        last: 10,
        count: 10,
    };
    let r = run_worker(
        params(&url, &["--drain", "1", "--centrifugo"]),
        Scenario::Broadcast,
        n,
        Finish::After(Duration::from_millis(300)),
        expect,
    )
    .await;
    let d = &r.delivery;
    assert_eq!(d.subscriptions, 3);
    assert_eq!(d.expected, 30);
    assert_eq!(d.delivered, 27, "offset 6 never arrives");
    assert_eq!(d.missing, 3);
    assert_eq!(d.counts.duplicates, 3, "offset 2 twice per connection");
    assert_eq!(d.counts.out_of_order, 3, "3 after 4");
    assert_eq!(d.counts.gap_events, 6, "2→4 and 5→7 per connection");
    assert_eq!(
        r.counters.deliveries, 30,
        "the other channel's push not counted"
    );
    assert_eq!(r.counters.parse_errors, 0);
    assert_eq!(r.counters.pings, 3);
    assert_eq!(*pongs.lock().unwrap(), 3, "every ping answered with {{}}");
    let lat = herald_bench::hist::decode(&r.latency).unwrap();
    assert_eq!(lat.len(), 27, "latency recorded once per unique delivery");
}

/// A fake server with history (see [`history_server`]).
struct History {
    url: String,
    /// Starts the publisher.
    start: tokio::sync::oneshot::Sender<()>,
    /// True once the last publication is out.
    published: tokio::sync::watch::Receiver<bool>,
    /// Publications resent by off-by-one recoveries (each one a duplicate for its client).
    resent: Arc<AtomicU64>,
}

impl History {
    /// Starts publishing and waits for the last publication. The test starts it once every
    /// client has subscribed: a publication made before a subscription is not owed to it, so an
    /// early start (the timer fires while a loaded machine is still connecting) would make the
    /// expected counts wrong.
    async fn publish_all(self) {
        let History {
            start,
            mut published,
            ..
        } = self;
        start.send(()).expect("the fake server's publisher is gone");
        within(
            "last publication of the fake server",
            published.wait_for(|done| *done),
        )
        .await
        .expect("the fake server's publisher ended before its last publication");
    }
}

/// A server with history: once started, it publishes offset 1, 2, 3 … every 10 ms to every live
/// connection and honours `since`; with `off_by_one` its recovery also resends the `since` offset
/// itself.
async fn history_server(off_by_one: bool, stop_at: u64) -> History {
    let (_never, drain) = tokio::sync::watch::channel(());
    history_server_draining(off_by_one, stop_at, drain).await
}

/// [`history_server`] that also drains like a node told SIGTERM each time `drain` changes: every
/// connection open then gets `disconnect` 4000 with `after_ms` in [0, 200) and a close; the
/// connections that come after are served as before (the restarted node).
async fn history_server_draining(
    off_by_one: bool,
    stop_at: u64,
    mut drain: tokio::sync::watch::Receiver<()>,
) -> History {
    let (start, start_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, published) = tokio::sync::watch::channel(false);
    let resent = Arc::new(AtomicU64::new(0));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let log: Arc<Mutex<(Vec<String>, broadcast::Sender<String>)>> =
        Arc::new(Mutex::new((Vec::new(), broadcast::channel(1024).0)));
    let plog = log.clone();
    tokio::spawn(async move {
        if start_rx.await.is_err() {
            return;
        }
        for o in 1..=stop_at {
            // Paced: publications keep coming while clients drop and come back.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut g = plog.lock().unwrap();
            let line = pub_line(o);
            g.0.push(line.clone());
            let _ = g.1.send(line);
        }
        let _ = done_tx.send(true);
    });
    let counted = resent.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let log = log.clone();
            let resent = counted.clone();
            // A drain already signalled is not this connection's.
            drain.borrow_and_update();
            let mut drain = drain.clone();
            tokio::spawn(async move {
                let Ok((_, mut ws)) = ServerBuilder::new().accept(s).await else {
                    return;
                };
                let Some(Ok(first)) = ws.next().await else {
                    return;
                };
                let cmd: serde_json::Value =
                    serde_json::from_str(first.as_text().unwrap()).unwrap();
                let since = cmd["connect"]["subs"]["t0"]["since"]["offset"].as_u64();
                // Reply and live subscription under one lock: nothing falls between them.
                let (reply, mut rx) = {
                    let g = log.lock().unwrap();
                    let newest = g.0.len() as u64;
                    let sub = match since {
                        Some(o) => {
                            let from = if off_by_one && o > 0 {
                                resent.fetch_add(1, Relaxed);
                                o - 1
                            } else {
                                o
                            } as usize;
                            let pubs: Vec<serde_json::Value> = g.0[from.min(g.0.len())..]
                                .iter()
                                .map(|l| {
                                    serde_json::from_str::<serde_json::Value>(l).unwrap()["pub"]
                                        .clone()
                                })
                                .collect();
                            serde_json::json!({"epoch":"E","offset":newest,"recoverable":true,"recovered":true,"publications":pubs})
                        }
                        None => serde_json::json!({"epoch":"E","offset":newest,"recoverable":true}),
                    };
                    let reply =
                        serde_json::json!({"id":1,"connect":{"client":"c","subs":{"t0":sub}}});
                    (reply.to_string(), g.1.subscribe())
                };
                if ws.send(Message::text(reply)).await.is_err() {
                    return;
                }
                loop {
                    tokio::select! {
                        Ok(()) = drain.changed() => {
                            let after_ms = rand::random_range(0..200u64);
                            let push = format!(r#"{{"disconnect":{{"code":4000,"reason":"shutdown","reconnect":true,"after_ms":{after_ms}}}}}"#);
                            let _ = ws.send(Message::text(push)).await;
                            let code = tokio_websockets::CloseCode::try_from(4000).unwrap();
                            let _ = ws.send(Message::close(Some(code), "shutdown")).await;
                            return;
                        }
                        m = ws.next() => if !matches!(m, Some(Ok(_))) { return },
                        p = rx.recv() => match p {
                            Ok(line) => if ws.send(Message::text(line)).await.is_err() { return },
                            Err(_) => return,
                        },
                    }
                }
            });
        }
    });
    History {
        url: format!("ws://{addr}/ws"),
        start,
        published,
        resent,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn jitter_clients_drop_and_recover_everything() {
    let history = history_server(false, 150).await;
    let p = params(
        &history.url,
        &["--drop-every", "0.2", "0.4", "--offline", "0.1", "0.2"],
    );
    let expect = Expected {
        epoch: "E".into(),
        first: 1,
        last: 150,
        count: 150,
    };
    let r = run_worker(p, Scenario::Jitter, 4, Finish::Settled(history), expect).await;
    let d = &r.delivery;
    assert!(
        r.counters.client_drops >= 4,
        "clients dropped: {:?}",
        r.counters
    );
    assert_eq!(
        r.counters.reconnects, r.counters.recovered,
        "{:?}",
        r.counters
    );
    assert_eq!(d.delivered, d.expected, "{d:?}");
    assert_eq!(
        (
            d.counts.duplicates,
            d.counts.gap_events,
            d.counts.out_of_order
        ),
        (0, 0, 0),
        "{d:?}"
    );
    assert!(herald_bench::hist::decode(&r.recovery).unwrap().len() >= 4);
}

#[tokio::test(flavor = "current_thread")]
async fn off_by_one_recovery_shows_up_as_duplicates() {
    let history = history_server(true, 120).await;
    let resent = history.resent.clone();
    let p = params(
        &history.url,
        &["--drop-every", "0.2", "0.3", "--offline", "0.1", "0.1"],
    );
    let expect = Expected {
        epoch: "E".into(),
        first: 1,
        last: 120,
        count: 120,
    };
    let r = run_worker(p, Scenario::Jitter, 2, Finish::Settled(history), expect).await;
    let resent = resent.load(Relaxed);
    assert!(r.counters.recovered >= 2, "{:?}", r.counters);
    assert!(resent >= 2, "off-by-one recoveries: {resent}");
    // Each resent `since` offset is one the client already had (a client that dropped before
    // its first publication recovers from 0 and gets nothing twice).
    assert_eq!(r.delivery.counts.duplicates, resent, "{:?}", r.delivery);
    assert_eq!(r.delivery.delivered, r.delivery.expected);
}

/// `drain`: clients told `disconnect` with `after_ms` come back with `since`, all of them, and
/// nothing is lost or repeated.
#[tokio::test(flavor = "current_thread")]
async fn drained_clients_wait_the_hint_and_recover_everything() {
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(());
    let history = history_server_draining(false, 150, drain_rx).await;
    let n = 4;
    let mut w = Worker::start(params(&history.url, &[]), Scenario::Drain, n);
    w.ready(n).await;
    let History {
        start,
        mut published,
        ..
    } = history;
    start.send(()).unwrap();
    // Paced: the drain comes while the fake server is publishing (150 over 1.5 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.cmds.send(Command::Drain { at_ns: now_ns() }).unwrap();
    drain_tx.send(()).unwrap();
    let (back, dropped) = w
        .event("StormDone", |ev| match ev {
            Event::StormDone { back, dropped, .. } => Some((back, dropped)),
            _ => None,
        })
        .await;
    assert_eq!((back, dropped), (n as u64, n as u64));
    within(
        "last publication of the fake server",
        published.wait_for(|done| *done),
    )
    .await
    .unwrap();
    // No pause here: `finish` waits for all 150 to arrive.
    let r = w
        .finish(Expected {
            epoch: "E".into(),
            first: 1,
            last: 150,
            count: 150,
        })
        .await;
    let c = &r.counters;
    assert_eq!(
        (c.disconnect_pushes, c.reconnects, c.recovered),
        (4, 4, 4),
        "{c:?}"
    );
    let d = &r.delivery;
    assert_eq!(d.delivered, d.expected, "{d:?}");
    assert_eq!((d.counts.duplicates, d.counts.gap_events), (0, 0), "{d:?}");
    assert_eq!(herald_bench::hist::decode(&r.storm).unwrap().len(), 4);
}

/// A server for the stop race: the first connection is answered at once; a reconnect's reply is
/// held until `release` turns true, and `waiting` says when one arrived. Nothing is published.
async fn held_reconnect_server() -> (
    String,
    mpsc::UnboundedReceiver<()>,
    tokio::sync::watch::Sender<bool>,
) {
    let (waiting_tx, waiting) = mpsc::unbounded_channel();
    let (release, release_rx) = tokio::sync::watch::channel(false);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        for nth in 0.. {
            let (s, _) = l.accept().await.unwrap();
            let waiting_tx = waiting_tx.clone();
            let mut release = release_rx.clone();
            tokio::spawn(async move {
                let Ok((_, mut ws)) = ServerBuilder::new().accept(s).await else {
                    return;
                };
                let Some(Ok(_connect)) = ws.next().await else {
                    return;
                };
                let mut sub = serde_json::json!({"epoch":"E","offset":0,"recoverable":true});
                if nth > 0 {
                    let _ = waiting_tx.send(());
                    if release.wait_for(|r| *r).await.is_err() {
                        return;
                    }
                    sub["recovered"] = true.into();
                }
                let reply = serde_json::json!({"id":1,"connect":{"client":"c","subs":{"t0":sub}}});
                if ws.send(Message::text(reply.to_string())).await.is_err() {
                    return;
                }
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    (format!("ws://{addr}/ws"), waiting, release)
}

/// A client whose reconnect is under way when the worker stops must stop too, not wait for
/// publications forever once its reply comes (the worker then never reported, and a test
/// waiting for its result hung).
#[tokio::test(flavor = "current_thread")]
async fn a_client_reconnecting_as_the_worker_stops_stops_too() {
    let (url, mut waiting, release) = held_reconnect_server().await;
    let p = params(
        &url,
        &["--drop-every", "0.05", "0.05", "--offline", "0", "0"],
    );
    let mut w = Worker::start(p, Scenario::Jitter, 1);
    w.ready(1).await;
    within("reconnect after the jitter drop", waiting.recv())
        .await
        .unwrap();
    // Nothing is owed, so the worker sends its clients Stop at once ...
    let mut m = BTreeMap::new();
    m.insert(
        "t0".to_string(),
        Expected {
            epoch: "E".into(),
            first: 1,
            last: 0,
            count: 0,
        },
    );
    w.cmds.send(Command::Finish { expect: m }).unwrap();
    // An order to set up, with nothing outside the worker to observe: its clients' Stop goes out
    // first (at once, nothing being owed); a late Stop would only make the check weaker.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ... and only then does the reconnect get its reply.
    release.send(true).unwrap();
    let r = w
        .event(
            "result (a client that reconnected as the worker stopped did not stop)",
            |ev| match ev {
                Event::Result(r) => Some(r),
                _ => None,
            },
        )
        .await;
    assert_eq!(
        (r.counters.client_drops, r.counters.reconnects),
        (1, 1),
        "{:?}",
        r.counters
    );
    within("end of the worker task", w.task)
        .await
        .unwrap()
        .unwrap();
}
