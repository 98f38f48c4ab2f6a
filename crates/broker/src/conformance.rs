//! One test suite, written against the [`Broker`] trait, that every broker implementation runs
//! from its own `tests/` (the memory broker from this crate's tests).
//!
//! ```ignore
//! #[tokio::test]
//! async fn conformance() {
//!     herald_broker::conformance::run(|| async { Arc::new(MyBroker::connect(..).await) as SharedBroker }).await;
//! }
//! ```
//! Channel names carry a random suffix so that brokers sharing a server do not see each other's
//! leftovers.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use herald_protocol::{ClientInfo, Publication, StreamPosition};

use crate::{
    BrokerHandler, ControlMessage, HistoryQuery, PresencePage, PublishOptions, PublishTarget,
    SharedBroker, StreamOptions,
};

/// Everything a handler received, for assertions.
#[derive(Default)]
pub struct Recorder {
    /// (channel, epoch, publication) in arrival order.
    pub publications: Mutex<Vec<(String, String, Publication)>>,
    /// (channel, joined, who).
    pub presence_changes: Mutex<Vec<(String, bool, ClientInfo)>>,
    /// Control messages.
    pub controls: Mutex<Vec<ControlMessage>>,
    /// How many times `on_reconnected` was called.
    pub reconnects: Mutex<u32>,
}

impl BrokerHandler for Recorder {
    fn on_publication(&self, channel: &str, epoch: &str, publication: Publication) {
        let mut p = self.publications.lock().unwrap();
        p.push((channel.to_owned(), epoch.to_owned(), publication));
    }
    fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo) {
        let mut p = self.presence_changes.lock().unwrap();
        p.push((channel.to_owned(), joined, who));
    }
    fn on_control(&self, message: ControlMessage) {
        self.controls.lock().unwrap().push(message);
    }
    fn on_reconnected(&self) {
        *self.reconnects.lock().unwrap() += 1;
    }
}

impl Recorder {
    /// Offsets received on a channel, in arrival order.
    pub fn offsets(&self, channel: &str) -> Vec<u64> {
        let p = self.publications.lock().unwrap();
        p.iter()
            .filter(|(c, _, _)| c == channel)
            .map(|(_, _, p)| p.offset)
            .collect()
    }
}

/// Wait until `check` holds, up to 5 s (brokers with a network hop deliver asynchronously).
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A channel (or user) name with a random suffix, so that tests sharing a broker server do not
/// see each other's leftovers.
pub fn unique(name: &str) -> String {
    format!("conf_{name}_{:08x}", rand::random::<u32>())
}

/// Publish options keeping `size` publications of history.
pub fn opts(size: usize) -> PublishOptions {
    PublishOptions {
        stream: StreamOptions {
            history_size: size,
            ..StreamOptions::default()
        },
        idempotency_key: None,
        traceparent: None,
        tags: Default::default(),
        skip_history: false,
    }
}

/// A history query for everything after `offset` in `epoch`.
pub fn since(epoch: &str, offset: u64) -> HistoryQuery {
    HistoryQuery {
        since: Some(StreamPosition {
            epoch: epoch.to_owned(),
            offset,
        }),
        limit: None,
    }
}

/// A client `client` of user `u-<client>`, without info.
pub fn who(client: &str) -> ClientInfo {
    ClientInfo {
        user: format!("u-{client}"),
        client: client.to_owned(),
        info: None,
    }
}

/// Run the whole suite. `make` returns a new, started-nowhere broker each time.
pub async fn run<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = SharedBroker>,
{
    publish_assigns_consecutive_offsets(make().await).await;
    subscribed_node_receives_in_order(make().await).await;
    history_and_recovery(make().await).await;
    idempotent_publish(make().await).await;
    publish_many_matches_one_by_one(make().await).await;
    positions_match_history_reads(make().await).await;
    presence_add_list_remove(make().await).await;
    presence_counts_and_pages(make().await).await;
    control_reaches_every_node(make().await).await;
}

/// The scenarios that need several nodes on one broker server (Redis, Redis Cluster, NATS): `make`
/// returns a new broker on the same server each time, as a node would connect.
pub async fn run_multi_node<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = SharedBroker>,
{
    recovery_across_nodes(make().await, make().await).await;
    history_ttl_counts_old_entries_as_gone(make().await).await;
}

/// Start `broker` with a fresh [`Recorder`] as its handler.
pub async fn started(broker: &SharedBroker) -> Arc<Recorder> {
    let rec = Arc::new(Recorder::default());
    broker.start(rec.clone()).await.expect("start");
    rec
}

/// `positions` answers, in the order asked, what `history` with `limit: Some(0)` reads for each
/// channel: channels with 1 to 3 publications, channels never published to (a read starts them),
/// one channel asked twice.
pub async fn positions_match_history_reads(broker: SharedBroker) {
    let _rec = started(&broker).await;
    let base = unique("pos");
    let o = opts(10);
    let channels: Vec<String> = (0..40).map(|i| format!("{base}_{i}")).collect();
    for (i, ch) in channels.iter().enumerate() {
        for j in 0..i % 4 {
            let data = Bytes::from(format!("{j}"));
            broker.publish(ch, data, None, &o).await.unwrap();
        }
    }
    let mut asked: Vec<(Arc<str>, StreamOptions)> = channels
        .iter()
        .map(|c| (Arc::from(c.as_str()), o.stream.clone()))
        .collect();
    asked.push(asked[5].clone());
    asked.reverse();
    let got = broker.positions(&asked).await;
    assert_eq!(got.len(), asked.len());
    for ((ch, stream), got) in asked.iter().zip(got) {
        let got = got.unwrap_or_else(|e| panic!("{ch}: {e}"));
        let read = broker.history(ch, &HistoryQuery::POSITION, stream).await;
        let want = read.unwrap().position;
        assert_eq!(got, want, "{ch}");
        let i: usize = ch.rsplit('_').next().unwrap().parse().unwrap();
        assert_eq!(got.offset, (i % 4) as u64, "{ch}");
    }
}

/// Offsets within an epoch are 1, 2, 3 …
pub async fn publish_assigns_consecutive_offsets(broker: SharedBroker) {
    let _rec = started(&broker).await;
    let ch = unique("offsets");
    let a = broker
        .publish(&ch, Bytes::from_static(b"1"), None, &opts(10))
        .await
        .unwrap();
    let b = broker
        .publish(&ch, Bytes::from_static(b"2"), None, &opts(10))
        .await
        .unwrap();
    assert_eq!((a.offset, b.offset), (1, 2));
    assert_eq!(a.epoch, b.epoch);
}

/// A subscribed node gets every publication, in order, with its data and info intact.
pub async fn subscribed_node_receives_in_order(broker: SharedBroker) {
    let rec = started(&broker).await;
    let ch = unique("deliver");
    broker.subscribe(&ch).await.unwrap();
    let who = ClientInfo {
        user: "alice".into(),
        client: "c1".into(),
        info: None,
    };
    for i in 0..50 {
        let data = Bytes::from(format!("{{\"i\":{i}}}"));
        let info = (i == 0).then(|| who.clone());
        broker.publish(&ch, data, info, &opts(100)).await.unwrap();
    }
    eventually("50 publications", || rec.offsets(&ch).len() >= 50).await;
    assert_eq!(rec.offsets(&ch), (1..=50).collect::<Vec<_>>());
    let first = rec.publications.lock().unwrap()[0].2.clone();
    assert_eq!(&first.data[..], br#"{"i":0}"#);
    assert_eq!(first.info.map(|i| i.user), Some("alice".into()));
}

/// History keeps the newest `history_size`; recovery is all or nothing.
pub async fn history_and_recovery(broker: SharedBroker) {
    let _rec = started(&broker).await;
    let ch = unique("history");
    let o = opts(5);
    let mut last = StreamPosition {
        epoch: String::new(),
        offset: 0,
    };
    for i in 1..=8 {
        last = broker
            .publish(&ch, Bytes::from(i.to_string()), None, &o)
            .await
            .unwrap();
    }
    let all = broker
        .history(&ch, &HistoryQuery::default(), &o.stream)
        .await
        .unwrap();
    assert_eq!(all.position, last);
    let offsets: Vec<u64> = all.publications.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, vec![4, 5, 6, 7, 8]);

    let since = |offset| HistoryQuery {
        since: Some(StreamPosition {
            epoch: last.epoch.clone(),
            offset,
        }),
        limit: None,
    };
    let ok = broker.history(&ch, &since(3), &o.stream).await.unwrap();
    assert!(ok.continuous);
    assert_eq!(ok.publications.len(), 5);
    let gone = broker.history(&ch, &since(2), &o.stream).await.unwrap();
    assert!(
        !gone.continuous && gone.publications.is_empty(),
        "never partial"
    );
    let current = broker.history(&ch, &since(8), &o.stream).await.unwrap();
    assert!(current.continuous && current.publications.is_empty());
    let mut wrong_epoch = since(7);
    wrong_epoch.since.as_mut().unwrap().epoch = "not-the-epoch".into();
    assert!(
        !broker
            .history(&ch, &wrong_epoch, &o.stream)
            .await
            .unwrap()
            .continuous
    );

    // Without history, offsets still advance and the position is readable.
    let none = unique("nohistory");
    broker
        .publish(&none, Bytes::from_static(b"1"), None, &opts(0))
        .await
        .unwrap();
    let h = broker
        .history(&none, &HistoryQuery::default(), &opts(0).stream)
        .await
        .unwrap();
    assert_eq!(h.position.offset, 1);
    assert!(h.publications.is_empty());
}

/// A retried publish with the same idempotency key is stored once.
pub async fn idempotent_publish(broker: SharedBroker) {
    let _rec = started(&broker).await;
    let ch = unique("idem");
    let mut o = opts(10);
    o.idempotency_key = Some("k1".into());
    let a = broker
        .publish(&ch, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    let b = broker
        .publish(&ch, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    assert_eq!(a, b);
    let h = broker
        .history(&ch, &HistoryQuery::default(), &o.stream)
        .await
        .unwrap();
    assert_eq!(h.publications.len(), 1);
}

/// One publication to many channels is, on each, what one publish would be: the stream goes on
/// from earlier publishes, offsets are consecutive (a channel named twice gets two), each channel
/// keeps its own history size, every subscribed channel receives it in order with its data and
/// info, and a retry with the same idempotency key stores nothing twice. 150 channels, more than
/// one call's worth for a broker that stores several per call.
pub async fn publish_many_matches_one_by_one(broker: SharedBroker) {
    let rec = started(&broker).await;
    let base = unique("many");
    let channels: Vec<String> = (0..150).map(|i| format!("{base}_{i}")).collect();
    for ch in &channels {
        broker.subscribe(ch).await.unwrap();
    }
    broker
        .publish(
            &channels[0],
            Bytes::from_static(b"\"before\""),
            None,
            &opts(5),
        )
        .await
        .unwrap();
    // Even channels keep two publications, odd ones none; channel 1 is named twice.
    let mut targets: Vec<PublishTarget> = channels
        .iter()
        .enumerate()
        .map(|(i, ch)| PublishTarget {
            channel: ch.clone(),
            opts: opts(if i % 2 == 0 { 2 } else { 0 }),
        })
        .collect();
    targets.push(targets[1].clone());
    let who = who("many");
    let mut positions = Vec::new();
    for round in 0..2 {
        let data = Bytes::from(format!("{{\"round\":{round}}}"));
        let results = broker.publish_many(&targets, data, Some(who.clone())).await;
        assert_eq!(results.len(), targets.len());
        positions.push(
            results
                .into_iter()
                .map(|r| r.expect("every channel published"))
                .collect::<Vec<_>>(),
        );
    }
    let offsets = |round: usize, i: usize| positions[round][i].offset;
    assert_eq!((offsets(0, 0), offsets(1, 0)), (2, 3), "channel 0 went on");
    assert_eq!(
        (
            offsets(0, 1),
            offsets(0, 150),
            offsets(1, 1),
            offsets(1, 150)
        ),
        (1, 2, 3, 4),
        "channel 1, named twice"
    );
    for (i, (a, b)) in positions[0]
        .iter()
        .zip(&positions[1])
        .enumerate()
        .take(150)
        .skip(2)
    {
        assert_eq!((a.offset, b.offset), (1, 2), "channel {i}");
        assert_eq!(a.epoch, b.epoch, "channel {i}");
    }

    eventually("every publication delivered", || {
        // one publish before, then two rounds of 151
        rec.publications.lock().unwrap().len() == 1 + 2 * 151
    })
    .await;
    assert_eq!(rec.offsets(&channels[0]), vec![1, 2, 3]);
    assert_eq!(rec.offsets(&channels[1]), vec![1, 2, 3, 4]);
    for ch in &channels[2..] {
        assert_eq!(rec.offsets(ch), vec![1, 2], "{ch}");
    }
    let last = rec
        .publications
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(c, _, _)| *c == channels[7])
        .cloned();
    let (_, epoch, publication) = last.expect("channel 7 delivered");
    assert_eq!(epoch, positions[1][7].epoch);
    assert_eq!(&publication.data[..], br#"{"round":1}"#);
    assert_eq!(publication.info, Some(who.clone()));

    for (i, kept) in [(0, vec![2, 3]), (4, vec![1, 2]), (5, vec![])] {
        let h = broker
            .history(
                &channels[i],
                &HistoryQuery::default(),
                &targets[i].opts.stream,
            )
            .await
            .unwrap();
        let offsets: Vec<u64> = h.publications.iter().map(|p| p.offset).collect();
        assert_eq!(offsets, kept, "history of channel {i}");
        assert_eq!(h.position, positions[1][i]);
    }

    // With an idempotency key, a retry returns the same positions and stores nothing.
    let mut keyed: Vec<PublishTarget> = targets[..3].to_vec();
    for t in &mut keyed {
        t.opts.idempotency_key = Some("many-k1".into());
    }
    let data = Bytes::from_static(b"\"keyed\"");
    let first = broker.publish_many(&keyed, data.clone(), None).await;
    let again = broker.publish_many(&keyed, data, None).await;
    let tops = [3, 4, 2];
    for (i, (a, b)) in first.into_iter().zip(again).enumerate() {
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b, "channel {i}");
        assert_eq!(a.offset, tops[i] + 1, "channel {i}");
    }
}

/// Presence lists who was added and forgets who was removed.
pub async fn presence_add_list_remove(broker: SharedBroker) {
    let _rec = started(&broker).await;
    let ch = unique("presence");
    let who = |c: &str| ClientInfo {
        user: format!("u-{c}"),
        client: c.into(),
        info: None,
    };
    broker.add_presence(&ch, &who("a")).await.unwrap();
    broker.add_presence(&ch, &who("b")).await.unwrap();
    let mut clients: Vec<String> = broker
        .presence(&ch)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.client)
        .collect();
    clients.sort();
    assert_eq!(clients, vec!["a", "b"]);
    broker.remove_presence(&ch, "a").await.unwrap();
    let left = broker.presence(&ch).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].user, "u-b");
}

/// Presence counts clients and distinct users, and pages through members in client-id order:
/// every member exactly once, pages no longer than asked, `more` false on the last one, and a
/// removal and a re-add (a refresh) keep the counts right.
pub async fn presence_counts_and_pages(broker: SharedBroker) {
    let _rec = started(&broker).await;
    let ch = unique("presence_pages");
    let empty = broker.presence_stats(&ch).await.unwrap();
    assert_eq!((empty.num_clients, empty.num_users), (0, 0));
    assert_eq!(
        broker.presence_page(&ch, None, 10).await.unwrap(),
        PresencePage::default()
    );
    // 25 clients of 10 users (c00..c24; user u-<n % 10>).
    let member = |n: usize| ClientInfo {
        user: format!("u-{}", n % 10),
        client: format!("c{n:02}"),
        info: None,
    };
    for n in (0..25).rev() {
        broker.add_presence(&ch, &member(n)).await.unwrap();
    }
    broker.add_presence(&ch, &member(3)).await.unwrap();
    let stats = broker.presence_stats(&ch).await.unwrap();
    assert_eq!((stats.num_clients, stats.num_users), (25, 10));
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for page_no in 0.. {
        assert!(page_no < 10, "paging did not end");
        let page = broker
            .presence_page(&ch, after.as_deref(), 7)
            .await
            .unwrap();
        assert!(page.clients.len() <= 7);
        seen.extend(page.clients.iter().map(|c| c.client.clone()));
        if !page.more {
            break;
        }
        after = page.clients.last().map(|c| c.client.clone());
    }
    let all: Vec<String> = (0..25).map(|n| format!("c{n:02}")).collect();
    assert_eq!(seen, all, "every member once, in client-id order");
    // Removing all three clients of user u-4 (c04, c14, c24) and one of u-5 (c15).
    for c in ["c04", "c14", "c15", "c24"] {
        broker.remove_presence(&ch, c).await.unwrap();
    }
    broker.remove_presence(&ch, "never-there").await.unwrap();
    let stats = broker.presence_stats(&ch).await.unwrap();
    assert_eq!((stats.num_clients, stats.num_users), (21, 9));
    let page = broker.presence_page(&ch, Some("c20"), 100).await.unwrap();
    let rest: Vec<&str> = page.clients.iter().map(|c| c.client.as_str()).collect();
    assert_eq!(rest, vec!["c21", "c22", "c23"]);
    assert!(!page.more);
    assert_eq!(page.clients[0].user, "u-1");
}

/// Control messages come back to the sending node too.
pub async fn control_reaches_every_node(broker: SharedBroker) {
    let rec = started(&broker).await;
    let msg = ControlMessage::Disconnect {
        user: Some(unique("user")),
        client: None,
        code: 4502,
    };
    broker.publish_control(&msg).await.unwrap();
    eventually("control message", || {
        rec.controls.lock().unwrap().contains(&msg)
    })
    .await;
}

/// A reader on node B fixes the epoch the first publisher on node A then uses; B recovers what A
/// published (a few and many missed), with limits, never partially, and not across epochs; an
/// idempotency key holds across nodes.
pub async fn recovery_across_nodes(a: SharedBroker, b: SharedBroker) {
    started(&a).await;
    started(&b).await;
    let ch = unique("recover");
    let o = opts(20);
    let empty = b
        .history(&ch, &HistoryQuery::default(), &o.stream)
        .await
        .unwrap();
    assert_eq!(empty.position.offset, 0);
    let mut last = empty.position.clone();
    for i in 1..=30 {
        last = a
            .publish(&ch, Bytes::from(i.to_string()), None, &o)
            .await
            .unwrap();
    }
    assert_eq!(
        last.epoch, empty.position.epoch,
        "publisher and reader agree on the epoch"
    );
    assert_eq!(last.offset, 30);
    // Few missed and many missed (brokers may read the two differently).
    for from in [27, 12] {
        let r = b
            .history(&ch, &since(&last.epoch, from), &o.stream)
            .await
            .unwrap();
        assert!(r.continuous, "since {from}");
        let got: Vec<u64> = r.publications.iter().map(|p| p.offset).collect();
        assert_eq!(got, (from + 1..=30).collect::<Vec<_>>());
        assert_eq!(
            &r.publications[0].data[..],
            (from + 1).to_string().as_bytes()
        );
    }
    // A limit returns the oldest after `since`.
    let limited = HistoryQuery {
        limit: Some(3),
        ..since(&last.epoch, 12)
    };
    let r = b.history(&ch, &limited, &o.stream).await.unwrap();
    assert!(r.continuous);
    let got: Vec<u64> = r.publications.iter().map(|p| p.offset).collect();
    assert_eq!(got, vec![13, 14, 15]);
    let gone = b
        .history(&ch, &since(&last.epoch, 9), &o.stream)
        .await
        .unwrap();
    assert!(
        !gone.continuous && gone.publications.is_empty(),
        "trimmed: never partial"
    );
    let other = b
        .history(&ch, &since("other", 29), &o.stream)
        .await
        .unwrap();
    assert!(!other.continuous);
    // Without `since`: the newest `limit`, or everything kept.
    let newest = HistoryQuery {
        since: None,
        limit: Some(2),
    };
    let r = b.history(&ch, &newest, &o.stream).await.unwrap();
    let got: Vec<u64> = r.publications.iter().map(|p| p.offset).collect();
    assert_eq!(got, vec![29, 30]);
    let all = b
        .history(&ch, &HistoryQuery::default(), &o.stream)
        .await
        .unwrap();
    assert_eq!(all.publications.len(), 20);
    assert_eq!(all.publications[0].offset, 11);
    // Idempotency holds across nodes too.
    let mut idem = o.clone();
    idem.idempotency_key = Some("once".into());
    let x = a
        .publish(&ch, Bytes::from_static(b"7"), None, &idem)
        .await
        .unwrap();
    let y = b
        .publish(&ch, Bytes::from_static(b"7"), None, &idem)
        .await
        .unwrap();
    assert_eq!(x, y);
}

/// Publications older than the history TTL count as gone even before anything trims them; the
/// position outlives them.
pub async fn history_ttl_counts_old_entries_as_gone(broker: SharedBroker) {
    started(&broker).await;
    let ch = unique("ttl");
    let mut o = opts(10);
    o.stream.history_ttl = Duration::from_millis(700);
    let p = broker
        .publish(&ch, Bytes::from_static(b"1"), None, &o)
        .await
        .unwrap();
    let fresh = broker
        .history(&ch, &since(&p.epoch, 0), &o.stream)
        .await
        .unwrap();
    assert!(fresh.continuous && fresh.publications.len() == 1);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let old = broker
        .history(&ch, &since(&p.epoch, 0), &o.stream)
        .await
        .unwrap();
    assert!(!old.continuous, "expired from history");
    assert_eq!(old.position, p, "the position outlives the history");
    let current = broker
        .history(&ch, &since(&p.epoch, 1), &o.stream)
        .await
        .unwrap();
    assert!(current.continuous);
}

/// Presence spans nodes: what A and C add, B lists (with the `info` claim); a removal is seen;
/// a crashed node's entries (A dropped, so nothing refreshes them) expire within about two
/// `presence_ttl`s while a live node keeps its own alive past several. The three brokers must
/// share a server and be configured with `presence_ttl`.
pub async fn presence_spans_nodes_and_expires_with_a_crashed_node(
    a: SharedBroker,
    b: SharedBroker,
    c: SharedBroker,
    presence_ttl: Duration,
) {
    let ch = unique("presence");
    let with_info = |client: &str| ClientInfo {
        info: Some(serde_json::value::RawValue::from_string(r#"{"n":1}"#.into()).unwrap()),
        ..who(client)
    };
    a.add_presence(&ch, &with_info("x")).await.unwrap();
    c.add_presence(&ch, &with_info("y")).await.unwrap();
    c.add_presence(&ch, &who("z")).await.unwrap();
    c.remove_presence(&ch, "z").await.unwrap();
    let clients = |list: Vec<ClientInfo>| {
        let mut c: Vec<String> = list.into_iter().map(|w| w.client).collect();
        c.sort();
        c
    };
    let listed = b.presence(&ch).await.unwrap();
    assert_eq!(listed[0].info.as_ref().map(|i| i.get()), Some(r#"{"n":1}"#));
    assert_eq!(clients(listed), vec!["x", "y"]);
    drop(a); // crashed: x is never removed
    let deadline = tokio::time::Instant::now() + presence_ttl * 5 / 2 + Duration::from_secs(1);
    loop {
        let now = clients(b.presence(&ch).await.unwrap());
        if now == vec!["y"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "x did not expire: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // C keeps y alive past several TTLs.
    tokio::time::sleep(presence_ttl * 2).await;
    assert_eq!(clients(b.presence(&ch).await.unwrap()), vec!["y"]);
    c.remove_presence(&ch, "y").await.unwrap();
    assert!(b.presence(&ch).await.unwrap().is_empty());
}
