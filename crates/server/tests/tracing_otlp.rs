//! Tracing from publish to delivery (`[tracing]`): three nodes on one Redis, or on one NATS,
//! export their spans over OTLP/HTTP to a receiver in this test, which decodes them with the
//! official `opentelemetry-proto` messages. One API publish with a `traceparent` header makes one
//! trace across the three nodes, down to the sampled writes to connections; with tracing off
//! nothing is exported and publications carry nothing.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use herald_testkit::eventually_some;
use herald_testkit::nats::NatsServer;
use herald_testkit::redis::RedisServer;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(30);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// One exported span, flattened: what the assertions look at.
#[derive(Debug, Clone)]
struct Exported {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    /// The exporting node (`service.instance.id` of its resource).
    node: String,
    attributes: HashMap<String, String>,
}

/// An OTLP/HTTP trace receiver on a free port: every span posted to `/v1/traces`.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Exported>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let store = spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let store = store.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let store = store.clone();
                        async move { Ok::<_, hyper::Error>(receive(req, &store).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver { addr, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }
}

async fn receive(
    req: Request<hyper::body::Incoming>,
    store: &Mutex<Vec<Exported>>,
) -> Response<Full<Bytes>> {
    let path_ok = req.uri().path() == "/v1/traces";
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let decoded = body
        .ok()
        .and_then(|b| ExportTraceServiceRequest::decode(b).ok());
    let (Some(request), true) = (decoded, path_ok) else {
        return Response::builder()
            .status(400)
            .body(Full::new(Bytes::new()))
            .unwrap();
    };
    let mut spans = store.lock().unwrap();
    for resource_spans in request.resource_spans {
        let node = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .and_then(|mut a| a.remove("service.instance.id"))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Exported {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    node: node.clone(),
                    attributes: attributes(&span.attributes),
                });
            }
        }
    }
    Response::builder()
        .status(200)
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Publish through `/api/publish` on `node`, with `traceparent` as a header when given.
async fn publish(node: &Node, channel: &str, traceparent: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{}/api/publish", node.addr))
        .bearer_auth(API_KEY)
        .timeout(WAIT)
        .json(&json!({"channel": channel, "data": {"text": "traced"}}));
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let res = req.send().await.expect("publish request");
    let status = res.status().as_u16();
    (status, res.text().await.expect("publish body"))
}

/// The next publication pushed to `client`, past join and leave pushes (each wait bounded by
/// the client's own timeout).
async fn next_pub(client: &mut Client) -> serde_json::Value {
    loop {
        let push = client.next().await;
        if let Some(publication) = push.get("pub") {
            return publication.clone();
        }
        assert!(
            push.get("join").is_some() || push.get("leave").is_some(),
            "{push}"
        );
    }
}

/// A raw RESP subscriber to a herald channel's Redis pub/sub channel: the first field of the next
/// publication message (`p`, or `p,<traceparent>`).
struct PubSubTap(TcpStream);

impl PubSubTap {
    async fn open(redis: &RedisServer, channel: &str) -> PubSubTap {
        let mut stream = TcpStream::connect(redis.addr()).await.expect("redis");
        let name = format!("herald:{{{channel}}}:p");
        let cmd = format!("*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{name}\r\n", name.len());
        stream.write_all(cmd.as_bytes()).await.expect("subscribe");
        let mut tap = PubSubTap(stream);
        tap.read_until(|buf| buf.ends_with(b":1\r\n")).await;
        tap
    }

    async fn read_until(&mut self, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let mut buf = Vec::new();
        let read = async {
            while !done(&buf) {
                let mut chunk = [0u8; 4096];
                let n = self.0.read(&mut chunk).await.expect("redis read");
                assert!(n > 0, "redis closed the subscription");
                buf.extend_from_slice(&chunk[..n]);
            }
        };
        tokio::time::timeout(WAIT, read)
            .await
            .expect("nothing arrived on the redis pub/sub channel in time");
        buf
    }

    /// The first field of the next publication.
    async fn next_first_field(&mut self) -> String {
        let buf = self
            .read_until(|b| String::from_utf8_lossy(b).contains("\"traced\"}"))
            .await;
        let text = String::from_utf8_lossy(&buf).into_owned();
        // `*3 $7 message $n <channel> $n <payload>`: the payload is the last bulk string.
        let payload = text.rsplit("\r\n$").next().expect("payload");
        let payload = payload.split_once("\r\n").expect("bulk length").1;
        payload.split(' ').next().expect("first field").to_owned()
    }
}

/// Node a's subscribers of the traced channel (b and c have one each); with `write_spans` 2,
/// two of them get a `write` span.
const SUBSCRIBERS_ON_A: usize = 3;
const WRITE_SPANS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_publication_is_one_trace_across_three_nodes() {
    let redis = RedisServer::start();
    one_trace_across_three_nodes(&redis.url(), Some(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_publication_is_one_trace_across_three_nodes_on_nats() {
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start NATS");
    one_trace_across_three_nodes(&nats.url(), None).await;
}

/// Three traced nodes on `broker_url`; `redis`, when the broker is Redis, to check what its
/// pub/sub message carries.
async fn one_trace_across_three_nodes(broker_url: &str, redis: Option<&RedisServer>) {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let write_spans = WRITE_SPANS.to_string();
    let env = [
        ("HERALD_TRACING__OTLP_ENDPOINT", endpoint.as_str()),
        ("HERALD_TRACING__WRITE_SPANS", write_spans.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let a = Node::on_broker_with("a", broker_url, &env).await;
    let b = Node::on_broker_with("b", broker_url, &env).await;
    let c = Node::on_broker_with("c", broker_url, &env).await;
    let ch = format!("traced-{:08x}", rand::random::<u32>());
    let mut subscribers = Vec::new();
    for node in std::iter::repeat_n(&a, SUBSCRIBERS_ON_A).chain([&b, &c]) {
        subscribers.push(node.subscriber(json!({ &ch: {} })).await);
    }
    let mut tap = match redis {
        Some(redis) => Some(PubSubTap::open(redis, &ch).await),
        None => None,
    };

    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let (status, body) = publish(&a, &ch, Some(&traceparent)).await;
    assert_eq!(status, 200, "{body}");
    for sub in &mut subscribers {
        assert_eq!(next_pub(sub).await["data"]["text"], "traced");
    }
    let first = match &mut tap {
        Some(tap) => Some(tap.next_first_field().await),
        None => None,
    };
    if let Some(first) = &first {
        assert!(
            first.starts_with(&format!("p,00-{TRACE_ID}-")) && first.ends_with("-01"),
            "the broker message carries the broker span's traceparent: {first}"
        );
    }

    // publish (a) ← broker.publish (a) ← fanout on a, b and c ← write (2 on a, 1 on b and c).
    let writes = WRITE_SPANS + 2;
    let spans = eventually_some(WAIT, "the spans of all three nodes", || async {
        let spans: Vec<Exported> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == TRACE_ID)
            .collect();
        let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
        let has = |name: &str| count(name) > 0;
        (count("fanout") == 3
            && count("write") == writes
            && has("publish")
            && has("broker.publish"))
        .then_some(spans)
    })
    .await;
    let one = |name: &str| {
        let found: Vec<&Exported> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
        found[0].clone()
    };
    let publish_span = one("publish");
    assert_eq!(publish_span.parent, CALLER_SPAN, "{publish_span:?}");
    assert_eq!(publish_span.node, "a");
    assert_eq!(publish_span.attributes["messaging.destination.name"], ch);
    let broker_span = one("broker.publish");
    assert_eq!(broker_span.parent, publish_span.span_id, "{broker_span:?}");
    if let Some(first) = &first {
        assert!(
            first.contains(&broker_span.span_id),
            "{first} names {broker_span:?}"
        );
    }
    let mut fanout_nodes: Vec<String> = Vec::new();
    for fanout in spans.iter().filter(|s| s.name == "fanout") {
        assert_eq!(fanout.parent, broker_span.span_id, "{fanout:?}");
        assert_eq!(fanout.attributes["messaging.destination.name"], ch);
        assert_eq!(fanout.attributes["herald.node"], fanout.node, "{fanout:?}");
        let (subscribers, writes) = match fanout.node.as_str() {
            "a" => (SUBSCRIBERS_ON_A, WRITE_SPANS),
            _ => (1, 1),
        };
        assert_eq!(
            fanout.attributes["herald.subscribers"],
            subscribers.to_string(),
            "{fanout:?}"
        );
        assert_eq!(
            fanout.attributes["herald.write_spans"],
            writes.to_string(),
            "{fanout:?}"
        );
        let under: Vec<&Exported> = spans
            .iter()
            .filter(|s| s.name == "write" && s.parent == fanout.span_id)
            .collect();
        assert_eq!(under.len(), writes, "{fanout:?}: {spans:#?}");
        for write in under {
            assert_eq!(write.node, fanout.node, "{write:?}");
            assert_eq!(write.attributes["messaging.destination.name"], ch);
            let by = &write.attributes["herald.write.by"];
            assert!(by == "direct" || by == "task", "{write:?}");
        }
        fanout_nodes.push(fanout.node.clone());
    }
    fanout_nodes.sort();
    assert_eq!(fanout_nodes, ["a", "b", "c"]);

    // A publish without a traceparent starts a trace of its own (sample_ratio 1).
    let (status, body) = publish(&b, &ch, None).await;
    assert_eq!(status, 200, "{body}");
    for sub in &mut subscribers {
        next_pub(sub).await;
    }
    if let Some(tap) = &mut tap {
        let first = tap.next_first_field().await;
        assert!(first.starts_with("p,00-"), "a traced publication: {first}");
        assert!(!first.contains(TRACE_ID), "a trace of its own: {first}");
    }
    eventually_some(
        WAIT,
        "the new trace's publish on b and fan-out on all three nodes",
        || async {
            let spans = receiver.spans();
            let own = spans
                .iter()
                .find(|s| s.name == "publish" && s.node == "b" && s.parent.is_empty())?;
            assert_ne!(own.trace_id, TRACE_ID);
            let fanouts = spans
                .iter()
                .filter(|s| s.trace_id == own.trace_id && s.name == "fanout")
                .count();
            (fanouts == 3).then_some(())
        },
    )
    .await;

    // A traceparent that is not one is refused, and nothing is published.
    let (status, body) = publish(&a, &ch, Some("00-nothex-01")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("traceparent"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_off_exports_nothing_and_adds_nothing_to_the_broker_message() {
    let receiver = Receiver::start().await;
    let redis = RedisServer::start();
    // Told where the receiver is through the standard variable, which Herald does not read
    // without `[tracing]`.
    let endpoint = receiver.endpoint();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let a = Node::on_broker_with("a", &redis.url(), &env).await;
    let b = Node::on_broker_with("b", &redis.url(), &env).await;
    let ch = format!("untraced-{:08x}", rand::random::<u32>());
    let mut on_b = b.subscriber(json!({ &ch: {} })).await;
    let mut tap = PubSubTap::open(&redis, &ch).await;

    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let (status, body) = publish(&a, &ch, Some(&traceparent)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(next_pub(&mut on_b).await["data"]["text"], "traced");
    assert_eq!(tap.next_first_field().await, "p");
    // A malformed header is not even read.
    let (status, body) = publish(&a, &ch, Some("garbage")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tap.next_first_field().await, "p");
    // An exporter's batch goes out within its 5 s default delay: none came.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(receiver.spans().is_empty(), "{:?}", receiver.spans());
}

/// Pusher clients get publications from the fan-out's direct writes (crate::pusher::direct):
/// the sampled `write` spans of a traced publication to a Pusher channel say `direct` (they said
/// `task` while every delivery woke the connection's task). The socket the publication excludes
/// (`socket_id`) still gets nothing, and the other one the event as the task would send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pusher_clients_get_publications_from_the_fanout_directly() {
    let redis = RedisServer::start();
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let env = [
        ("HERALD_TRACING__OTLP_ENDPOINT", endpoint.as_str()),
        ("HERALD_TRACING__WRITE_SPANS", "2"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("HERALD_PUSHER_APP_ID", "7"),
        ("HERALD_PUSHER_APP_KEY", "app-key"),
        ("HERALD_PUSHER_APP_SECRET", "app-secret"),
    ];
    // The `pusher` namespace lets Herald's API publish to the app's channels (docs/pusher.md).
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        "[[namespaces]]\nname = \"pusher\"\nsubscribe = \"anonymous\"\n",
    )
    .expect("write config");
    let mut env = env.to_vec();
    let url = redis.url();
    env.extend([
        ("HERALD_BROKER_URL", url.as_str()),
        ("HERALD_NODE_NAME", "p"),
    ]);
    let node = Node::start(&["--dev", "--config", config.to_str().unwrap()], &env).await;
    let mut clients = Vec::new();
    for _ in 0..2 {
        let tcp = TcpStream::connect(node.addr).await.expect("tcp connect");
        let url = format!("ws://{}/app/app-key?protocol=7", node.addr);
        let mut c = Client::open_on(Box::new(tcp), &url, &[])
            .await
            .expect("ws handshake");
        let hello = c.next().await;
        assert_eq!(hello["event"], "pusher:connection_established", "{hello}");
        let data: serde_json::Value =
            serde_json::from_str(hello["data"].as_str().expect("a string")).unwrap();
        let socket_id = data["socket_id"].as_str().unwrap().to_owned();
        c.send_raw(&json!({"event": "pusher:subscribe", "data": {"channel": "news"}}).to_string())
            .await;
        let ok = c.next().await;
        assert_eq!(
            ok["event"], "pusher_internal:subscription_succeeded",
            "{ok}"
        );
        clients.push((c, socket_id));
    }

    // Through Herald's API, in the envelope the Pusher API stores (docs/pusher.md), excluding
    // the first client, as a trigger with its `socket_id` does.
    let excluded = clients[0].1.clone();
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let res = reqwest::Client::new()
        .post(format!("http://{}/api/publish", node.addr))
        .bearer_auth(API_KEY)
        .timeout(WAIT)
        .header("traceparent", &traceparent)
        .json(&json!({"channel": "pusher:7:news",
            "data": {"event": "e", "data": "x", "exclude": excluded}}))
        .send()
        .await
        .expect("publish");
    let status = res.status().as_u16();
    assert_eq!(status, 200, "{}", res.text().await.unwrap_or_default());
    let got = clients[1].0.next().await;
    assert_eq!(
        got,
        json!({"event": "e", "channel": "news", "data": "x"}),
        "the event as before, no herald_offset"
    );
    assert!(
        clients[0]
            .0
            .next_within(Duration::from_millis(300))
            .await
            .is_none(),
        "the excluded socket gets nothing"
    );

    let writes = eventually_some(WAIT, "the write spans of both subscribers", || async {
        let writes: Vec<Exported> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == TRACE_ID && s.name == "write")
            .collect();
        (writes.len() == 2).then_some(writes)
    })
    .await;
    let by: Vec<&str> = writes
        .iter()
        .map(|w| w.attributes["herald.write.by"].as_str())
        .collect();
    // Both idle: the fan-out writes each itself (`task` only when a socket is busy, which two
    // idle clients almost never are at once).
    assert!(by.contains(&"direct"), "write spans by {by:?}");

    // The excluded client is still subscribed: the next publication reaches it.
    let res = reqwest::Client::new()
        .post(format!("http://{}/api/publish", node.addr))
        .bearer_auth(API_KEY)
        .timeout(WAIT)
        .json(&json!({"channel": "pusher:7:news", "data": {"event": "f", "data": {"n": 2}}}))
        .send()
        .await
        .expect("publish");
    assert_eq!(res.status().as_u16(), 200);
    for (c, _) in &mut clients {
        assert_eq!(
            c.next().await,
            json!({"event": "f", "channel": "news", "data": {"n": 2}})
        );
    }
}
