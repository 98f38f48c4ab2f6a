//! Unit tests of the hub on the in-memory broker.
//!
//! Tests that wait for the catch-up task run on paused time: a sleep there returns once every task
//! is idle (the in-memory broker does no I/O), however slow the machine, and costs no wall-clock time.
use super::*;
use async_trait::async_trait;
use herald_broker::{Broker, HistoryResult, MemoryBroker, PublishOptions};
use std::collections::HashSet;

/// A memory broker whose deliveries of chosen offsets never reach the hub (they are stored).
struct LossyBroker {
    inner: MemoryBroker,
    lose: Arc<Mutex<HashSet<u64>>>,
}

impl LossyBroker {
    fn new() -> Self {
        LossyBroker {
            inner: MemoryBroker::new(),
            lose: Arc::default(),
        }
    }
    fn lose(&self, offsets: &[u64]) {
        self.lose.lock().unwrap().extend(offsets);
    }
}

struct Dropping {
    inner: Arc<dyn BrokerHandler>,
    lose: Arc<Mutex<HashSet<u64>>>,
}

impl BrokerHandler for Dropping {
    fn on_publication(&self, channel: &str, epoch: &str, p: Publication) {
        if !self.lose.lock().unwrap().remove(&p.offset) {
            self.inner.on_publication(channel, epoch, p);
        }
    }
    fn on_presence_change(&self, channel: &str, joined: bool, who: ClientInfo) {
        self.inner.on_presence_change(channel, joined, who);
    }
    fn on_control(&self, message: ControlMessage) {
        self.inner.on_control(message);
    }
    fn on_reconnected(&self) {
        self.inner.on_reconnected();
    }
}

#[async_trait]
impl Broker for LossyBroker {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        let lose = self.lose.clone();
        self.inner
            .start(Arc::new(Dropping {
                inner: handler,
                lose,
            }))
            .await
    }
    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        self.inner.publish(channel, data, info, opts).await
    }
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.inner.subscribe(channel).await
    }
    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.inner.unsubscribe(channel).await
    }
    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        self.inner.history(channel, query, opts).await
    }
    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        self.inner.add_presence(channel, who).await
    }
    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        self.inner.remove_presence(channel, client).await
    }
    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.inner.presence(channel).await
    }
    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        self.inner
            .publish_presence_change(channel, joined, who)
            .await
    }
    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        self.inner.publish_control(message).await
    }
}

fn ns() -> NamespaceConfig {
    NamespaceConfig::default()
}

async fn hub() -> Hub {
    let hub = Hub::new(
        "test".into(),
        Arc::new(MemoryBroker::new()),
        Arc::new(Metrics::new()),
    );
    hub.start().await.unwrap();
    hub
}

fn offsets(out: &Outbound) -> Vec<u64> {
    out.drain()
        .frames
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            v["pub"]["offset"].as_u64().unwrap()
        })
        .collect()
}

async fn publish(hub: &Hub, channel: &str, n: u64) {
    for i in 0..n {
        let opts = PublishOptions {
            stream: ns().stream_options(),
            idempotency_key: None,
            traceparent: None,
            tags: Default::default(),
            skip_history: false,
        };
        hub.broker()
            .publish(channel, Bytes::from(i.to_string()), None, &opts)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_registry_finds_each_users_connections_after_removals_and_moves() {
    let hub = hub().await;
    let outs: Vec<Arc<Outbound>> = (0..5).map(|_| Arc::new(Outbound::new(1 << 10))).collect();
    for (i, out) in outs.iter().enumerate() {
        hub.register(format!("c{i}").into(), "".into(), out.clone());
    }
    let found = |user: &str| {
        let mut v: Vec<usize> = hub
            .find(Some(user), None)
            .iter()
            .map(|o| outs.iter().position(|x| Arc::ptr_eq(x, o)).unwrap())
            .collect();
        v.sort_unstable();
        v
    };
    hub.unregister("c1");
    hub.unregister("c0");
    assert_eq!(found(""), [2, 3, 4]);
    hub.set_user("c3", "alice".into());
    assert_eq!((found(""), found("alice")), (vec![2, 4], vec![3]));
    hub.unregister("c4");
    hub.unregister("c2");
    assert_eq!(found(""), Vec::<usize>::new());
    hub.set_user("c3", "".into());
    assert_eq!((found(""), found("alice")), (vec![3], vec![]));
    hub.unregister("c3");
    assert_eq!(hub.shared.registry.lock().unwrap().users.len(), 0);
}

#[tokio::test]
async fn pending_subscriber_gets_what_arrived_after_its_reply_position() {
    let hub = hub().await;
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register("c1".into(), "u".into(), out.clone());
    publish(&hub, "ch", 3).await;
    let since = hub
        .prepare_subscription("ch", key, &out, None, &ns())
        .await
        .unwrap()
        .position;
    assert_eq!(since.offset, 3);
    // Published while the reply is being built: kept, then queued after it.
    publish(&hub, "ch", 2).await;
    assert!(
        out.drain().frames.is_empty(),
        "nothing goes out before the reply"
    );
    hub.activate("ch", key, &since);
    publish(&hub, "ch", 1).await;
    assert_eq!(offsets(&out), vec![4, 5, 6]);
}

/// What the session would be told: the channels it lost, in order.
fn lost(out: &Outbound) -> Vec<String> {
    out.drain()
        .controls
        .into_iter()
        .filter_map(|c| match c {
            Control::Lost { channel, .. } => Some(channel),
            _ => None,
        })
        .collect()
}

/// Subscribe a registered connection to `channel` (both halves); returns the reply position.
async fn join(hub: &Hub, channel: &str, key: ConnKey, out: &Arc<Outbound>) -> StreamPosition {
    let pos = hub
        .prepare_subscription(channel, key, out, None, &ns())
        .await
        .unwrap()
        .position;
    hub.activate(channel, key, &pos);
    pos
}

async fn subscribed(hub: &Hub, channel: &str, client: &str) -> (ConnKey, Arc<Outbound>) {
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register(client.into(), "u".into(), out.clone());
    join(hub, channel, key, &out).await;
    (key, out)
}

fn publication(offset: u64) -> Publication {
    Publication {
        offset,
        data: Bytes::from(offset.to_string()),
        info: None,
        tags: Default::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn gap_that_history_cannot_fill_loses_only_that_channel() {
    let hub = hub().await;
    let (key, out) = subscribed(&hub, "ch", "c1").await;
    join(&hub, "other", key, &out).await;
    publish(&hub, "ch", 2).await;
    let epoch = hub
        .broker()
        .history("ch", &HistoryQuery::default(), &ns().stream_options())
        .await
        .unwrap()
        .position
        .epoch;
    // Offset 4 arrives after 2, but 3 was never stored: history cannot fill the gap.
    hub.deliver("ch", &epoch, publication(4));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let drained = out.drain();
    assert_eq!(drained.frames.len(), 2, "1 and 2 were delivered");
    assert!(drained.close.is_none(), "the connection stays");
    assert!(matches!(&drained.controls[..], [Control::Lost { channel, .. }] if channel == "ch"));
    assert_eq!(hub.metrics().continuity_lost.get(), 1);
    // The other channel still delivers.
    publish(&hub, "other", 1).await;
    assert_eq!(offsets(&out), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn gap_is_caught_up_from_history_in_order() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    let (_, out) = subscribed(&hub, "ch", "c1").await;
    publish(&hub, "ch", 1).await;
    broker.lose(&[2, 3]);
    publish(&hub, "ch", 2).await;
    assert_eq!(offsets(&out), vec![1], "2 and 3 never arrived");
    publish(&hub, "ch", 1).await; // 4 reveals the gap: 2 and 3 come from history first
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(offsets(&out), vec![2, 3, 4]);
    assert_eq!(hub.metrics().catchups.get(), 1);
    assert!(lost(&out).is_empty());
}

#[tokio::test(start_paused = true)]
async fn first_delivery_after_the_reply_is_checked_against_its_position() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    publish(&hub, "ch", 2).await;
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register("c1".into(), "u".into(), out.clone());
    let pos = hub
        .prepare_subscription("ch", key, &out, None, &ns())
        .await
        .unwrap()
        .position;
    assert_eq!(pos.offset, 2);
    // 3 is published but never reaches this node; 4 does, before the reply is queued.
    broker.lose(&[3]);
    publish(&hub, "ch", 2).await;
    hub.activate("ch", key, &pos);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(offsets(&out), vec![3, 4], "the hole at 3 is caught up");
}

/// Two subscribers pending on a channel without a baseline; the newer reply activates
/// first and sets the baseline. The older one must still get everything after its own
/// reply position, from the publications held meanwhile.
#[tokio::test]
async fn an_older_reply_activated_after_a_newer_one_misses_nothing() {
    let hub = hub().await;
    publish(&hub, "ch", 10).await;
    let (a_out, b_out) = (
        Arc::new(Outbound::new(1 << 20)),
        Arc::new(Outbound::new(1 << 20)),
    );
    let a = hub.register("a".into(), "u".into(), a_out.clone());
    let b = hub.register("b".into(), "u".into(), b_out.clone());
    let a_pos = hub
        .prepare_subscription("ch", a, &a_out, None, &ns())
        .await
        .unwrap()
        .position;
    publish(&hub, "ch", 2).await; // 11 and 12 are held: no baseline yet
    let b_pos = hub
        .prepare_subscription("ch", b, &b_out, None, &ns())
        .await
        .unwrap()
        .position;
    assert_eq!((a_pos.offset, b_pos.offset), (10, 12));
    publish(&hub, "ch", 1).await; // 13
    hub.activate("ch", b, &b_pos);
    hub.activate("ch", a, &a_pos);
    assert_eq!(offsets(&b_out), vec![13]);
    assert_eq!(offsets(&a_out), vec![11, 12, 13]);
    publish(&hub, "ch", 1).await;
    assert_eq!(offsets(&a_out), vec![14]);
    assert!(lost(&a_out).is_empty());
}

/// As above, but a publication held meanwhile was lost on its way to the node: the newer reply
/// sets the baseline past it, so what the hub holds for the older reply stops short of the
/// baseline. The older subscriber must be told (4003), not left with a hole. Found by the
/// simulator (crates/sim, seed 120323311744021: a client got 3 then 5).
#[tokio::test]
async fn an_older_reply_with_a_held_publication_lost_is_told_not_left_with_a_hole() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    publish(&hub, "ch", 2).await;
    let (a_out, b_out) = (
        Arc::new(Outbound::new(1 << 20)),
        Arc::new(Outbound::new(1 << 20)),
    );
    let a = hub.register("a".into(), "u".into(), a_out.clone());
    let b = hub.register("b".into(), "u".into(), b_out.clone());
    let a_pos = hub
        .prepare_subscription("ch", a, &a_out, None, &ns())
        .await
        .unwrap()
        .position;
    broker.lose(&[4]);
    publish(&hub, "ch", 2).await; // 3 is held, 4 never reaches the node: no baseline yet
    let b_pos = hub
        .prepare_subscription("ch", b, &b_out, None, &ns())
        .await
        .unwrap()
        .position;
    assert_eq!((a_pos.offset, b_pos.offset), (2, 4));
    hub.activate("ch", b, &b_pos);
    hub.activate("ch", a, &a_pos);
    assert_eq!(lost(&a_out), vec!["ch".to_string()]);
    publish(&hub, "ch", 1).await;
    assert!(offsets(&a_out).is_empty(), "nothing after the hole");
    assert_eq!(offsets(&b_out), vec![5]);
}

/// A reply older than what the channel already delivered before the subscriber was pending
/// cannot be completed from what the hub holds: the subscriber is told (4003), not left
/// with a hole.
#[tokio::test]
async fn a_reply_older_than_the_baseline_is_told_not_left_with_a_hole() {
    let hub = hub().await;
    let (_, first) = subscribed(&hub, "ch", "first").await;
    publish(&hub, "ch", 12).await;
    assert_eq!(offsets(&first).len(), 12);
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register("late".into(), "u".into(), out.clone());
    hub.prepare_subscription("ch", key, &out, None, &ns())
        .await
        .unwrap();
    // As if its history read had been stale: position 10 while 11 and 12 went out before.
    let stale = hub
        .broker()
        .history("ch", &HistoryQuery::default(), &ns().stream_options())
        .await
        .unwrap()
        .position;
    let stale = StreamPosition {
        epoch: stale.epoch,
        offset: 10,
    };
    hub.activate("ch", key, &stale);
    assert_eq!(lost(&out), vec!["ch".to_string()]);
    publish(&hub, "ch", 1).await;
    assert!(offsets(&out).is_empty(), "nothing after the hole");
    assert_eq!(offsets(&first), vec![13]);
}

#[tokio::test(start_paused = true)]
async fn lost_tail_is_found_by_the_tail_check() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    let (_, out) = subscribed(&hub, "ch", "c1").await;
    publish(&hub, "ch", 1).await;
    broker.lose(&[2]);
    publish(&hub, "ch", 1).await; // the last of the burst, lost: nothing follows it
    assert_eq!(offsets(&out), vec![1]);
    tokio::time::sleep(TAIL_CHECK_EVERY * 3).await;
    assert_eq!(offsets(&out), vec![2]);
    assert_eq!(hub.metrics().tail_gaps.get(), 1);
}

/// More channels due than one tick's reads: the rest wait for the next ticks instead of being
/// dropped until the sweep comes round (once, a channel past the first 512 of a tick lost its
/// "delivered since the last check" mark unchecked, and its lost tail waited up to a minute).
#[tokio::test(start_paused = true)]
async fn lost_tails_on_more_channels_than_one_tick_reads_are_all_found_within_a_few_ticks() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    let channels = TAIL_CHECKS_PER_TICK + TAIL_CHECKS_PER_TICK / 4;
    let mut outs = Vec::new();
    for n in 0..channels {
        let channel = format!("ch{n}");
        let (_, out) = subscribed(&hub, &channel, &format!("c{n}")).await;
        publish(&hub, &channel, 1).await;
        broker.lose(&[2]);
        publish(&hub, &channel, 1).await; // the last of its burst, lost
        assert_eq!(offsets(&out), vec![1], "{channel}");
        outs.push(out);
    }
    // Two checks per channel (a gap seen twice), 512 reads a tick: five ticks are enough.
    tokio::time::sleep(TAIL_CHECK_EVERY * 6).await;
    let missed: Vec<usize> = (0..channels)
        .filter(|n| offsets(&outs[*n]) != vec![2])
        .collect();
    assert!(
        missed.is_empty(),
        "{} of {channels} lost tails not found after 6 ticks, e.g. ch{:?}",
        missed.len(),
        &missed[..missed.len().min(5)]
    );
    assert_eq!(hub.metrics().tail_gaps.get(), channels as u64);
}

/// A quiet channel's lost tail is found within about a minute even while more busy channels
/// than one tick reads deliver every second (the longest unchecked goes first).
#[tokio::test(start_paused = true)]
async fn a_quiet_channels_lost_tail_is_found_while_more_busy_channels_than_a_tick_reads_deliver() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    let busy: Vec<String> = (0..TAIL_CHECKS_PER_TICK + 64)
        .map(|n| format!("busy{n}"))
        .collect();
    let mut outs = Vec::new();
    for channel in &busy {
        outs.push(subscribed(&hub, channel, channel).await.1);
    }
    // In the last shard: a tick that walked the shards in order, reading the first 512 due,
    // never reached it.
    let name = (0..)
        .map(|n| format!("quiet{n}"))
        .find(|name| stripe(name, SHARDS) == SHARDS - 1)
        .unwrap();
    let (_, quiet) = subscribed(&hub, &name, "q").await;
    publish(&hub, &name, 1).await;
    tokio::time::sleep(TAIL_CHECK_EVERY * 3).await; // checked: nothing missing
    broker.lose(&[2]);
    publish(&hub, &name, 1).await; // lost, and it delivered nothing since its check
    assert_eq!(offsets(&quiet), vec![1]);
    let mut ticks = 0;
    while offsets(&quiet) != vec![2] {
        ticks += 1;
        assert!(
            ticks <= TAIL_SWEEP_TICKS + 8,
            "the quiet channel's lost tail not found after {ticks} ticks"
        );
        for channel in &busy {
            publish(&hub, channel, 1).await;
        }
        tokio::time::sleep(TAIL_CHECK_EVERY).await;
    }
    assert!(
        hub.metrics().tail_checks_waiting.get() > 0,
        "busier than a tick reads"
    );
    for out in &outs {
        assert!(!offsets(out).is_empty());
    }
}

#[tokio::test]
async fn changed_epoch_loses_the_channel_and_the_next_reply_sets_a_new_baseline() {
    let hub = hub().await;
    let (_, out) = subscribed(&hub, "ch", "c1").await;
    hub.deliver("ch", "another-epoch", publication(7));
    assert_eq!(lost(&out), vec!["ch".to_string()]);
    assert!(out.drain().frames.is_empty(), "nothing from the new epoch");
    hub.unsubscribe("ch", ConnKey(1)).await;
    let (_, again) = subscribed(&hub, "ch", "c2").await;
    publish(&hub, "ch", 2).await;
    assert_eq!(offsets(&again), vec![1, 2]);
}

#[tokio::test]
async fn duplicates_are_dropped() {
    let hub = hub().await;
    let (_, out) = subscribed(&hub, "ch", "c1").await;
    let pos = hub
        .broker()
        .history("ch", &HistoryQuery::default(), &ns().stream_options())
        .await
        .unwrap()
        .position;
    publish(&hub, "ch", 2).await;
    let p = Publication {
        offset: 2,
        data: Bytes::from_static(b"x"),
        info: None,
        tags: Default::default(),
    };
    hub.deliver("ch", &pos.epoch, p);
    assert_eq!(offsets(&out), vec![1, 2]);
}

#[tokio::test]
async fn last_unsubscribe_removes_the_channel() {
    let hub = hub().await;
    let (key, _out) = subscribed(&hub, "ch", "c1").await;
    assert_eq!(hub.channels(), vec![("ch".to_string(), 1)]);
    hub.unsubscribe("ch", key).await;
    assert!(hub.channels().is_empty());
    publish(&hub, "ch", 1).await;
    assert_eq!(hub.metrics().publications_without_subscriber.get(), 1);
}

/// A subscriber coming back with `since` on a channel of RECENT_MIN_SUBSCRIBERS: its reply.
async fn come_back(hub: &Hub, since: Option<StreamPosition>) -> (SubscribeResult, Arc<Outbound>) {
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register("back".into(), "u".into(), out.clone());
    let reply = hub
        .prepare_subscription("ch", key, &out, since.as_ref(), &ns())
        .await
        .unwrap();
    hub.activate("ch", key, &reply.position);
    (reply, out)
}

async fn epoch_of(hub: &Hub) -> String {
    let (opts, query) = (ns().stream_options(), HistoryQuery::default());
    let history = hub.broker().history("ch", &query, &opts);
    history.await.unwrap().position.epoch
}

fn reply_offsets(reply: &SubscribeResult) -> Vec<u64> {
    reply.publications.iter().map(|p| p.offset).collect()
}

#[tokio::test(start_paused = true)]
async fn a_large_channel_answers_a_returning_subscriber_from_its_recent_publications() {
    let broker = Arc::new(LossyBroker::new());
    let hub = Hub::new("test".into(), broker.clone(), Arc::new(Metrics::new()));
    hub.start().await.unwrap();
    for i in 0..RECENT_MIN_SUBSCRIBERS {
        subscribed(&hub, "ch", &format!("c{i}")).await;
    }
    // The first set the channel's baseline from the broker; the others got it from the node.
    let local = || hub.metrics().history_reads_local.get();
    assert_eq!(local(), RECENT_MIN_SUBSCRIBERS as u64 - 1);
    publish(&hub, "ch", 5).await;
    let epoch = epoch_of(&hub).await;
    let at = |offset| StreamPosition {
        epoch: epoch.clone(),
        offset,
    };
    let (reply, _) = come_back(&hub, Some(at(2))).await;
    assert_eq!(reply.recovered, Some(true));
    assert_eq!(
        (reply_offsets(&reply), reply.position.offset),
        (vec![3, 4, 5], 5)
    );
    let (fresh, _) = come_back(&hub, None).await;
    assert_eq!((fresh.position.clone(), fresh.recovered), (at(5), None));
    assert_eq!(local(), RECENT_MIN_SUBSCRIBERS as u64 + 1, "no broker read");

    // 6 is stored but never reaches the node: the baseline answers 5, and delivery brings 6.
    broker.lose(&[6]);
    publish(&hub, "ch", 1).await;
    let (reply, out) = come_back(&hub, Some(at(4))).await;
    assert_eq!((reply_offsets(&reply), reply.position.offset), (vec![5], 5));
    publish(&hub, "ch", 1).await; // 7 reveals the gap at 6
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        offsets(&out),
        vec![6, 7],
        "nothing lost after a local answer"
    );
    assert!(lost(&out).is_empty());

    // The caught-up publications are recent ones too.
    let (reply, _) = come_back(&hub, Some(at(0))).await;
    assert_eq!(reply_offsets(&reply), (1..=7).collect::<Vec<_>>());
    assert_eq!(local(), RECENT_MIN_SUBSCRIBERS as u64 + 3);

    // Older than what the node keeps, or another epoch: the broker answers.
    publish(&hub, "ch", RECENT_MAX as u64).await;
    let (reply, _) = come_back(&hub, Some(at(6))).await;
    assert_eq!(
        reply_offsets(&reply),
        (7..=7 + RECENT_MAX as u64).collect::<Vec<_>>()
    );
    let other = StreamPosition {
        epoch: "gone".into(),
        offset: 3,
    };
    let (reply, _) = come_back(&hub, Some(other)).await;
    assert_eq!(reply.recovered, Some(false));
    assert_eq!(local(), RECENT_MIN_SUBSCRIBERS as u64 + 3);
}

#[tokio::test]
async fn a_small_channel_keeps_no_recent_publications_and_asks_the_broker() {
    let hub = hub().await;
    subscribed(&hub, "ch", "c1").await;
    publish(&hub, "ch", 3).await;
    {
        let shard = hub.shard("ch").lock().unwrap();
        assert!(shard.get("ch").unwrap().recent.is_empty());
    }
    let since = StreamPosition {
        epoch: epoch_of(&hub).await,
        offset: 1,
    };
    let (reply, _) = come_back(&hub, Some(since)).await;
    assert_eq!(reply_offsets(&reply), [2, 3]);
    // The first subscriber set the baseline from the broker; nothing was answered locally.
    assert_eq!(hub.metrics().history_reads_local.get(), 0);
}

/// Publish data `i` with `tags` (and `skip_history`) to `channel` through the broker.
async fn publish_tagged(hub: &Hub, channel: &str, i: u64, tags: &[(&str, &str)], skip: bool) {
    let opts = PublishOptions {
        stream: ns().stream_options(),
        idempotency_key: None,
        traceparent: None,
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        skip_history: skip,
    };
    hub.broker()
        .publish(channel, Bytes::from(i.to_string()), None, &opts)
        .await
        .unwrap();
}

/// Each queued `pub` as (offset, or 0 when it has none; data).
fn pubs(out: &Outbound) -> Vec<(u64, u64)> {
    out.drain()
        .frames
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            let p = &v["pub"];
            (
                p["offset"].as_u64().unwrap_or(0),
                p["data"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_tag_filter_lets_through_only_matching_publications_held_or_live() {
    let hub = hub().await;
    let (_, plain) = subscribed(&hub, "ch", "c0").await;
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register("c1".into(), "u".into(), out.clone());
    let since = hub
        .prepare_subscription("ch", key, &out, None, &ns())
        .await
        .unwrap()
        .position;
    let spec = serde_json::from_str(r#"{"key":"k","cmp":"eq","val":"yes"}"#).unwrap();
    hub.use_tags_filter("ch", key, TagFilter::from_spec(&spec).unwrap());
    // Held for the pending subscriber, then filtered on activation.
    publish_tagged(&hub, "ch", 1, &[("k", "yes")], false).await;
    publish_tagged(&hub, "ch", 2, &[("k", "no")], false).await;
    hub.activate("ch", key, &since);
    publish_tagged(&hub, "ch", 3, &[], false).await;
    publish_tagged(&hub, "ch", 4, &[("k", "yes")], false).await;
    assert_eq!(pubs(&out), [(1, 1), (4, 4)]);
    assert_eq!(pubs(&plain), [(1, 1), (2, 2), (3, 3), (4, 4)]);
}

#[tokio::test]
async fn an_unstored_publication_reaches_live_subscribers_and_leaves_the_stream_as_it_was() {
    let hub = hub().await;
    let (_, live) = subscribed(&hub, "ch", "c0").await;
    let out = Arc::new(Outbound::new(1 << 20));
    let key = hub.register("c1".into(), "u".into(), out.clone());
    publish_tagged(&hub, "ch", 1, &[], false).await;
    let since = hub
        .prepare_subscription("ch", key, &out, None, &ns())
        .await
        .unwrap()
        .position;
    // The pending subscriber does not get it (live only); the live one does, without offset.
    publish_tagged(&hub, "ch", 7, &[], true).await;
    hub.activate("ch", key, &since);
    publish_tagged(&hub, "ch", 2, &[], false).await;
    assert_eq!(pubs(&live), [(1, 1), (0, 7), (2, 2)]);
    assert_eq!(pubs(&out), [(2, 2)]);
    assert!(lost(&live).is_empty() && lost(&out).is_empty());
    let h = hub
        .broker()
        .history("ch", &HistoryQuery::default(), &ns().stream_options())
        .await
        .unwrap();
    let kept: Vec<u64> = h.publications.iter().map(|p| p.offset).collect();
    assert_eq!((kept, h.position.offset), (vec![1, 2], 2));
}
