//! Delta compression (`subscribe` with `delta: "fossil"`) against the real binary: a client that
//! applies every delta with the Fossil crate rebuilds exactly the data a plain subscriber gets,
//! on the memory broker and on Redis, and across two nodes on Redis Cluster and on NATS (published
//! on one node, rebuilt on the other); recovery, history and everything after a skip stay full;
//! a namespace without `allow_delta` refuses it.
mod common;

use std::time::Duration;

use common::*;
use herald_testkit::nats::NatsServer;
use herald_testkit::redis::{RedisCluster, RedisServer};
use serde_json::{json, Value};

const ALLOW: (&str, &str) = ("HERALD_DEFAULT_NAMESPACE__ALLOW_DELTA", "true");

/// A ~2 KB order book (25 bid and 25 ask levels); each `seq` changes a few fields (one level's
/// size, the sequence, the time).
fn book(seq: u64) -> Value {
    let level = |side: u64, i: u64| {
        let size = if i == seq % 20 {
            1000 + seq
        } else {
            10 * (i + 1)
        };
        json!({
            "price": format!("{}.{:02}", 100 + side * 2 - i / 10, (i * 7) % 100),
            "size": size,
            "orders": i % 7 + 1,
        })
    };
    json!({
        "symbol": "HRLD-USD",
        "seq": seq,
        "ts": 1_700_000_000_000u64 + seq * 250,
        "bids": (0..25).map(|i| level(0, i)).collect::<Vec<_>>(),
        "asks": (0..25).map(|i| level(1, i)).collect::<Vec<_>>(),
    })
}

/// A delta subscriber's view of one channel: the text it holds and what it rebuilt.
#[derive(Default)]
struct Applier {
    base: Option<(u64, String)>,
    deltas: usize,
    fulls: usize,
    delta_bytes: usize,
}

impl Applier {
    /// Take one `pub` push; returns the publication's data as the subscriber rebuilt it.
    fn take(&mut self, p: &Value) -> Value {
        let offset = p["offset"].as_u64().expect("offset");
        let text = match p.get("delta").and_then(Value::as_bool) {
            // The plain form: the client holds no base for the next delta.
            None => {
                self.base = None;
                return p["data"].clone();
            }
            Some(false) => {
                self.fulls += 1;
                p["data"].as_str().expect("text").to_owned()
            }
            Some(true) => {
                let (held, base) = self.base.as_ref().unwrap_or_else(|| {
                    panic!("a delta at {offset} without a full publication before it")
                });
                assert_eq!(*held + 1, offset, "a delta against a publication not held");
                let delta = p["data"].as_str().expect("delta text");
                self.deltas += 1;
                self.delta_bytes += delta.len();
                let applied = fossil_delta::apply(base.as_bytes(), delta.as_bytes())
                    .unwrap_or_else(|e| panic!("the delta at {offset} does not apply: {e:?}"));
                String::from_utf8(applied).expect("UTF-8")
            }
        };
        let data = serde_json::from_str(&text).expect("the rebuilt text is JSON");
        self.base = Some((offset, text));
        data
    }
}

async fn subscribe_delta(c: &mut Client, channel: &str, extra: Value) -> Value {
    let mut params = json!({"channel": channel, "delta": "fossil"});
    params
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c.call("subscribe", params).await
}

/// The next `pub` of `channel` (other pushes skipped).
async fn next_pub(c: &mut Client, channel: &str) -> Value {
    loop {
        let m = c.next().await;
        if m["pub"]["channel"] == channel {
            return m["pub"].clone();
        }
    }
}

/// Two delta subscribers and a plain one on `book`; 60 order-book publications. Every rebuilt
/// publication equals the plain subscriber's, one delta is made per publication, and the deltas
/// are a small part of the full data.
async fn deltas_rebuild_every_publication(node: &Node) {
    let mut plain = node.connected(&["book"]).await;
    let mut first = node.client().await;
    first.call("connect", json!({})).await;
    let r = subscribe_delta(&mut first, "book", json!({})).await;
    assert_eq!(r["subscribe"]["delta"], true, "{r}");
    let mut second = node.client().await;
    second.call("connect", json!({})).await;
    subscribe_delta(&mut second, "book", json!({})).await;
    let computed_before = node.metric("herald_deltas_computed_total").await;

    const N: u64 = 60;
    for seq in 1..=N {
        node.publish("book", book(seq)).await;
    }
    let (mut a, mut b) = (Applier::default(), Applier::default());
    let mut full_bytes = 0;
    for seq in 1..=N {
        let expected = next_pub(&mut plain, "book").await;
        assert_eq!(expected["data"], book(seq));
        full_bytes += expected["data"].to_string().len();
        let pa = next_pub(&mut first, "book").await;
        let pb = next_pub(&mut second, "book").await;
        assert_eq!(pa, pb, "both delta subscribers get the same frame");
        assert_eq!(a.take(&pa), expected["data"], "seq {seq}");
        b.take(&pb);
    }
    assert_eq!(a.fulls, 1, "only the first publication goes full");
    assert_eq!(a.deltas as u64, N - 1);
    assert!(
        a.delta_bytes * 10 < full_bytes,
        "deltas {} bytes, full data {full_bytes}",
        a.delta_bytes
    );
    let computed = node.metric("herald_deltas_computed_total").await - computed_before;
    assert_eq!(
        computed,
        (N - 1) as f64,
        "one delta per publication, shared"
    );
}

#[tokio::test]
async fn deltas_rebuild_every_publication_on_the_memory_broker() {
    let node = Node::start(&["--dev"], &[ALLOW]).await;
    deltas_rebuild_every_publication(&node).await;
}

#[tokio::test]
async fn deltas_rebuild_every_publication_on_redis() {
    let redis = RedisServer::start();
    let node = Node::on_broker_with("n1", &redis.url(), &[ALLOW]).await;
    deltas_rebuild_every_publication(&node).await;
}

/// Publications made on node `a` reach a delta subscriber on node `b` through the broker: it
/// rebuilds every one of them (as a plain subscriber on `b` sees it) from one full publication
/// and deltas. It then reconnects to `b` with `since` after publications it missed: they are
/// recovered in full, the next live one goes full, and deltas resume after it.
async fn deltas_across_nodes(a: &Node, b: &Node) {
    let mut plain = b.connected(&["book"]).await;
    let mut c = b.client().await;
    c.call("connect", json!({})).await;
    let r = subscribe_delta(&mut c, "book", json!({})).await;
    assert_eq!(r["subscribe"]["delta"], true, "{r}");

    const N: u64 = 30;
    let mut epoch = Value::Null;
    for seq in 1..=N {
        epoch = a.publish("book", book(seq)).await["epoch"].clone();
    }
    let mut applier = Applier::default();
    let mut last = 0;
    for seq in 1..=N {
        let expected = next_pub(&mut plain, "book").await;
        assert_eq!(expected["data"], book(seq), "the plain subscriber on b");
        let p = next_pub(&mut c, "book").await;
        assert_eq!(applier.take(&p), book(seq), "seq {seq}: {p}");
        last = p["offset"].as_u64().unwrap();
    }
    assert_eq!(applier.fulls, 1, "only the first publication goes full");
    assert_eq!(applier.deltas as u64, N - 1, "every later one is a delta");
    drop(c);

    // Missed while away: recovered in full from the broker's history.
    for seq in N + 1..=N + 3 {
        a.publish("book", book(seq)).await;
    }
    let mut c = b.client().await;
    c.call("connect", json!({})).await;
    let r = subscribe_delta(
        &mut c,
        "book",
        json!({"since": {"epoch": epoch, "offset": last}}),
    )
    .await;
    let sub = &r["subscribe"];
    assert_eq!(sub["recovered"], true, "{r}");
    assert_eq!(sub["delta"], true, "{r}");
    let recovered = sub["publications"].as_array().expect("publications");
    assert_eq!(recovered.len(), 3, "{r}");
    for (p, seq) in recovered.iter().zip(N + 1..) {
        assert_eq!(p["data"], book(seq), "recovered in full");
        assert!(p.get("delta").is_none(), "{p}");
    }
    let mut applier = Applier::default();
    for seq in N + 4..=N + 6 {
        a.publish("book", book(seq)).await;
        let p = next_pub(&mut c, "book").await;
        let expect_delta = seq > N + 4;
        assert_eq!(p["delta"], expect_delta, "seq {seq}: {p}");
        assert_eq!(applier.take(&p), book(seq), "seq {seq}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_across_two_nodes_on_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .expect("start the Redis Cluster");
    let a = Node::on_broker_with("c1", &cluster.url(), &[ALLOW]).await;
    let b = Node::on_broker_with("c2", &cluster.url(), &[ALLOW]).await;
    deltas_across_nodes(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_across_two_nodes_on_nats() {
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start NATS");
    let a = Node::on_broker_with("n1", &nats.url(), &[ALLOW]).await;
    let b = Node::on_broker_with("n2", &nats.url(), &[ALLOW]).await;
    deltas_across_nodes(&a, &b).await;
}

#[tokio::test]
async fn a_namespace_without_allow_delta_refuses_it_and_unknown_types_are_bad_requests() {
    let cfg = config_file(
        "herald.toml",
        r#"
        [default_namespace]
        allow_delta = true
        [[namespaces]]
        name = "plain"
        subscribe = "anonymous"
        "#,
    );
    let node = Node::start(&["--dev", "--config", &cfg], &[]).await;
    let mut c = node.client().await;
    c.call("connect", json!({})).await;
    let r = subscribe_delta(&mut c, "plain:x", json!({})).await;
    assert_eq!(r["error"]["code"], 108, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allow_delta"),
        "{r}"
    );
    let r = c
        .call("subscribe", json!({"channel": "x", "delta": "xdelta"}))
        .await;
    assert_eq!(r["error"]["code"], 107, "{r}");
    // Not subscribed by the refusals: a plain subscribe still works.
    let r = c.call("subscribe", json!({"channel": "plain:x"})).await;
    assert!(r.get("subscribe").is_some(), "{r}");
    assert!(r["subscribe"].get("delta").is_none(), "{r}");
}

#[tokio::test]
async fn recovery_and_history_stay_full_and_the_first_live_publication_too() {
    let node = Node::start(&["--dev"], &[ALLOW]).await;
    let r = node.publish("book", book(1)).await;
    let epoch = r["epoch"].clone();
    node.publish("book", book(2)).await;
    node.publish("book", book(3)).await;

    let mut c = node.client().await;
    c.call("connect", json!({})).await;
    let r = subscribe_delta(
        &mut c,
        "book",
        json!({"since": {"epoch": epoch, "offset": 1}}),
    )
    .await;
    let sub = &r["subscribe"];
    assert_eq!(sub["recovered"], true, "{r}");
    assert_eq!(sub["delta"], true, "{r}");
    let recovered = sub["publications"].as_array().expect("publications");
    assert_eq!(recovered.len(), 2);
    for (p, seq) in recovered.iter().zip(2..) {
        assert_eq!(p["data"], book(seq), "recovered in full");
        assert!(p.get("delta").is_none(), "{p}");
    }

    let mut applier = Applier::default();
    node.publish("book", book(4)).await;
    let p = next_pub(&mut c, "book").await;
    assert_eq!(
        p["delta"], false,
        "the first live publication goes full: {p}"
    );
    assert_eq!(applier.take(&p), book(4));
    node.publish("book", book(5)).await;
    let p = next_pub(&mut c, "book").await;
    assert_eq!(p["delta"], true, "{p}");
    assert_eq!(applier.take(&p), book(5));

    let r = c
        .call("history", json!({"channel": "book", "limit": 10}))
        .await;
    let history = r["history"]["publications"].as_array().expect("history");
    assert_eq!(history.len(), 5, "{r}");
    for (p, seq) in history.iter().zip(1..) {
        assert_eq!(p["data"], book(seq), "history in full");
    }
}

/// A delta client that stops reading on a `conflate` namespace: its queue replaces waiting
/// publications with a `skip`, and the publication after each skip must come in full (a delta
/// there would be against one the client never got). Every publication it gets must rebuild.
#[tokio::test]
async fn after_a_skip_the_next_publication_is_full() {
    let node = Node::start(
        &["--dev"],
        &[
            ALLOW,
            ("HERALD_DEFAULT_NAMESPACE__BACKPRESSURE", "conflate"),
            ("HERALD_LIMITS__OUTBOUND_QUEUE_BYTES", "262144"),
            ("HERALD_LIMITS__WRITE_TIMEOUT_MS", "60000"),
        ],
    )
    .await;
    let mut reader = node.connected(&["ticker"]).await;
    let mut jammed = node.client().await;
    jammed.call("connect", json!({})).await;
    subscribe_delta(&mut jammed, "ticker", json!({})).await;

    // Similar enough for deltas of about 4 KB, large enough to fill the socket's buffers.
    const TOTAL: u64 = 1500;
    let data = |i: u64| {
        let fixed = "f".repeat(4000);
        let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let noise: String = (0..4000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect();
        json!({"i": i, "fixed": fixed, "noise": noise})
    };
    let reading = tokio::spawn(async move {
        let mut last = 0;
        while last < TOTAL {
            if let Some(p) = reader.next().await.get("pub") {
                last = p["offset"].as_u64().unwrap();
            }
        }
        reader
    });
    let api = node.api_handle();
    let publishing = tokio::spawn(async move {
        for i in 1..=TOTAL {
            api.publish("ticker", data(i)).await;
        }
    });
    herald_testkit::joined(publishing, Duration::from_secs(120), "the publisher").await;
    let _reader = herald_testkit::joined(reading, Duration::from_secs(60), "the reader").await;

    let mut applier = Applier::default();
    let (mut skips, mut after_skip, mut last) = (0, None::<u64>, 0);
    while let Some(m) = jammed.next_within(Duration::from_secs(1)).await {
        if let Some(s) = m.get("skip") {
            skips += 1;
            last = s["to"].as_u64().unwrap();
            after_skip = Some(last);
        } else if let Some(p) = m.get("pub") {
            let offset = p["offset"].as_u64().unwrap();
            assert_eq!(offset, last + 1, "in order, skips included");
            last = offset;
            if after_skip.take().is_some() {
                assert_eq!(p["delta"], false, "the publication after a skip: {p}");
            }
            assert_eq!(applier.take(p), data(offset), "offset {offset}");
        }
    }
    assert_eq!(last, TOTAL, "the jammed client reached the end");
    assert!(skips > 0, "the client was never jammed: nothing was shed");
    eprintln!(
        "jammed delta client: {skips} skips, {} deltas, {} full",
        applier.deltas, applier.fulls
    );
}

/// Measurement, not a check (`cargo test -p herald-server --test delta -- --ignored --nocapture
/// measure`): order-book publications (~2 KB, a few fields changed each; `MEASURE_PUBLICATIONS`,
/// default 200) to 50 subscribers on one node, four ways: plain, permessage-deflate only, delta
/// only, both, taken in turn `MEASURE_ROUNDS` times (default 1) so that a loaded machine weighs on
/// every mode alike. Prints the load average before each run, the TCP bytes the subscribers
/// received (WebSocket frames included) and the node's CPU time (user + system, from /proc) while
/// the publications went out. `HERALD_BIN` picks the binary (a release build for real numbers).
/// docs/benchmarks.md has the numbers.
#[tokio::test]
#[ignore = "a measurement; run by hand"]
async fn measure_bytes_and_cpu_plain_deflate_delta_both() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const SUBSCRIBERS: usize = 50;
    let knob = |name: &str, default: u64| {
        std::env::var(name).map_or(default, |v| v.parse().expect("a whole number"))
    };
    let publications = knob("MEASURE_PUBLICATIONS", 200);
    let rounds = knob("MEASURE_ROUNDS", 1);
    let mut node = Node::start(&["--dev"], &[ALLOW, ("HERALD_LIMITS__COMPRESSION", "true")]).await;
    let pid = node.process().id().expect("pid");
    let cpu_ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = after.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let ticks_per_s = 100.0; // USER_HZ on Linux

    let modes = [
        ("plain", false, false),
        ("deflate", true, false),
        ("delta", false, true),
        ("delta+deflate", true, true),
    ];
    for (round, (mode, deflate, delta)) in
        (1..=rounds).flat_map(|round| modes.iter().map(move |m| (round, *m)))
    {
        let channel = format!("book-{}-{round}", mode.replace('+', "-"));
        let mut readers = Vec::new();
        for _ in 0..SUBSCRIBERS {
            let mut tcp = TcpStream::connect(node.addr).await.unwrap();
            let ext = if deflate {
                "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            } else {
                ""
            };
            let req = format!(
                "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n",
                node.addr
            );
            tcp.write_all(req.as_bytes()).await.unwrap();
            let mut sub = json!({"channel": channel});
            if delta {
                sub["delta"] = json!("fossil");
            }
            for (id, cmd) in [(1, json!({"connect": {}})), (2, json!({"subscribe": sub}))] {
                let mut cmd = cmd;
                cmd["id"] = json!(id);
                let text = cmd.to_string();
                let mut f = vec![0x81];
                if text.len() < 126 {
                    f.push(0x80 | text.len() as u8);
                } else {
                    f.push(0x80 | 126);
                    f.extend_from_slice(&(text.len() as u16).to_be_bytes());
                }
                f.extend_from_slice(&[0, 0, 0, 0]); // a zero mask
                f.extend_from_slice(text.as_bytes());
                tcp.write_all(&f).await.unwrap();
            }
            readers.push(tcp);
        }
        // Let every subscribe be answered, then count from a clean slate.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for tcp in readers.iter_mut() {
            let mut sink = vec![0u8; 64 * 1024];
            while let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(20), tcp.read(&mut sink)).await
            {
                if n == 0 {
                    break;
                }
            }
        }
        let counting: Vec<_> = readers
            .into_iter()
            .map(|mut tcp| {
                tokio::spawn(async move {
                    let mut total = 0usize;
                    let mut buf = vec![0u8; 64 * 1024];
                    // Until the node stops sending for two seconds.
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut buf)).await
                    {
                        if n == 0 {
                            break;
                        }
                        total += n;
                    }
                    total
                })
            })
            .collect();
        let load = std::fs::read_to_string("/proc/loadavg").expect("loadavg");
        eprintln!("LOAD round {round} {mode}: {}", load.trim());
        let before = cpu_ticks();
        for seq in 1..=publications {
            node.publish(&channel, book(seq)).await;
        }
        let mut bytes = 0;
        for c in counting {
            bytes += herald_testkit::joined(c, Duration::from_secs(60), "a reader").await;
        }
        let cpu = (cpu_ticks() - before) as f64 / ticks_per_s;
        let per_pub = bytes as f64 / (SUBSCRIBERS as f64 * publications as f64);
        eprintln!(
            "MEASURE round {round} {mode:>14}: {bytes:>9} bytes to {SUBSCRIBERS} subscribers, {per_pub:>7.1} per delivery, node CPU {cpu:.2} s"
        );
    }
}
