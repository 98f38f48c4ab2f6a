//! A Herald node as a turmoil host: the real [`Hub`] and [`Session`]s of `herald-core` over the
//! simulated broker, with a connection driver that does what the server's engine does for a
//! Herald WebSocket (`crates/server/src/engine`): the client's messages go to
//! [`Session::handle`], and whatever the session and the hub queue on the connection's
//! [`Outbound`] goes back to the client, controls first handled by the session. A crash of the
//! host drops its runtime: every task of the node ends at once, as with `kill -9`.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use herald_broker::{PublishOptions, SharedBroker};
use herald_core::auth::TokenVerifier;
use herald_core::config::{Config, NamespaceConfig, SubscribePolicy};
use herald_core::namespace::Namespaces;
use herald_core::outbound::CloseRequest;
use herald_core::{Hub, Metrics, NodeContext, Outbound, Session};
use herald_protocol::command::parse_frame;
use herald_protocol::{CloseCode, StreamPosition};
use tokio::sync::{mpsc, oneshot};

use crate::broker::{NodeBroker, NodeOptions, Server};

/// What a client receives over its connection.
#[derive(Debug)]
pub enum Frame {
    /// One message from the node.
    Text(Bytes),
    /// The node closed the connection with this code.
    Closed(u16),
}

/// What reaches a node from outside.
pub enum NodeRequest {
    /// A client connection: its messages in, the node's frames out. Dropping either end is a
    /// connection reset.
    Connect {
        from_client: mpsc::UnboundedReceiver<String>,
        to_client: mpsc::UnboundedSender<Frame>,
    },
    /// An HTTP API publish.
    Publish {
        channel: String,
        data: Bytes,
        idempotency_key: String,
        reply: oneshot::Sender<Result<StreamPosition, String>>,
    },
}

/// A live node's door: its requests and its drain switch.
type Door = (mpsc::UnboundedSender<NodeRequest>, Arc<Drain>);

/// A node's drain switch: closes its connections with 4000 in the order they connected, and every
/// later one as it arrives. (Not a `tokio::sync::watch`: its receivers wait on one of eight
/// `Notify`s picked by tokio's per-runtime random source, which no seed fixes, so the order in
/// which the connections woke, and left their channels at the broker, changed from run to run.)
#[derive(Default)]
pub struct Drain {
    state: Mutex<(bool, Vec<Weak<Outbound>>)>,
}

impl Drain {
    fn close(out: &Outbound) {
        out.close(CloseRequest {
            code: CloseCode::SHUTDOWN,
            reason: "node draining".into(),
            after_ms: Some(0),
        });
    }

    /// Start draining: every connection is closed.
    fn start(&self) {
        let mut s = self.state.lock().expect("drain");
        s.0 = true;
        for out in std::mem::take(&mut s.1) {
            if let Some(out) = out.upgrade() {
                Drain::close(&out);
            }
        }
    }

    /// A new connection: closed at once while draining.
    fn add(&self, out: &Arc<Outbound>) {
        let mut s = self.state.lock().expect("drain");
        if s.0 {
            Drain::close(out);
        } else {
            s.1.retain(|o| o.strong_count() > 0);
            s.1.push(Arc::downgrade(out));
        }
    }
}

/// Where the live nodes take requests; the workload looks nodes up here.
#[derive(Default)]
pub struct Registry {
    nodes: Mutex<Vec<Option<Door>>>,
}

impl Registry {
    /// A registry for `n` nodes.
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Registry {
            nodes: Mutex::new((0..n).map(|_| None).collect()),
        })
    }

    fn set(&self, i: usize, tx: mpsc::UnboundedSender<NodeRequest>, drain: Arc<Drain>) {
        self.nodes.lock().expect("registry")[i] = Some((tx, drain));
    }

    /// Send a request to node `i`; false when it is not serving (crashed, not started yet).
    pub fn send(&self, i: usize, req: NodeRequest) -> bool {
        let nodes = self.nodes.lock().expect("registry");
        match &nodes[i] {
            Some((tx, _)) => tx.send(req).is_ok(),
            None => false,
        }
    }

    /// Start draining node `i`: its clients get close 4000.
    pub fn drain(&self, i: usize) {
        if let Some((_, d)) = &self.nodes.lock().expect("registry")[i] {
            d.start();
        }
    }
}

/// The namespace every simulated channel lives in: anonymous subscribe and publish, a short
/// history (trimmed by size and age in a run), no presence.
pub fn sim_config(history_size: usize, history_ttl_s: u64) -> Config {
    let mut config = Config {
        allow_anonymous: true,
        node_name: String::new(),
        ..Config::default()
    };
    config.default_namespace = NamespaceConfig {
        subscribe: SubscribePolicy::Anonymous,
        publish: true,
        history: true,
        history_size,
        history_ttl_s,
        ..NamespaceConfig::default()
    };
    // Simulated time runs far faster than the real clock the command rate limit reads.
    config.limits.commands_per_second = 1_000_000;
    config.limits.command_burst = 1_000_000;
    config
}

/// The software of node `i`: connect to the broker, start the hub, serve.
pub async fn node_main(
    i: usize,
    server: Arc<Server>,
    registry: Arc<Registry>,
    options: NodeOptions,
    config: Config,
) -> turmoil::Result {
    let name = format!("n{i}");
    let broker = NodeBroker::new(&name, server, options);
    let hub = Hub::new(
        name.clone(),
        broker as SharedBroker,
        Arc::new(Metrics::new()),
    );
    hub.start().await?;
    let mut config = config;
    config.node_name = name;
    let ctx = Arc::new(NodeContext {
        hub: hub.clone(),
        namespaces: Namespaces::from_config(&config),
        verifier: TokenVerifier::from_config(&config)?,
        config: herald_core::live::LiveConfig::new(config),
        proxy: None,
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let drain = Arc::new(Drain::default());
    registry.set(i, tx, drain.clone());
    while let Some(req) = rx.recv().await {
        match req {
            NodeRequest::Connect {
                from_client,
                to_client,
            } => {
                tokio::spawn(connection(
                    ctx.clone(),
                    from_client,
                    to_client,
                    drain.clone(),
                ));
            }
            NodeRequest::Publish {
                channel,
                data,
                idempotency_key,
                reply,
            } => {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let _ = reply.send(api_publish(&ctx, &channel, data, idempotency_key).await);
                });
            }
        }
    }
    Ok(())
}

/// `POST /api/publish` with an idempotency key, as `crates/server/src/publishing.rs` does it.
async fn api_publish(
    ctx: &NodeContext,
    channel: &str,
    data: Bytes,
    key: String,
) -> Result<StreamPosition, String> {
    let ns = ctx.namespaces.resolve(channel).map_err(|e| e.to_string())?;
    let opts = PublishOptions {
        stream: ns.stream_options(),
        idempotency_key: Some(key),
        traceparent: None,
        tags: Default::default(),
        skip_history: false,
    };
    ctx.hub
        .publish(channel, data, None, &opts)
        .await
        .map_err(|e| e.to_string())
}

/// One client connection, as the server's engine drives it: what is queued goes out first; a
/// message from the client is handled by the session; controls from the hub are handled by the
/// session before the frames queued with them are written; draining closes with 4000.
async fn connection(
    ctx: Arc<NodeContext>,
    mut from_client: mpsc::UnboundedReceiver<String>,
    to_client: mpsc::UnboundedSender<Frame>,
    drain: Arc<Drain>,
) {
    let limit = ctx.config.limits.outbound_queue_bytes;
    let out = Arc::new(Outbound::new(limit));
    drain.add(&out);
    let mut session = Session::new(ctx.clone(), out.clone());
    let closed: Option<CloseRequest> = loop {
        tokio::select! {
            biased;
            _ = out.ready() => {
                let drained = out.drain();
                if drained.busy {
                    continue;
                }
                if !drained.controls.is_empty() {
                    session.handle_controls(drained.controls).await;
                }
                for frame in drained.frames {
                    if to_client.send(Frame::Text(frame)).is_err() {
                        break;
                    }
                }
                out.written();
                if let Some(close) = drained.close {
                    break Some(close);
                }
            }
            message = from_client.recv() => {
                let Some(text) = message else { break None };
                let mut close = None;
                for message in parse_frame(&text) {
                    let Ok(message) = message else {
                        close = Some(CloseRequest {
                            code: CloseCode::BAD_REQUEST,
                            reason: "malformed".into(),
                            after_ms: None,
                        });
                        break;
                    };
                    if let Some(c) = session.handle(message).await {
                        close = Some(c);
                        break;
                    }
                }
                if let Some(c) = close {
                    for frame in out.drain().frames {
                        let _ = to_client.send(Frame::Text(frame));
                    }
                    break Some(c);
                }
            }
        }
    };
    if let Some(close) = closed {
        let _ = to_client.send(Frame::Closed(close.code.0));
    }
    session.end().await;
}
