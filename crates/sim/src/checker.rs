//! The checker: reads every client's log and the publishers' acknowledgements and proves the
//! delivery contract per (client, channel), or names the first place it fails.
//!
//! What it enforces (docs/reliability.md, "Deterministic simulation"):
//! 1. **No silent gap, no duplicate, in order.** A client's continuity in a channel starts at a
//!    subscribe reply's position (epoch E, offset s). From there every publication it receives,
//!    live or in a `recovered: true` reply, has the next offset of E: a lower one is a duplicate
//!    or a step backwards, a higher one a silent loss. Continuity survives an `unsub` 4003, a
//!    dropped connection and the client's own unsubscribe only through a `recovered: true` reply
//!    to a `since` equal to what the client holds, in the same epoch, whose position is not below
//!    it; a `recovered: false` reply (the client told plainly) starts it over.
//! 2. **What was delivered is what was acknowledged.** A publication the client holds at (E, o)
//!    is, when a publisher was acknowledged (E, o), that acknowledged publication. Two different
//!    publications acknowledged at the same (channel, E, o) are a violation by themselves: an
//!    offset reused within an epoch (a broker that went back without a new epoch).
//! 3. **Nothing acknowledged is lost at the end.** After the faults stop and a last publication
//!    per channel is acknowledged, every client subscribed at the end holds that publication's
//!    position: a tail that never arrived, or an epoch change nobody was told about, fails here.
//! 4. **Nothing arrives unasked.** No publication reaches a client for a channel it is not
//!    subscribed to.

use std::collections::BTreeMap;

/// One thing a client saw or did, at a simulated millisecond.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Event {
    /// Connected to node `node`.
    Connected { node: usize },
    /// The connection ended: closed by the node with a code, or reset (`None`).
    Disconnected { code: Option<u16> },
    /// Sent `subscribe`, with `since` (epoch, offset) when recovering.
    Subscribing {
        channel: String,
        since: Option<(String, u64)>,
    },
    /// The subscribe reply.
    Subscribed {
        channel: String,
        epoch: String,
        offset: u64,
        recovered: Option<bool>,
        publications: Vec<(u64, String)>,
    },
    /// The subscribe was refused (error code).
    SubscribeFailed { channel: String, code: u16 },
    /// A live publication.
    Pub {
        channel: String,
        offset: u64,
        data: String,
    },
    /// `unsub` pushed by the node.
    Unsub { channel: String, code: u16 },
    /// The client's own unsubscribe was answered.
    Left { channel: String },
}

/// One client's log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ClientLog {
    /// The client's name.
    pub client: String,
    /// (ms, event) in the order the client saw them.
    pub events: Vec<(u64, Event)>,
}

/// A publish a publisher was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ack {
    pub channel: String,
    pub epoch: String,
    pub offset: u64,
    pub data: String,
    pub at_ms: u64,
}

/// A broken promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub client: String,
    pub channel: String,
    pub at_ms: u64,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "at {} ms, client {} channel {}: {}",
            self.at_ms, self.client, self.channel, self.what
        )
    }
}

/// (channel, epoch, offset) → the distinct data acknowledged there, with when.
type Acked = BTreeMap<(String, String, u64), Vec<(String, u64)>>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Sub {
    Idle,
    Subscribing(Option<(String, u64)>),
    Live,
}

#[derive(Debug)]
struct ChannelState {
    sub: Sub,
    /// The continuity the client holds: (epoch, last offset).
    chain: Option<(String, u64)>,
    /// (epoch, offset) → data of every publication the client holds.
    held: BTreeMap<(String, u64), String>,
}

/// Check every log against the acknowledgements. `settled`: the run ended with a settle phase
/// after the last acknowledged publication per channel (check 3 applies).
pub fn check(logs: &[ClientLog], acks: &[Ack], settled: bool) -> Vec<Violation> {
    let mut violations = Vec::new();
    // (channel, epoch, offset) → acknowledged data (distinct values).
    let mut acked: Acked = BTreeMap::new();
    for a in acks {
        let v = acked
            .entry((a.channel.clone(), a.epoch.clone(), a.offset))
            .or_default();
        if !v.iter().any(|(d, _)| *d == a.data) {
            v.push((a.data.clone(), a.at_ms));
        }
    }
    for ((channel, epoch, offset), datas) in &acked {
        if datas.len() > 1 {
            violations.push(Violation {
                client: "-".into(),
                channel: channel.clone(),
                at_ms: datas[1].1,
                what: format!(
                    "offset {offset} of epoch {epoch} acknowledged twice, for {} and {} (an offset reused within an epoch)",
                    datas[0].0, datas[1].0
                ),
            });
        }
    }
    let mut last_ack: BTreeMap<&str, &Ack> = BTreeMap::new();
    for a in acks {
        let e = last_ack.entry(&a.channel).or_insert(a);
        if a.at_ms >= e.at_ms {
            *e = a;
        }
    }

    for log in logs {
        let mut channels: BTreeMap<String, ChannelState> = BTreeMap::new();
        let fail = |violations: &mut Vec<Violation>, at: u64, channel: &str, what: String| {
            violations.push(Violation {
                client: log.client.clone(),
                channel: channel.to_owned(),
                at_ms: at,
                what,
            })
        };
        for (at, event) in &log.events {
            let at = *at;
            match event {
                Event::Connected { .. } => {}
                Event::Disconnected { .. } => {
                    for st in channels.values_mut() {
                        st.sub = Sub::Idle;
                    }
                }
                Event::Subscribing { channel, since } => {
                    let st = state(&mut channels, channel);
                    st.sub = Sub::Subscribing(since.clone());
                }
                Event::Subscribed {
                    channel,
                    epoch,
                    offset,
                    recovered,
                    publications,
                } => {
                    let st = state(&mut channels, channel);
                    let since = match &st.sub {
                        Sub::Subscribing(since) => since.clone(),
                        other => {
                            fail(
                                &mut violations,
                                at,
                                channel,
                                format!("subscribe reply while {other:?}"),
                            );
                            None
                        }
                    };
                    st.sub = Sub::Live;
                    match recovered {
                        Some(true) => {
                            let Some(since) = since else {
                                fail(
                                    &mut violations,
                                    at,
                                    channel,
                                    "recovered without since".into(),
                                );
                                continue;
                            };
                            if st.chain.as_ref() != Some(&since) {
                                fail(
                                    &mut violations,
                                    at,
                                    channel,
                                    format!(
                                        "since {since:?} is not what the client holds ({:?})",
                                        st.chain
                                    ),
                                );
                            }
                            if *epoch != since.0 {
                                fail(
                                    &mut violations,
                                    at,
                                    channel,
                                    format!(
                                        "recovered: true across epochs ({} → {epoch})",
                                        since.0
                                    ),
                                );
                                st.chain = Some((epoch.clone(), *offset));
                                continue;
                            }
                            if *offset < since.1 {
                                fail(
                                    &mut violations,
                                    at,
                                    channel,
                                    format!(
                                        "recovered: true at offset {offset}, behind the {} the client holds (the stream went back)",
                                        since.1
                                    ),
                                );
                            }
                            let mut last = since.1;
                            for (o, d) in publications {
                                deliver(
                                    &mut violations,
                                    log,
                                    channel,
                                    at,
                                    st,
                                    &acked,
                                    epoch,
                                    &mut last,
                                    *o,
                                    d,
                                );
                            }
                            if last != *offset && *offset >= since.1 {
                                fail(
                                    &mut violations,
                                    at,
                                    channel,
                                    format!(
                                        "recovered: true ends at {last}, the reply's position is {offset}"
                                    ),
                                );
                            }
                            st.chain = Some((epoch.clone(), last.max(*offset)));
                        }
                        Some(false) | None => {
                            if !publications.is_empty() {
                                fail(
                                    &mut violations,
                                    at,
                                    channel,
                                    "publications in a reply that did not recover".into(),
                                );
                            }
                            st.chain = Some((epoch.clone(), *offset));
                        }
                    }
                }
                Event::SubscribeFailed { channel, .. } => {
                    state(&mut channels, channel).sub = Sub::Idle;
                }
                Event::Pub {
                    channel,
                    offset,
                    data,
                } => {
                    let st = state(&mut channels, channel);
                    if st.sub != Sub::Live {
                        fail(
                            &mut violations,
                            at,
                            channel,
                            format!("publication {offset} while {:?}", st.sub),
                        );
                        continue;
                    }
                    let Some((epoch, mut last)) = st.chain.clone() else {
                        fail(
                            &mut violations,
                            at,
                            channel,
                            "publication before any reply".into(),
                        );
                        continue;
                    };
                    deliver(
                        &mut violations,
                        log,
                        channel,
                        at,
                        st,
                        &acked,
                        &epoch,
                        &mut last,
                        *offset,
                        data,
                    );
                    st.chain = Some((epoch, last));
                }
                Event::Unsub { channel, .. } | Event::Left { channel } => {
                    state(&mut channels, channel).sub = Sub::Idle;
                }
            }
        }
        // Check 2 for publications acknowledged after the client received another one at the
        // same position (a reused offset the client never got).
        for (channel, st) in &channels {
            for ((epoch, offset), data) in &st.held {
                let Some(datas) = acked.get(&(channel.clone(), epoch.clone(), *offset)) else {
                    continue;
                };
                // A mismatch with every acknowledgement was reported on delivery.
                if datas.iter().any(|(d, _)| d == data) {
                    for (d, at) in datas {
                        if d != data {
                            fail(
                                &mut violations,
                                *at,
                                channel,
                                format!(
                                    "acknowledged {d} at ({epoch}, {offset}) never delivered: the client holds {data} there and was not told"
                                ),
                            );
                        }
                    }
                }
            }
        }
        if settled {
            let end = log.events.last().map_or(0, |(t, _)| *t);
            for (channel, st) in &channels {
                let Some(last) = last_ack.get(channel.as_str()) else {
                    continue;
                };
                if st.sub != Sub::Live {
                    fail(
                        &mut violations,
                        end,
                        channel,
                        format!("not subscribed at the end ({:?})", st.sub),
                    );
                    continue;
                }
                let holds = st.chain.clone().unwrap_or_default();
                if holds.0 != last.epoch || holds.1 < last.offset {
                    fail(
                        &mut violations,
                        end,
                        channel,
                        format!(
                            "at the end the client holds {holds:?}, the last acknowledged publication is ({}, {}): lost, never told",
                            last.epoch, last.offset
                        ),
                    );
                }
            }
        }
    }
    violations
}

fn state<'a>(
    channels: &'a mut BTreeMap<String, ChannelState>,
    channel: &str,
) -> &'a mut ChannelState {
    channels
        .entry(channel.to_owned())
        .or_insert_with(|| ChannelState {
            sub: Sub::Idle,
            chain: None,
            held: BTreeMap::new(),
        })
}

/// One publication at `offset` reaches a client holding `last` of `epoch`.
#[allow(clippy::too_many_arguments)]
fn deliver(
    violations: &mut Vec<Violation>,
    log: &ClientLog,
    channel: &str,
    at: u64,
    st: &mut ChannelState,
    acked: &Acked,
    epoch: &str,
    last: &mut u64,
    offset: u64,
    data: &str,
) {
    let mut fail = |what: String| {
        violations.push(Violation {
            client: log.client.clone(),
            channel: channel.to_owned(),
            at_ms: at,
            what,
        })
    };
    if offset <= *last {
        fail(format!("duplicate or out of order: {offset} after {last}"));
        return;
    }
    if offset > *last + 1 {
        fail(format!(
            "silent gap: {offset} after {last} (missed {}..={})",
            *last + 1,
            offset - 1
        ));
    }
    if let Some(datas) = acked.get(&(channel.to_owned(), epoch.to_owned(), offset)) {
        if !datas.iter().any(|(d, _)| d == data) {
            fail(format!(
                "received {data} at ({epoch}, {offset}), the acknowledged publication there is {}",
                datas[0].0
            ));
        }
    }
    st.held.insert((epoch.to_owned(), offset), data.to_owned());
    *last = offset;
}
