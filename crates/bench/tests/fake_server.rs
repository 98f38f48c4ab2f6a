//! Delivery accounting against a fake Herald that misbehaves on purpose: it drops, duplicates and
//! reorders publications, and (in the recovery test) answers `since` correctly or off by one. The
//! workers run in-process, exactly as in a child process, over real sockets.

use std::collections::BTreeMap;
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

/// When the test tells the worker to finish.
enum Finish {
    /// A fixed time after the worker is ready.
    After(Duration),
    /// After the fake server published its last publication, and a moment more.
    Settled(tokio::sync::watch::Receiver<bool>),
}

/// Runs one in-process worker over `n` connections and returns its result.
async fn run_worker(
    p: Params,
    scenario: Scenario,
    n: usize,
    before_finish: Finish,
    expect: Expected,
) -> WorkerResult {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let shard = Shard {
        index: 0,
        start: 0,
        end: n,
        source: "127.0.0.2".parse().unwrap(),
        t0_ns: now_ns(),
    };
    let w = tokio::spawn(worker::run(p, scenario, shard, cmd_rx, ev_tx));
    let mut finish_sent = false;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(20), ev_rx.recv())
            .await
            .expect("worker stalled");
        match ev.expect("worker ended without a result") {
            Event::Ready {
                connected, failed, ..
            } => {
                assert_eq!((connected, failed), (n as u64, 0));
                if !finish_sent {
                    finish_sent = true;
                    match &before_finish {
                        Finish::After(d) => tokio::time::sleep(*d).await,
                        Finish::Settled(published) => {
                            // The fake server's timer runs late on a busy machine: wait for its
                            // last publication, then for dropped clients to come back and recover.
                            let mut published = published.clone();
                            let _ = published.wait_for(|done| *done).await;
                            tokio::time::sleep(Duration::from_millis(800)).await;
                        }
                    }
                    let mut m = BTreeMap::new();
                    m.insert("t0".to_string(), expect.clone());
                    cmd_tx.send(Command::Finish { expect: m }).unwrap();
                }
            }
            Event::Result(r) => {
                w.await.unwrap().unwrap();
                return *r;
            }
            _ => {}
        }
    }
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

/// A server with history: it publishes offset 1, 2, 3 … every 10 ms to every live connection and
/// honours `since`; with `off_by_one` its recovery also resends the `since` offset itself.
async fn history_server(
    off_by_one: bool,
    stop_at: u64,
) -> (String, tokio::sync::watch::Receiver<bool>) {
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
) -> (String, tokio::sync::watch::Receiver<bool>) {
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let log: Arc<Mutex<(Vec<String>, broadcast::Sender<String>)>> =
        Arc::new(Mutex::new((Vec::new(), broadcast::channel(1024).0)));
    let plog = log.clone();
    tokio::spawn(async move {
        for o in 1..=stop_at {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut g = plog.lock().unwrap();
            let line = pub_line(o);
            g.0.push(line.clone());
            let _ = g.1.send(line);
        }
        let _ = done_tx.send(true);
    });
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let log = log.clone();
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
                            let from = if off_by_one { o.saturating_sub(1) } else { o } as usize;
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
    (format!("ws://{addr}/ws"), done_rx)
}

#[tokio::test(flavor = "current_thread")]
async fn jitter_clients_drop_and_recover_everything() {
    let (url, published) = history_server(false, 150).await;
    let p = params(
        &url,
        &["--drop-every", "0.2", "0.4", "--offline", "0.1", "0.2"],
    );
    let expect = Expected {
        epoch: "E".into(),
        first: 1,
        last: 150,
        count: 150,
    };
    let r = run_worker(p, Scenario::Jitter, 4, Finish::Settled(published), expect).await;
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
    let (url, published) = history_server(true, 120).await;
    let p = params(
        &url,
        &["--drop-every", "0.2", "0.3", "--offline", "0.1", "0.1"],
    );
    let expect = Expected {
        epoch: "E".into(),
        first: 1,
        last: 120,
        count: 120,
    };
    let r = run_worker(p, Scenario::Jitter, 2, Finish::Settled(published), expect).await;
    assert!(r.counters.recovered >= 2);
    assert_eq!(
        r.delivery.counts.duplicates, r.counters.recovered,
        "{:?}",
        r.delivery
    );
    assert_eq!(r.delivery.delivered, r.delivery.expected);
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("worker stalled")
        .expect("worker ended")
}

/// `drain`: clients told `disconnect` with `after_ms` come back with `since`, all of them, and
/// nothing is lost or repeated.
#[tokio::test(flavor = "current_thread")]
async fn drained_clients_wait_the_hint_and_recover_everything() {
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(());
    let (url, mut published) = history_server_draining(false, 150, drain_rx).await;
    let p = params(&url, &[]);
    let n = 4;
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let shard = Shard {
        index: 0,
        start: 0,
        end: n,
        source: "127.0.0.2".parse().unwrap(),
        t0_ns: now_ns(),
    };
    let w = tokio::spawn(worker::run(p, Scenario::Drain, shard, cmd_rx, ev_tx));
    while !matches!(next(&mut ev_rx).await, Event::Ready { .. }) {}
    tokio::time::sleep(Duration::from_millis(300)).await;
    cmd_tx.send(Command::Drain { at_ns: now_ns() }).unwrap();
    drain_tx.send(()).unwrap();
    let (back, dropped) = loop {
        if let Event::StormDone { back, dropped, .. } = next(&mut ev_rx).await {
            break (back, dropped);
        }
    };
    assert_eq!((back, dropped), (n as u64, n as u64));
    let _ = published.wait_for(|done| *done).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut m = BTreeMap::new();
    m.insert(
        "t0".to_string(),
        Expected {
            epoch: "E".into(),
            first: 1,
            last: 150,
            count: 150,
        },
    );
    cmd_tx.send(Command::Finish { expect: m }).unwrap();
    let r = loop {
        if let Event::Result(r) = next(&mut ev_rx).await {
            break r;
        }
    };
    w.await.unwrap().unwrap();
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
