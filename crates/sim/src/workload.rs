//! The clients and publishers of a run, all on one turmoil client host.
//!
//! A subscriber behaves as the SDK does: it connects to a random live node, subscribes to its
//! channels (with `since` = the position it holds, once it holds one), resubscribes with `since`
//! after `unsub` 4003, reconnects after a reset or a close (a drain's 4000 included), and now and
//! then drops its connection or unsubscribes by itself. It logs everything it sees
//! ([`crate::checker::Event`]). A publisher publishes through the HTTP API of a random node with
//! an idempotency key, retrying (on any node) until acknowledged or it gives up; what was
//! acknowledged is logged as an [`Ack`]. Each draws from its own random stream, so one actor's
//! choices never shift another's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::checker::{Ack, ClientLog, Event};
use crate::node::{Frame, NodeRequest, Registry};
use crate::rng::Rng;

/// The shape of a run's workload.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub nodes: usize,
    pub clients: usize,
    pub publishers: usize,
    pub channels: Vec<String>,
    /// Faults and client chaos stop here.
    pub chaos_ms: u64,
    /// The last publication per channel is published here.
    pub final_ms: u64,
    /// The run ends here.
    pub end_ms: u64,
}

/// What the workload leaves behind.
#[derive(Default)]
pub struct Outcome {
    pub logs: Mutex<Vec<ClientLog>>,
    pub acks: Mutex<Vec<Ack>>,
    /// Publishes given up on (never acknowledged).
    pub unacked: Mutex<u64>,
}

/// Run every client and publisher to the end of the plan.
pub async fn run(plan: Plan, registry: Arc<Registry>, outcome: Arc<Outcome>) -> turmoil::Result {
    let start = Instant::now();
    let subs = {
        let (plan, registry) = (plan.clone(), registry.clone());
        tokio::spawn(async move { subscribers(plan, registry, start).await })
    };
    let mut pubs = Vec::new();
    for i in 0..plan.publishers {
        let (plan, registry, outcome) = (plan.clone(), registry.clone(), outcome.clone());
        pubs.push(tokio::spawn(async move {
            publisher(i, plan, registry, outcome, start).await
        }));
    }
    for t in pubs {
        t.await?;
    }
    let logs = subs.await?;
    *outcome.logs.lock().expect("logs") = logs;
    Ok(())
}

fn ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

struct Conn {
    tx: mpsc::UnboundedSender<String>,
    rx: mpsc::UnboundedReceiver<Frame>,
}

#[derive(Debug, Clone, PartialEq)]
enum SubState {
    Idle,
    Subscribing(u64),
    Live,
    Leaving(u64),
}

struct Sub {
    state: SubState,
    /// The position the client holds.
    pos: Option<(String, u64)>,
    /// Not before then (after an unsub, a refusal or the client's own unsubscribe).
    not_before: u64,
}

/// One subscriber's state; the driver runs every subscriber in index order, so that the order in
/// which the nodes' tasks happened to send never changes what a client does.
struct Subscriber {
    rng: Rng,
    log: ClientLog,
    subs: BTreeMap<String, Sub>,
    conn: Option<Conn>,
    next_id: u64,
    next_action: u64,
}

impl Subscriber {
    fn new(i: usize, plan: &Plan) -> Self {
        let mut rng = Rng::new(plan.seed, &format!("client{i}"));
        // Each client wants one to all of the channels.
        let mut subs: BTreeMap<String, Sub> = BTreeMap::new();
        let first = rng.pick(plan.channels.len());
        for (n, ch) in plan.channels.iter().enumerate() {
            if n == first || rng.chance(0.5) {
                subs.insert(
                    ch.clone(),
                    Sub {
                        state: SubState::Idle,
                        pos: None,
                        not_before: 0,
                    },
                );
            }
        }
        let next_action = rng.range(0, 300);
        Subscriber {
            rng,
            log: ClientLog {
                client: format!("c{i}"),
                events: Vec::new(),
            },
            subs,
            conn: None,
            next_id: 1,
            next_action,
        }
    }

    /// Take every frame that arrived.
    fn receive(&mut self, now: u64) {
        loop {
            let Some(c) = self.conn.as_mut() else { return };
            match c.rx.try_recv() {
                Ok(Frame::Text(bytes)) => {
                    on_text(&bytes, now, &mut self.subs, &mut self.log, &mut self.rng);
                }
                Ok(Frame::Closed(code)) => {
                    self.log
                        .events
                        .push((now, Event::Disconnected { code: Some(code) }));
                    self.conn = None;
                    idle_all(&mut self.subs);
                    self.next_action = now + self.rng.range(0, 200);
                }
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.log
                        .events
                        .push((now, Event::Disconnected { code: None }));
                    self.conn = None;
                    idle_all(&mut self.subs);
                    self.next_action = now + self.rng.range(50, 500);
                }
            }
        }
    }

    /// Act, when due: connect, drop the connection, unsubscribe, (re)subscribe.
    fn act(&mut self, now: u64, plan: &Plan, registry: &Registry) {
        if now < self.next_action {
            return;
        }
        let rng = &mut self.rng;
        let chaos = now < plan.chaos_ms;
        self.next_action = now + rng.range(20, 300);
        let Some(c) = self.conn.as_ref() else {
            // Connect to a random node; a node that is down refuses.
            let node = rng.pick(plan.nodes);
            let (to_node, from_client) = mpsc::unbounded_channel();
            let (to_client, from_node) = mpsc::unbounded_channel();
            if registry.send(
                node,
                NodeRequest::Connect {
                    from_client,
                    to_client,
                },
            ) {
                self.log.events.push((now, Event::Connected { node }));
                let _ = to_node.send(r#"{"id":1,"connect":{}}"#.to_owned());
                self.conn = Some(Conn {
                    tx: to_node,
                    rx: from_node,
                });
                self.next_action = now;
            } else {
                self.next_action = now + rng.range(100, 400);
            }
            return;
        };
        if chaos && rng.chance(0.03) {
            // Drop the connection (a network reset seen from the client).
            self.log
                .events
                .push((now, Event::Disconnected { code: None }));
            self.conn = None;
            idle_all(&mut self.subs);
            self.next_action = now + rng.range(0, 500);
            return;
        }
        let live: Vec<String> = self
            .subs
            .iter()
            .filter(|(_, s)| s.state == SubState::Live)
            .map(|(c, _)| c.clone())
            .collect();
        if chaos && !live.is_empty() && rng.chance(0.03) {
            let channel = live[rng.pick(live.len())].clone();
            self.next_id += 1;
            let id = self.next_id;
            let _ = c.tx.send(format!(
                r#"{{"id":{id},"unsubscribe":{{"channel":"{channel}"}}}}"#
            ));
            let s = self.subs.get_mut(&channel).expect("sub");
            s.state = SubState::Leaving(id);
            s.not_before = now + rng.range(100, 2000);
            return;
        }
        for (channel, s) in self.subs.iter_mut() {
            if s.state != SubState::Idle || s.not_before > now {
                continue;
            }
            self.next_id += 1;
            let id = self.next_id;
            let since = s.pos.clone();
            let since_json = match &since {
                Some((e, o)) => format!(r#","since":{{"epoch":"{e}","offset":{o}}}"#),
                None => String::new(),
            };
            let _ = c.tx.send(format!(
                r#"{{"id":{id},"subscribe":{{"channel":"{channel}"{since_json}}}}}"#
            ));
            self.log.events.push((
                now,
                Event::Subscribing {
                    channel: channel.clone(),
                    since,
                },
            ));
            s.state = SubState::Subscribing(id);
        }
    }
}

/// Every subscriber, one simulated millisecond at a time, in index order.
async fn subscribers(plan: Plan, registry: Arc<Registry>, start: Instant) -> Vec<ClientLog> {
    let mut clients: Vec<Subscriber> = (0..plan.clients)
        .map(|i| Subscriber::new(i, &plan))
        .collect();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    loop {
        tick.tick().await;
        let now = ms(start);
        if now >= plan.end_ms {
            break;
        }
        for c in clients.iter_mut() {
            c.receive(now);
        }
        for c in clients.iter_mut() {
            c.act(now, &plan, &registry);
        }
    }
    clients.into_iter().map(|c| c.log).collect()
}

fn idle_all(subs: &mut BTreeMap<String, Sub>) {
    for s in subs.values_mut() {
        s.state = SubState::Idle;
    }
}

fn on_text(
    bytes: &Bytes,
    now: u64,
    subs: &mut BTreeMap<String, Sub>,
    log: &mut ClientLog,
    rng: &mut Rng,
) {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return;
    };
    if let Some(p) = v.get("pub") {
        let channel = p["channel"].as_str().unwrap_or_default().to_owned();
        let offset = p["offset"].as_u64().unwrap_or_default();
        let data = p["data"].to_string();
        if let Some(s) = subs.get_mut(&channel) {
            if let Some(pos) = s.pos.as_mut() {
                pos.1 = offset;
            }
        }
        log.events.push((
            now,
            Event::Pub {
                channel,
                offset,
                data,
            },
        ));
        return;
    }
    if let Some(u) = v.get("unsub") {
        let channel = u["channel"].as_str().unwrap_or_default().to_owned();
        let code = u["code"].as_u64().unwrap_or_default() as u16;
        if let Some(s) = subs.get_mut(&channel) {
            s.state = SubState::Idle;
            s.not_before = now + rng.range(0, 300);
        }
        log.events.push((now, Event::Unsub { channel, code }));
        return;
    }
    let Some(id) = v.get("id").and_then(Value::as_u64) else {
        return;
    };
    let Some((channel, state)) = subs
        .iter()
        .find(
            |(_, s)| matches!(s.state, SubState::Subscribing(n) | SubState::Leaving(n) if n == id),
        )
        .map(|(c, s)| (c.clone(), s.state.clone()))
    else {
        return;
    };
    let s = subs.get_mut(&channel).expect("sub");
    if let SubState::Leaving(_) = state {
        s.state = SubState::Idle;
        log.events.push((now, Event::Left { channel }));
        return;
    }
    if let Some(e) = v.get("error") {
        let code = e["code"].as_u64().unwrap_or_default() as u16;
        s.state = SubState::Idle;
        s.not_before = now + rng.range(100, 500);
        log.events
            .push((now, Event::SubscribeFailed { channel, code }));
        return;
    }
    let r = &v["subscribe"];
    let epoch = r["epoch"].as_str().unwrap_or_default().to_owned();
    let offset = r["offset"].as_u64().unwrap_or_default();
    let recovered = r.get("recovered").and_then(Value::as_bool);
    let publications: Vec<(u64, String)> = r
        .get("publications")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["offset"].as_u64().unwrap_or_default(),
                        p["data"].to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let last = publications
        .last()
        .map_or(offset, |(o, _)| (*o).max(offset));
    s.pos = Some((epoch.clone(), last));
    s.state = SubState::Live;
    log.events.push((
        now,
        Event::Subscribed {
            channel,
            epoch,
            offset,
            recovered,
            publications,
        },
    ));
}

async fn publisher(
    i: usize,
    plan: Plan,
    registry: Arc<Registry>,
    outcome: Arc<Outcome>,
    start: Instant,
) {
    let mut rng = Rng::new(plan.seed, &format!("publisher{i}"));
    let mut seq = 0u64;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.range(20, 250))).await;
        if ms(start) >= plan.final_ms {
            break;
        }
        let channel = plan.channels[rng.pick(plan.channels.len())].clone();
        seq += 1;
        publish(
            i, seq, &channel, 6, &mut rng, &plan, &registry, &outcome, start,
        )
        .await;
    }
    // The last publication per channel, acknowledged for sure (the broker is healthy again).
    if i == 0 {
        for channel in &plan.channels {
            seq += 1;
            publish(
                i, seq, channel, 1000, &mut rng, &plan, &registry, &outcome, start,
            )
            .await;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn publish(
    i: usize,
    seq: u64,
    channel: &str,
    tries: usize,
    rng: &mut Rng,
    plan: &Plan,
    registry: &Registry,
    outcome: &Outcome,
    start: Instant,
) {
    let data = format!("\"p{i}-{seq}\"");
    let key = format!("k{i}-{seq}");
    for _ in 0..tries {
        let node = rng.pick(plan.nodes);
        let (reply, answer) = oneshot::channel();
        let sent = registry.send(
            node,
            NodeRequest::Publish {
                channel: channel.to_owned(),
                data: Bytes::from(data.clone()),
                idempotency_key: key.clone(),
                reply,
            },
        );
        if sent {
            if let Ok(Ok(Ok(pos))) = tokio::time::timeout(Duration::from_secs(5), answer).await {
                outcome.acks.lock().expect("acks").push(Ack {
                    channel: channel.to_owned(),
                    epoch: pos.epoch,
                    offset: pos.offset,
                    data,
                    at_ms: ms(start),
                });
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.range(50, 300))).await;
    }
    *outcome.unacked.lock().expect("unacked") += 1;
}
