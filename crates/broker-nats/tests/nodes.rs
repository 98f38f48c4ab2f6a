//! Several NATS brokers (one per simulated node) on one real nats-server: targeted delivery,
//! one offset sequence under concurrent publishers, recovery across nodes, long histories,
//! presence expiry, and a NATS restart that loses nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_broker::conformance::{self, eventually, opts, since, unique, who, Recorder};
use herald_broker::{BrokerError, ControlMessage, HistoryQuery, SharedBroker};
use herald_broker_nats::NatsConfig;
use herald_testkit::nats::{copy_tree, NatsServer};

async fn node(cfg: &NatsConfig, name: &str) -> (SharedBroker, Arc<Recorder>) {
    let broker = herald_broker_nats::connect_with(cfg.clone(), name)
        .await
        .expect("connect");
    let rec = Arc::new(Recorder::default());
    broker.start(rec.clone()).await.expect("start");
    (broker, rec)
}

/// Subjects each named connection (`herald-<node>`) holds, from `/connz?subs=1`.
fn subscriptions_of(nats: &NatsServer, node: &str) -> Vec<String> {
    let body = nats.monitor_get("/connz?subs=1&limit=1024").expect("connz");
    let connz: serde_json::Value = serde_json::from_str(&body).expect("connz json");
    let name = format!("herald-{node}");
    connz["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| c["name"] == name.as_str())
        .flat_map(|c| {
            c["subscriptions_list"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_only_to_hosting_nodes_exactly_once() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, ra) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let (c, rc) = node(&cfg, "c").await;
    let ch = unique("room");
    b.subscribe(&ch).await.unwrap();
    c.subscribe(&ch).await.unwrap();

    let delivery = format!("herald.d.{ch}");
    assert!(subscriptions_of(&nats, "b").contains(&delivery));
    assert!(subscriptions_of(&nats, "c").contains(&delivery));
    assert!(!subscriptions_of(&nats, "a").contains(&delivery));
    for n in ["a", "b", "c"] {
        for s in subscriptions_of(&nats, n) {
            let wildcard = s.contains('*') || s.contains('>');
            assert!(
                !(wildcard && s.starts_with("herald.")),
                "{n} holds wildcard {s}"
            );
        }
    }

    for i in 0..100 {
        a.publish(&ch, Bytes::from(i.to_string()), None, &opts(200))
            .await
            .unwrap();
    }
    let all: Vec<u64> = (1..=100).collect();
    eventually("b and c get 100", || {
        rb.offsets(&ch).len() >= 100 && rc.offsets(&ch).len() >= 100
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rb.offsets(&ch), all, "b: in order, exactly once");
    assert_eq!(rc.offsets(&ch), all, "c: in order, exactly once");
    assert!(ra.offsets(&ch).is_empty(), "a hosts nothing");

    b.unsubscribe(&ch).await.unwrap();
    // UNSUB is sent without waiting for the server; it gets there in a moment.
    eventually("b's subscription gone", || {
        !subscriptions_of(&nats, "b").contains(&delivery)
    })
    .await;
    a.publish(&ch, Bytes::from_static(b"101"), None, &opts(200))
        .await
        .unwrap();
    eventually("c gets 101", || rc.offsets(&ch).len() == 101).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rb.offsets(&ch).len(), 100, "b unsubscribed");
    assert!(b
        .metrics_text()
        .contains("herald_broker_subscribed_channels 0\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_share_one_offset_sequence() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let (c, rc) = node(&cfg, "c").await;
    let ch = unique("race");
    c.subscribe(&ch).await.unwrap();

    let publisher = |broker: SharedBroker, ch: String| {
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            for i in 0..4 {
                let (broker, ch) = (broker.clone(), ch.clone());
                tasks.push(tokio::spawn(async move {
                    let mut positions = Vec::new();
                    for j in 0..50 {
                        let data = Bytes::from(format!("{}", i * 100 + j));
                        positions.push(broker.publish(&ch, data, None, &opts(500)).await.unwrap());
                    }
                    positions
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all
        })
    };
    let (pa, pb) = (
        publisher(a.clone(), ch.clone()),
        publisher(b.clone(), ch.clone()),
    );
    let mut positions = pa.await.unwrap();
    positions.extend(pb.await.unwrap());
    let epochs: BTreeSet<&str> = positions.iter().map(|p| p.epoch.as_str()).collect();
    assert_eq!(epochs.len(), 1, "one epoch");
    let offsets: BTreeSet<u64> = positions.iter().map(|p| p.offset).collect();
    assert_eq!(
        offsets,
        (1..=400).collect(),
        "every offset once, none skipped"
    );

    eventually("c gets 400", || rc.offsets(&ch).len() >= 400).await;
    assert_eq!(
        rc.offsets(&ch),
        (1..=400).collect::<Vec<_>>(),
        "in offset order"
    );
    let conflicts = a.metrics_text() + &b.metrics_text();
    assert!(conflicts.contains("herald_broker_publish_conflicts_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longer_history_than_the_stream_default_grows_the_stream() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let ch = unique("long");
    let o = opts(300);
    let mut last = None;
    for i in 1..=350 {
        last = Some(
            a.publish(&ch, Bytes::from(i.to_string()), None, &o)
                .await
                .unwrap(),
        );
    }
    let last = last.unwrap();
    let all = b
        .history(&ch, &HistoryQuery::default(), &o.stream)
        .await
        .unwrap();
    let got: Vec<u64> = all.publications.iter().map(|p| p.offset).collect();
    assert_eq!(got, (51..=350).collect::<Vec<_>>());
    let r = b
        .history(&ch, &since(&last.epoch, 100), &o.stream)
        .await
        .unwrap();
    assert!(r.continuous);
    assert_eq!(r.publications.len(), 250);
    assert!(
        !b.history(&ch, &since(&last.epoch, 40), &o.stream)
            .await
            .unwrap()
            .continuous
    );

    // A namespace with a short history on the same stream is trimmed to (about) its own size.
    let short = unique("short");
    let o5 = opts(5);
    for i in 1..=23 {
        a.publish(&short, Bytes::from(i.to_string()), None, &o5)
            .await
            .unwrap();
    }
    let r = b
        .history(&short, &HistoryQuery::default(), &o5.stream)
        .await
        .unwrap();
    assert_eq!(
        r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(),
        vec![19, 20, 21, 22, 23]
    );
    // In the stream: trimmed to 5 at offset 20 (in the background, so maybe a little later),
    // then up to 3 appended: 5 to 8 kept, not 23.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let stream = js.get_stream("HERALD").await.unwrap();
    let subject = format!("herald.h.{}", herald_broker_nats::names::escape(&short));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut counts = stream.info_with_subjects(&subject).await.unwrap();
        let mut kept = 0;
        while let Some(entry) = futures_util::StreamExt::next(&mut counts).await {
            kept += entry.unwrap().1;
        }
        if (5..=8).contains(&kept) {
            break;
        }
        assert!(Instant::now() < deadline, "background trim: {kept} kept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_without_history_still_number_publications() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let ch = unique("live");
    b.subscribe(&ch).await.unwrap();
    let p1 = a
        .publish(&ch, Bytes::from_static(b"1"), None, &opts(0))
        .await
        .unwrap();
    let p2 = b
        .publish(&ch, Bytes::from_static(b"2"), None, &opts(0))
        .await
        .unwrap();
    assert_eq!((p1.offset, p2.offset), (1, 2));
    assert_eq!(p1.epoch, p2.epoch);
    eventually("b gets both", || rb.offsets(&ch) == vec![1, 2]).await;
    let h = a
        .history(&ch, &since(&p1.epoch, 1), &opts(0).stream)
        .await
        .unwrap();
    assert_eq!(h.position, p2);
    assert!(
        !h.continuous && h.publications.is_empty(),
        "nothing kept to recover from"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_hold_across_nodes_and_odd_names_round_trip() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let ch = format!("ns:{}.x#alice,bob", unique("odd"));
    b.subscribe(&ch).await.unwrap();
    let mut o = opts(10);
    o.idempotency_key = Some("key-1".into());
    let first = a
        .publish(&ch, Bytes::from_static(b"{\"v\":1}"), Some(who("c1")), &o)
        .await
        .unwrap();
    let again = b
        .publish(&ch, Bytes::from_static(b"{\"v\":1}"), Some(who("c1")), &o)
        .await
        .unwrap();
    assert_eq!(first, again);
    eventually("b gets it", || rb.offsets(&ch) == vec![1]).await;
    let got = rb.publications.lock().unwrap()[0].clone();
    assert_eq!(got.0, ch, "channel name comes back intact");
    assert_eq!(got.2.info, Some(who("c1")));
    let h = b
        .history(&ch, &HistoryQuery::default(), &o.stream)
        .await
        .unwrap();
    assert_eq!(h.publications.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_changes_and_control_reach_the_right_nodes() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, ra) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let (_c, rc) = node(&cfg, "c").await;
    let ch = unique("joins");
    b.subscribe(&ch).await.unwrap();
    a.publish_presence_change(&ch, true, &who("x"))
        .await
        .unwrap();
    eventually("b sees the join", || {
        rb.presence_changes.lock().unwrap().len() == 1
    })
    .await;
    let (channel, joined, w) = rb.presence_changes.lock().unwrap()[0].clone();
    assert_eq!((channel.as_str(), joined, w), (ch.as_str(), true, who("x")));
    let msg = ControlMessage::Subscribe {
        user: "u".into(),
        channel: ch.clone(),
    };
    a.publish_control(&msg).await.unwrap();
    for rec in [&ra, &rb, &rc] {
        eventually("control everywhere", || {
            rec.controls.lock().unwrap().contains(&msg)
        })
        .await;
    }
    assert!(
        rc.presence_changes.lock().unwrap().is_empty(),
        "c hosts nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_spans_nodes_and_expires_with_a_crashed_node() {
    let nats = NatsServer::start();
    let cfg = NatsConfig {
        presence_ttl_s: 2,
        ..NatsConfig::with_url(&nats.url())
    };
    let (a, _) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let (c, _) = node(&cfg, "c").await;
    conformance::presence_spans_nodes_and_expires_with_a_crashed_node(
        a,
        b,
        c,
        Duration::from_secs(2),
    )
    .await;
}

/// A NATS that keeps everything across a restart, as its operator declared
/// (`synchronous_persistence`): nothing lost, epochs kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restart_fails_fast_then_loses_nothing() {
    let mut nats = NatsServer::start();
    let cfg = NatsConfig {
        synchronous_persistence: true,
        ..NatsConfig::with_url(&nats.url())
    };
    let (a, ra) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let ch = unique("restart");
    b.subscribe(&ch).await.unwrap();
    let o = opts(100);
    let mut last = None;
    for i in 1..=5 {
        last = Some(
            a.publish(&ch, Bytes::from(i.to_string()), None, &o)
                .await
                .unwrap(),
        );
    }
    let last = last.unwrap();
    eventually("b gets 5", || rb.offsets(&ch).len() == 5).await;
    let live = unique("live");
    let live_before = a
        .publish(&live, Bytes::from_static(b"1"), None, &opts(0))
        .await
        .unwrap();

    nats.stop();
    eventually("a sees the loss", || {
        a.metrics_text().contains("herald_broker_connected 0\n")
    })
    .await;
    let t = Instant::now();
    let err = a
        .publish(&ch, Bytes::from_static(b"x"), None, &o)
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "fails fast: {:?}",
        t.elapsed()
    );
    assert!(matches!(
        b.history(&ch, &HistoryQuery::default(), &o.stream).await,
        Err(BrokerError::Unavailable { .. })
    ));

    nats.start_again();
    eventually("both reconnect and ask for catch-up", || {
        *ra.reconnects.lock().unwrap() >= 1 && *rb.reconnects.lock().unwrap() >= 1
    })
    .await;
    let h = b
        .history(&ch, &since(&last.epoch, 0), &o.stream)
        .await
        .unwrap();
    assert!(h.continuous, "file storage kept history and epoch");
    assert_eq!(h.publications.len(), 5);
    let next = a
        .publish(&ch, Bytes::from_static(b"6"), None, &o)
        .await
        .unwrap();
    assert_eq!((next.epoch.as_str(), next.offset), (last.epoch.as_str(), 6));
    eventually("b re-subscribed and gets 6 live", || {
        rb.offsets(&ch) == vec![1, 2, 3, 4, 5, 6]
    })
    .await;
    // A channel without history keeps its epoch and offsets across the restart too.
    let live_after = a
        .publish(&live, Bytes::from_static(b"2"), None, &opts(0))
        .await
        .unwrap();
    assert_eq!(
        (live_after.epoch.as_str(), live_after.offset),
        (live_before.epoch.as_str(), 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_nats_fails_connect_quickly() {
    let port = herald_testkit::free_port();
    let cfg = NatsConfig {
        connect_timeout_ms: 500,
        ..NatsConfig::with_url(&format!("nats://127.0.0.1:{port}"))
    };
    let t = Instant::now();
    let err = herald_broker_nats::connect_with(cfg, "a")
        .await
        .err()
        .expect("no server there");
    assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_publications_are_stored_together_and_read_back_one_by_one() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let ch = unique("burst");
    b.subscribe(&ch).await.unwrap();
    let o = opts(1000);
    let mut tasks = Vec::new();
    for i in 0..500u32 {
        let (a, ch, o) = (a.clone(), ch.clone(), o.clone());
        let info = (i % 3 == 0).then(|| who(&format!("c{i}")));
        tasks.push(tokio::spawn(async move {
            let data = Bytes::from(format!("{{\"i\":{i}}}"));
            (
                data.clone(),
                info.clone(),
                a.publish(&ch, data, info, &o).await.unwrap(),
            )
        }));
    }
    let mut sent = Vec::new();
    for t in tasks {
        sent.push(t.await.unwrap());
    }
    let offsets: BTreeSet<u64> = sent.iter().map(|(_, _, p)| p.offset).collect();
    assert_eq!(offsets, (1..=500).collect(), "every offset once");
    let text = a.metrics_text();
    let stored: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("herald_broker_nats_stored_messages_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        stored < 500.0,
        "queued publications went together: {stored} messages"
    );

    eventually("b gets 500", || rb.offsets(&ch).len() >= 500).await;
    assert_eq!(
        rb.offsets(&ch),
        (1..=500).collect::<Vec<_>>(),
        "in order, once"
    );
    let epoch = sent[0].2.epoch.clone();
    for (many, query) in [
        (500, since(&epoch, 0)),
        (5, since(&epoch, 495)),
        (30, since(&epoch, 470)),
    ] {
        let h = b.history(&ch, &query, &o.stream).await.unwrap();
        assert!(h.continuous);
        assert_eq!(h.publications.len(), many);
    }
    let h = b.history(&ch, &since(&epoch, 0), &o.stream).await.unwrap();
    for (data, info, position) in &sent {
        let p = &h.publications[position.offset as usize - 1];
        assert_eq!(
            (&p.data, &p.info),
            (data, info),
            "offset {} holds its own data",
            position.offset
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_stream_starts_a_new_epoch() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    let ch = unique("reset");
    b.subscribe(&ch).await.unwrap();
    let o = opts(10);
    let before = a
        .publish(&ch, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    a.publish(&ch, Bytes::from_static(b"2"), None, &o)
        .await
        .unwrap();

    // An operator deletes the stream (history lost); the next publish recreates it.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.delete_stream("HERALD").await.unwrap();
    let after = a
        .publish(&ch, Bytes::from_static(b"3"), None, &o)
        .await
        .unwrap();
    assert_ne!(after.epoch, before.epoch, "new epoch");
    assert_eq!(after.offset, 1);
    let h = b
        .history(&ch, &since(&before.epoch, 2), &o.stream)
        .await
        .unwrap();
    assert!(!h.continuous, "the old position means nothing any more");
    eventually("b gets the new epoch's first", || {
        rb.publications
            .lock()
            .unwrap()
            .iter()
            .any(|(_, e, p)| *e == after.epoch && p.offset == 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_behind_a_nodes_back_does_not_fool_its_cached_tail() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let (b, _) = node(&cfg, "b").await;
    let ch = unique("behind");
    let o = opts(10);
    // a caches the channel's tail: sequence 1 of the stream.
    let first = a
        .publish(&ch, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    assert_eq!(first.offset, 1);
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.delete_stream("HERALD").await.unwrap();
    // b recreates it and stores the channel's new first publication, again at sequence 1: the
    // very sequence a expects.
    let fresh = b
        .publish(&ch, Bytes::from_static(b"2"), None, &o)
        .await
        .unwrap();
    assert_eq!(fresh.offset, 1);
    assert_ne!(fresh.epoch, first.epoch);
    // a notices the recreation within a few seconds and numbers after b's publication.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let next = a
        .publish(&ch, Bytes::from_static(b"3"), None, &o)
        .await
        .unwrap();
    assert_eq!(
        (next.epoch.as_str(), next.offset),
        (fresh.epoch.as_str(), 2)
    );
}

/// Publish, retrying while the broker reconnects.
async fn publish_when_back(
    broker: &SharedBroker,
    ch: &str,
    data: &str,
    o: &herald_broker::PublishOptions,
) -> herald_protocol::StreamPosition {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match broker
            .publish(ch, Bytes::from(data.to_owned()), None, o)
            .await
        {
            Ok(position) => return position,
            Err(err) => {
                assert!(Instant::now() < deadline, "NATS never came back: {err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// NATS comes back *behind*: its file store is put back to an older copy (as after a crash of
/// an R1 server whose last writes never reached the disk), so every channel still holds its
/// epoch but an older top offset. Offsets must not be handed out again in that epoch: a node
/// that saw the newer offsets (by publishing them, or by receiving them) starts a new epoch.
///
/// This is the watermark's own test, so the restart in the middle must keep epochs: the operator
/// declares `synchronous_persistence` (without it, the restart alone starts new epochs: see
/// `a_restart_starts_new_epochs_unless_persistence_is_declared_synchronous`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restored_from_an_older_store_starts_a_new_epoch() {
    let mut nats = NatsServer::start();
    let cfg = NatsConfig {
        synchronous_persistence: true,
        ..NatsConfig::with_url(&nats.url())
    };
    let (a, _) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    // a publishes to all three; b only receives `read`'s publications.
    let (hist, live, read) = (unique("rb_hist"), unique("rb_live"), unique("rb_read"));
    let (o, o0) = (opts(10), opts(0));
    let channels = [(&hist, &o), (&live, &o0), (&read, &o)];
    b.subscribe(&read).await.unwrap();
    let mut epochs = Vec::new();
    for i in 1..=3 {
        epochs.clear();
        for (ch, o) in channels {
            let p = a.publish(ch, Bytes::from(i.to_string()), None, o).await;
            epochs.push(p.unwrap().epoch);
        }
    }

    // A consistent copy of the store at offset 3: taken while the server is stopped.
    nats.stop();
    let store = nats.store_dir().to_path_buf();
    let saved = store.with_extension("older");
    let _ = std::fs::remove_dir_all(&saved);
    copy_tree(&store, &saved);
    nats.start_again();
    eventually("b re-subscribed", || *rb.reconnects.lock().unwrap() >= 1).await;
    for i in 4..=6 {
        for ((ch, o), epoch) in channels.iter().zip(&epochs) {
            let p = publish_when_back(&a, ch, &i.to_string(), o).await;
            assert_eq!((&p.epoch, p.offset), (epoch, i), "{ch}");
        }
    }
    eventually("b received 1..6", || {
        rb.offsets(&read) == (1..=6).collect::<Vec<_>>()
    })
    .await;

    // Crash, and come back with the older store: every channel's top is offset 3 again.
    nats.kill();
    std::fs::remove_dir_all(&store).unwrap();
    copy_tree(&saved, &store);
    std::fs::remove_dir_all(&saved).unwrap();
    nats.start_again();
    eventually("b reconnected", || *rb.reconnects.lock().unwrap() >= 2).await;

    // b received offset 6 of `read`: its history read finds the stream behind and starts over.
    let old = &epochs[2];
    let h = loop {
        match b.history(&read, &since(old, 6), &o.stream).await {
            Ok(h) => break h,
            Err(err) => {
                debug_assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_ne!(&h.position.epoch, old, "offsets would be reused: {h:?}");
    assert_eq!(h.position.offset, 0, "{h:?}");
    assert!(!h.continuous && h.publications.is_empty(), "{h:?}");
    let next = publish_when_back(&a, &read, "7", &o).await;
    assert_eq!((&next.epoch, next.offset), (&h.position.epoch, 1));
    eventually("b receives the new epoch", || {
        rb.publications
            .lock()
            .unwrap()
            .iter()
            .any(|(c, e, p)| *c == read && *e == next.epoch && p.offset == 1)
    })
    .await;

    // a published offset 6 of the others: its next publications start a new epoch at 1.
    for ((ch, o), epoch) in channels[..2].iter().zip(&epochs) {
        let p = publish_when_back(&a, ch, "7", o).await;
        assert_ne!(&p.epoch, epoch, "{ch}: offsets reused in the old epoch");
        assert_eq!(p.offset, 1, "{ch}");
        let p = publish_when_back(&a, ch, "8", o).await;
        assert_eq!(p.offset, 2, "{ch}");
    }
    // Another node that saw none of it follows the new epoch.
    let h = b
        .history(&hist, &since(&epochs[0], 6), &o.stream)
        .await
        .unwrap();
    assert!(!h.continuous);
    assert_eq!(h.position.offset, 2);
    assert_ne!(&h.position.epoch, &epochs[0]);
}

/// An idempotency key with CR/LF cannot be a NATS header value: the publication fails, and the
/// channel keeps working on that node (its publisher task neither panics nor stays marked busy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_with_a_line_break_fails_alone() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let ch = unique("crlf");
    let first = a
        .publish(&ch, Bytes::from_static(b"1"), None, &opts(10))
        .await
        .unwrap();
    for key in ["a\r\nb", "a\nb", "a\rb"] {
        let mut o = opts(10);
        o.idempotency_key = Some(key.into());
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            a.publish(&ch, Bytes::from_static(b"x"), None, &o),
        )
        .await
        .expect("answered")
        .unwrap_err();
        assert!(
            matches!(err, BrokerError::Internal { .. }),
            "{key:?}: {err:?}"
        );
    }
    let next = tokio::time::timeout(
        Duration::from_secs(5),
        a.publish(&ch, Bytes::from_static(b"2"), None, &opts(10)),
    )
    .await
    .expect("the channel's publisher is not stuck")
    .unwrap();
    assert_eq!((&next.epoch, next.offset), (&first.epoch, 2));
}

/// Reading a channel nobody published to stores an epoch marker; the node deletes it once it
/// outlived `empty_ttl` without a read (reads past half the TTL store a fresh copy), so that
/// clients reading fresh names cannot make NATS hold a marker each for the stream's `max_age`.
/// A channel that was published to keeps its epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_only_read_keeps_its_epoch_for_the_empty_ttl() {
    let nats = NatsServer::start();
    let (a, _) = node(&NatsConfig::with_url(&nats.url()), "a").await;
    let mut o = opts(10);
    o.stream.empty_ttl = Duration::from_secs(2);
    let top = HistoryQuery {
        since: None,
        limit: Some(0),
    };
    let quiet = unique("quiet");
    let busy = unique("busy");
    let first = a.history(&quiet, &top, &o.stream).await.unwrap().position;
    a.history(&busy, &top, &o.stream).await.unwrap();
    let published = a
        .publish(&busy, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    // Reads keep it (the second one, past half the TTL, replaces the marker with a fresh copy).
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let again = a.history(&quiet, &top, &o.stream).await.unwrap().position;
        assert_eq!(again, first, "read within the TTL of the last read");
    }
    // Nobody reads it for longer than the TTL: deleted, and the next read starts a new epoch.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let fresh = a.history(&quiet, &top, &o.stream).await.unwrap().position;
    assert_ne!(fresh.epoch, first.epoch, "the marker was kept");
    assert_eq!(fresh.offset, 0);
    let busy_now = a.history(&busy, &top, &o.stream).await.unwrap().position;
    assert_eq!(busy_now, published, "a published channel keeps its epoch");
    let text = a.metrics_text();
    let deleted: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("herald_broker_nats_markers_deleted_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no marker metric in\n{text}"));
    assert!(deleted >= 2, "refreshed copy and expired marker: {deleted}");
}

/// Issue 29 item 5, the cost side: by default every NATS restart (here a clean one, losing
/// nothing) starts every channel over in a new epoch, with or without history, for a node that
/// saw the channel and for one that never did, because the boot id lives in a memory stream.
/// The history is still there, but nobody may continue from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_starts_new_epochs_unless_persistence_is_declared_synchronous() {
    let mut nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, ra) = node(&cfg, "a").await;
    let (hist, live) = (unique("boot_hist"), unique("boot_live"));
    let (o, o0) = (opts(10), opts(0));
    let mut before = Vec::new();
    for (ch, o) in [(&hist, &o), (&live, &o0)] {
        for i in 1..=3 {
            before.push(
                a.publish(ch, Bytes::from(i.to_string()), None, o)
                    .await
                    .unwrap(),
            );
        }
    }
    nats.restart();
    eventually("a reconnected", || *ra.reconnects.lock().unwrap() >= 1).await;
    // A node that connects only now never saw either channel.
    let (c, _) = node(&cfg, "c").await;
    let h = loop {
        match c
            .history(&hist, &since(&before[2].epoch, 3), &o.stream)
            .await
        {
            Ok(h) => break h,
            Err(err) => {
                assert!(matches!(err, BrokerError::Unavailable { .. }), "{err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_ne!(
        h.position.epoch, before[2].epoch,
        "continued after a restart: {h:?}"
    );
    assert!(!h.continuous && h.publications.is_empty(), "{h:?}");
    let next = publish_when_back(&a, &hist, "4", &o).await;
    assert_eq!((&next.epoch, next.offset), (&h.position.epoch, 1));
    let next = publish_when_back(&c, &live, "4", &o0).await;
    assert_ne!(
        next.epoch, before[5].epoch,
        "continued after a restart: {next:?}"
    );
    assert_eq!(next.offset, 1);
}

/// `subscribe` returns once the server has the subscription: a core NATS message another node
/// sends right after is delivered (a flush alone only writes the SUB to the socket, and the
/// server may handle the other connection's message first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_is_in_effect_on_the_server_when_subscribe_returns() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _ra) = node(&cfg, "a").await;
    let (b, rb) = node(&cfg, "b").await;
    const CHANNELS: usize = 300;
    let mut channels = BTreeSet::new();
    for i in 0..CHANNELS {
        let ch = unique(&format!("sync{i}"));
        b.subscribe(&ch).await.unwrap();
        a.publish_presence_change(&ch, true, &who("x"))
            .await
            .unwrap();
        channels.insert(ch);
    }
    let seen = || {
        rb.presence_changes
            .lock()
            .unwrap()
            .iter()
            .map(|(c, _, _)| c.clone())
            .collect::<BTreeSet<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen().len() < CHANNELS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let missed: Vec<_> = channels.difference(&seen()).cloned().collect();
    assert!(
        missed.is_empty(),
        "b missed joins on {} channels: {missed:?}",
        missed.len()
    );
}

/// The channels with history, page by page: every page together gives exactly the channels whose
/// newest message holds publications (names with escaped characters come back as published),
/// with no subscriber anywhere; a channel whose history was removed (its `Herald-Count: 0`
/// position marker is all the subject holds) or that only has an epoch marker (read, never
/// published to) is not listed, one published to again after its removal is; a cursor no page
/// gave is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_history_channels_page_by_page() {
    let nats = NatsServer::start();
    let cfg = NatsConfig::with_url(&nats.url());
    let (a, _) = node(&cfg, "a").await;
    let channels: Vec<String> = (0..40)
        .map(|i| unique(&format!("chat:room.{i} é")))
        .collect();
    let data = Bytes::from_static(b"{}");
    for ch in &channels {
        a.publish(ch, data.clone(), None, &opts(5)).await.unwrap();
    }
    a.publish(&channels[1], data.clone(), None, &opts(5))
        .await
        .unwrap();
    // Removed: not listed. Removed, then published to again: listed.
    assert!(a.remove_history(&channels[0]).await.unwrap());
    assert!(a.remove_history(&channels[1]).await.unwrap());
    a.publish(&channels[1], data.clone(), None, &opts(5))
        .await
        .unwrap();
    // Read but never published to (an epoch marker), and a channel without history: not listed.
    let read_only = unique("read_only");
    let empty = a
        .history(&read_only, &HistoryQuery::default(), &opts(5).stream)
        .await
        .unwrap();
    assert!(empty.publications.is_empty());
    a.publish(&unique("live"), data.clone(), None, &opts(0))
        .await
        .unwrap();

    let mut listed = BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 100, "the listing did not end within 100 pages");
        let page = a
            .history_channels(cursor.as_deref(), 7)
            .await
            .expect("a page")
            .expect("the NATS broker lists channels with history");
        assert!(page.channels.len() <= 7, "{} names", page.channels.len());
        listed.extend(page.channels);
        match page.cursor {
            None => break,
            next => cursor = next,
        }
    }
    let expected: BTreeSet<String> = channels[1..].iter().cloned().collect();
    assert_eq!(listed, expected, "exactly the channels with history");
    assert!(pages >= 6, "{pages} pages of at most 7 for 40 subjects");

    for bad in ["x", "1", "x:abc", "0:a.b", "0:a=4", "-1:"] {
        let err = a.history_channels(Some(bad), 7).await.unwrap_err();
        assert!(
            err.to_string().contains("not a history listing cursor"),
            "{bad}: {err}"
        );
    }
}
