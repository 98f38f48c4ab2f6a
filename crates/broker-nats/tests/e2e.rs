//! The multi-node suite (`herald_testkit::multinode`, shared with every broker) with real herald
//! nodes on one real nats-server. Needs the `herald` binary: `HERALD_BIN`, or
//! `<target>/debug/herald` (built if missing).

use std::collections::BTreeMap;

use herald_broker_nats::names::unescape;
use herald_testkit::multinode::{self, BrokerProcess};
use herald_testkit::nats::{copy_tree, NatsServer};

/// NatsServer as the suite's broker; the subject escaping is the broker crate's, hence here.
struct Nats(NatsServer);

impl Nats {
    /// Per herald connection (named `herald-<node>`): the channels of its delivery subjects
    /// (`herald.d.<channel>`), from the server's `/connz?subs=1`.
    fn connections(&self) -> Vec<(String, Vec<String>)> {
        let body = self
            .0
            .monitor_get("/connz?subs=1&limit=1024")
            .expect("connz");
        let connz: serde_json::Value = serde_json::from_str(&body).expect("connz json");
        let mut out = Vec::new();
        for conn in connz["connections"].as_array().into_iter().flatten() {
            let Some(name) = conn["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("herald-"))
            else {
                continue;
            };
            let mut channels = Vec::new();
            for sub in conn["subscriptions_list"].as_array().into_iter().flatten() {
                let sub = sub.as_str().unwrap_or_default();
                if let Some(token) = sub.strip_prefix("herald.d.") {
                    channels.push(unescape(token).expect("escaped channel"));
                }
            }
            out.push((name.to_owned(), channels));
        }
        out
    }
}

impl BrokerProcess for Nats {
    fn url(&self) -> String {
        self.0.url()
    }

    fn stop(&mut self) {
        self.0.stop();
    }

    fn start_again(&mut self) {
        self.0.start_again();
    }

    fn channel_subscriptions(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (_, channels) in self.connections() {
            for channel in channels {
                *out.entry(channel).or_default() += 1;
            }
        }
        out
    }

    fn assert_no_patterns(&self) {
        let body = self
            .0
            .monitor_get("/connz?subs=1&limit=1024")
            .expect("connz");
        let connz: serde_json::Value = serde_json::from_str(&body).expect("connz json");
        for conn in connz["connections"].as_array().into_iter().flatten() {
            for sub in conn["subscriptions_list"].as_array().into_iter().flatten() {
                let sub = sub.as_str().unwrap_or_default();
                assert!(
                    !(sub.starts_with("herald.") && (sub.contains('*') || sub.contains('>'))),
                    "{} holds a wildcard subscription {sub}",
                    conn["name"]
                );
            }
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.0.port()).into()
    }

    fn url_via(&self, addr: std::net::SocketAddr) -> String {
        format!("nats://{addr}")
    }

    fn snapshot(&mut self) -> bool {
        self.0.snapshot();
        true
    }

    fn restart_from_snapshot(&mut self) {
        self.0.restart_from_snapshot();
    }
}

/// The operator declares that NATS loses nothing across a restart: epochs then survive it.
const SYNCHRONOUS: (&str, &str) = ("HERALD_NATS__SYNCHRONOUS_PERSISTENCE", "true");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_delivery_exactly_once() {
    multinode::cross_node_delivery_exactly_once(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_across_nodes() {
    multinode::recovery_across_nodes(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restart_mid_stream_loses_nothing() {
    // Without the declaration every restart starts new epochs (clients are told), by design.
    multinode::broker_restart_mid_stream_loses_nothing(
        &mut Nats(NatsServer::start()),
        &[SYNCHRONOUS],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_across_nodes() {
    multinode::presence_across_nodes(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_node_blip_loses_nothing() {
    multinode::subscriber_node_blip_loses_nothing(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resume_across_nodes() {
    multinode::sse_resume_across_nodes(&mut Nats(NatsServer::start())).await;
}

/// NATS comes back *behind*: its file store is put back to a copy taken at offset 3 after
/// offsets 4 to 6 were delivered (what an R1 server that crashed before its last writes reached
/// the disk looks like). Its offsets would restart below what clients hold, in the same epoch.
/// The nodes must start the stream over with a new epoch instead, so no subscriber and no
/// recovering client misses anything without being told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restored_from_an_older_store_starts_a_new_epoch() {
    use herald_testkit::node::Node;
    use serde_json::{json, Value};
    use std::time::{Duration, Instant};

    async fn publish_when_back(node: &Node, ch: &str, data: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, body) = node.try_publish(ch, data.clone(), None).await;
            if status == 200 {
                return body;
            }
            assert!(Instant::now() < deadline, "NATS never came back: {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // The watermark's own test: the restart in the middle must keep epochs.
    let mut nats = NatsServer::start();
    let a = Node::on_broker_with("a", &nats.url(), &[SYNCHRONOUS]).await;
    let b = Node::on_broker_with("b", &nats.url(), &[SYNCHRONOUS]).await;
    let ch = format!("rollback-{:08x}", rand::random::<u32>());
    let mut live = b.subscriber(json!({ &ch: {} })).await;
    let epoch = live.connect_reply["subs"][&ch]["epoch"].clone();
    for i in 1..=3 {
        a.publish(&ch, json!(i)).await;
    }
    // A consistent copy at offset 3, taken while the server is stopped.
    nats.stop();
    let store = nats.store_dir().to_path_buf();
    let saved = store.with_extension("older");
    let _ = std::fs::remove_dir_all(&saved);
    copy_tree(&store, &saved);
    nats.start_again();
    for i in 4..=6 {
        let body = publish_when_back(&a, &ch, json!(i)).await;
        assert_eq!(body["epoch"], epoch, "{body}");
    }
    assert_eq!(
        live.offsets(&ch, 6, Duration::from_secs(10)).await,
        (1..=6).collect::<Vec<_>>()
    );

    nats.kill();
    std::fs::remove_dir_all(&store).unwrap();
    copy_tree(&saved, &store);
    std::fs::remove_dir_all(&saved).unwrap();
    nats.start_again(); // the stream's top is offset 3 again, in the same epoch
    let mut after = Vec::new();
    for i in 7..=10 {
        after.push(publish_when_back(&a, &ch, json!(i)).await);
    }
    for body in &after {
        assert_ne!(
            body["epoch"], epoch,
            "offsets reused in the old epoch: {after:?}"
        );
    }
    assert_eq!(after[0]["offset"], 1, "{after:?}");

    // The live subscriber is told (unsub 4003, or a close it reconnects from), never fed a
    // reused offset in silence.
    let deadline = Instant::now() + Duration::from_secs(10);
    let told = loop {
        let Some(m) = live.next_within(Duration::from_millis(200)).await else {
            if live.close_code.is_some() {
                break format!("close {:?}", live.close_code);
            }
            assert!(Instant::now() < deadline, "the subscriber was never told");
            continue;
        };
        assert!(
            m.get("pub").is_none(),
            "a publication after the rollback: {m}"
        );
        if m["unsub"]["channel"] == ch.as_str() {
            assert_eq!(m["unsub"]["code"], 4003, "{m}");
            break "unsub 4003".into();
        }
    };
    assert!(!told.is_empty());

    // A client that held offset 6 recovers on either node: it must learn it cannot.
    for node in [&a, &b] {
        let c = node
            .subscriber(json!({ &ch: {"since": {"epoch": epoch, "offset": 6}} }))
            .await;
        let sub = &c.connect_reply["subs"][&ch];
        assert_eq!(sub["recovered"], false, "{sub}");
        assert_eq!(sub["epoch"], after[0]["epoch"], "{sub}");
        assert_eq!(sub["offset"], 4, "{sub}");
    }
}

/// Issue 29 item 5: NATS restored from an older copy of its store while node A's link is down,
/// and node B, which never saw the channel, publishes first: B must not number on in the old
/// epoch, A's subscriber is told, and a client at (E, 10) gets `recovered: false`. No running
/// node witnessed offsets 6 to 10 when B publishes, so only the epoch's binding to the server's
/// life (the boot id) can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_seen_by_no_node_still_starts_a_new_epoch() {
    multinode::rollback::rollback_with_a_second_node_is_never_continued_in_the_old_epoch(
        &mut Nats(NatsServer::start()),
        &[],
    )
    .await;
}

/// A three-server NATS cluster with R3 streams loses one server (`kill -9`) while a node
/// publishes and another node's client is subscribed: publishing may pause for the stream's
/// leader election, but every acknowledged publication reaches the client once, in order (told
/// with unsub 4003 and recovering with `since` also counts, as a client would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_cluster_survives_a_killed_server() {
    use herald_testkit::nats::NatsCluster;
    use herald_testkit::node::Node;

    let mut cluster = NatsCluster::start();
    let env = [("HERALD_NATS__REPLICAS", "3")];
    let a = Node::on_broker_with("a", &cluster.url(), &env).await;
    let b = Node::on_broker_with("b", &cluster.url(), &env).await;
    let ch = format!("r3-{:08x}", rand::random::<u32>());
    multinode::nothing_lost_through(&a, &b, &ch, 150, 50, || {
        // The history stream has three replicas; kill the server that leads it.
        let jsz = cluster.servers()[1]
            .monitor_get("/jsz?streams=true&config=true")
            .expect("/jsz");
        let jsz: serde_json::Value = serde_json::from_str(&jsz).expect("jsz JSON");
        let stream = jsz["account_details"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|a| a["stream_detail"].as_array().into_iter().flatten())
            .find(|s| s["name"] == "HERALD")
            .cloned()
            .unwrap_or_else(|| panic!("no HERALD stream in {jsz}"));
        assert_eq!(stream["config"]["num_replicas"], 3, "{stream}");
        let leader = stream["cluster"]["leader"].as_str().expect("a leader");
        let leader: usize = leader.trim_start_matches('n').parse().expect("n<i>");
        cluster.servers()[leader].kill();
    })
    .await;
}

/// The chaos soak, briefly (`scripts/chaos-soak.sh` runs it for minutes): kills, link cuts and
/// NATS restarts under load; 0 lost without being told, 0 duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak() {
    use std::time::Duration;
    let duration = multinode::chaos::soak_duration(Duration::from_secs(15));
    let report = multinode::chaos::chaos_soak(&mut Nats(NatsServer::start()), duration).await;
    eprintln!("chaos soak on NATS: {report:#?}");
    assert!(
        report.delivered > 0 && report.acknowledged > 0,
        "{report:?}"
    );
}
