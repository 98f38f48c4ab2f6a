//! # herald-sim: deterministic simulation of Herald nodes, a broker and clients
//!
//! One seed drives one run in one process: several nodes running the real `herald-core` hub and
//! sessions, a broker model with the failure modes real brokers have, and many clients and
//! publishers, all in simulated time on [turmoil] hosts. The same seed replays the same trace
//! (checked by [`Report::trace_hash`]). At the end, [`checker::check`] reads every client's log
//! and proves the delivery contract, or names where it broke.
//!
//! ```text
//! cargo run -p herald-sim --release -- --seed 42        # one seed, its trace hash and verdict
//! bash scripts/sim.sh 600                                # fresh seeds for ten minutes
//! ```
//!
//! # Layout
//! - [`rng`]: the one random source (SplitMix64), a stream per actor.
//! - [`broker`]: the broker server model and its faults; the node side ([`broker::NodeBroker`]).
//! - [`node`]: a node as a turmoil host: hub, sessions, the connection driver, the API publish.
//! - [`workload`]: subscribers and publishers as the SDK and a backend behave.
//! - [`checker`]: the contract, checked over the logs.
//! - this file: one run ([`run`]): the hosts, the fault schedule, the verdict.

// The fields of the harness's plain data types (options, reports, log events, broker messages)
// are named for what they hold; the module docs describe them.
#![allow(missing_docs)]

pub mod broker;
pub mod checker;
pub mod node;
pub mod rng;
pub mod workload;

use std::sync::Arc;
use std::time::Duration;

use broker::{Fault, Faults, NodeOptions, Restored, Server, ServerStats};
use checker::Violation;
use node::Registry;
use rng::{stable_hash, Rng};
use workload::{Outcome, Plan};

/// How a run is shaped. [`Options::default`] is what CI runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub clients: usize,
    pub publishers: usize,
    pub channels: usize,
    /// Faults for this long (simulated ms) …
    pub chaos_ms: u64,
    /// … then this long healthy (the last publications are made 2 s into it; a tail lost on a
    /// quiet channel is found within one sweep of the hub's shards, about a minute).
    pub settle_ms: u64,
    /// A fault event every this many ms (inclusive range).
    pub fault_every_ms: (u64, u64),
    /// The steady broker faults.
    pub faults: Faults,
    /// The node side's rollback defences.
    pub node: NodeOptions,
    /// Whether the fault schedule includes restarts from older data (rollbacks, replica
    /// promotions, data loss).
    pub rollbacks: bool,
    /// History kept per channel (trimmed by size and by age).
    pub history_size: usize,
    pub history_ttl_s: u64,
    /// The turmoil tick.
    pub tick_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            clients: 8,
            publishers: 2,
            channels: 3,
            chaos_ms: 20_000,
            settle_ms: 70_000,
            fault_every_ms: (300, 2_000),
            faults: Faults {
                latency_ms: (1, 12),
                pubsub_loss: 0.02,
                pubsub_late: 0.01,
                slow_command: 0.02,
                failed_command: 0.01,
                stale_read: 0.02,
            },
            node: NodeOptions::default(),
            rollbacks: true,
            history_size: 40,
            history_ttl_s: 15,
            tick_ms: 1,
        }
    }
}

/// What one run did and found.
#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    /// Broken promises, first ones first.
    pub violations: Vec<Violation>,
    /// A hash of everything every client saw, every acknowledgement and every fault, with their
    /// simulated times: the same seed must give the same hash.
    pub trace_hash: u64,
    /// The fault events, with their simulated times.
    pub faults: Vec<(u64, String)>,
    pub acks: usize,
    pub unacked: u64,
    pub deliveries: usize,
    /// `unsub` 4003 and `recovered: false` the clients were given.
    pub told: usize,
    pub server: ServerStats,
    /// Every client's log.
    pub logs: Vec<checker::ClientLog>,
}

impl Report {
    /// The one-line command that replays this run.
    pub fn replay_command(&self, options_flags: &str) -> String {
        format!(
            "cargo run -p herald-sim --release -- --seed {}{}",
            self.seed, options_flags
        )
    }
}

/// `n` channel names that fall in different shards of the hub (64, by `DefaultHasher`): within a
/// shard the hub visits channels in a `HashMap`'s order, which is random per process, and the
/// tail check reads them one after another, so two channels of one shard would make the trace
/// depend on it.
fn channel_names(n: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut shards = std::collections::BTreeSet::new();
    let mut k = 0;
    while names.len() < n {
        let name = format!("ch{k}");
        if shards.insert(stable_hash(name.as_str()) % 64) {
            names.push(name);
        }
        k += 1;
    }
    names
}

/// Run one seed.
pub fn run(seed: u64, options: &Options) -> Report {
    let o = options.clone();
    let server = Server::new(seed, o.faults.clone());
    let registry = Registry::new(o.nodes);
    let outcome = Arc::new(Outcome::default());
    let channels = channel_names(o.channels);
    let end_ms = o.chaos_ms + o.settle_ms;
    let plan = Plan {
        seed,
        nodes: o.nodes,
        clients: o.clients,
        publishers: o.publishers,
        channels,
        chaos_ms: o.chaos_ms,
        final_ms: o.chaos_ms + 2_000,
        end_ms,
    };
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_millis(end_ms + 120_000))
        .tick_duration(Duration::from_millis(o.tick_ms))
        .rng_seed(seed)
        .build();
    {
        let server = server.clone();
        sim.host("broker", move || {
            let server = server.clone();
            async move {
                server.run().await;
                Ok(())
            }
        });
    }
    let config = node::sim_config(o.history_size, o.history_ttl_s);
    for i in 0..o.nodes {
        let (server, registry, config) = (server.clone(), registry.clone(), config.clone());
        let node_options = o.node;
        sim.host(format!("n{i}"), move || {
            node::node_main(
                i,
                server.clone(),
                registry.clone(),
                node_options,
                config.clone(),
            )
        });
    }
    sim.client(
        "clients",
        workload::run(plan, registry.clone(), outcome.clone()),
    );

    let mut rng = Rng::new(seed, "faults");
    let mut faults: Vec<(u64, String)> = Vec::new();
    let mut next_fault = rng.range(o.fault_every_ms.0, o.fault_every_ms.1);
    // Node → when it comes back (crashed or drained).
    let mut down: Vec<Option<u64>> = vec![None; o.nodes];
    let mut drained: Vec<Option<u64>> = vec![None; o.nodes];
    let mut error = None;
    let mut calm = false;
    loop {
        let done = match sim.step() {
            Ok(done) => done,
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        };
        if done {
            break;
        }
        let now = sim.elapsed().as_millis() as u64;
        for i in 0..o.nodes {
            if drained[i].is_some_and(|t| t <= now) {
                drained[i] = None;
                sim.bounce(format!("n{i}"));
                faults.push((now, format!("n{i} restarted after its drain")));
            }
            if down[i].is_some_and(|t| t <= now || now >= o.chaos_ms) {
                down[i] = None;
                sim.bounce(format!("n{i}"));
                faults.push((now, format!("n{i} started again")));
            }
        }
        if now >= o.chaos_ms && !calm {
            calm = true;
            server.inject(Fault::Calm);
            faults.push((now, "faults over: commands no longer fail".to_owned()));
        }
        if now < next_fault || now >= o.chaos_ms {
            continue;
        }
        next_fault = now + rng.range(o.fault_every_ms.0, o.fault_every_ms.1);
        let node = rng.pick(o.nodes);
        let name = format!("n{node}");
        let what = match rng.pick(if o.rollbacks { 10 } else { 6 }) {
            0 | 1 if down[node].is_none() && drained[node].is_none() => {
                sim.crash(name.clone());
                down[node] = Some(now + rng.range(100, 2_000));
                format!("{name} killed (-9)")
            }
            2 if down[node].is_none() && drained[node].is_none() => {
                registry.drain(node);
                drained[node] = Some(now + rng.range(200, 1_000));
                format!("{name} draining")
            }
            3 => {
                let refuse_ms = if rng.chance(0.5) {
                    0
                } else {
                    rng.range(200, 3_000)
                };
                server.inject(Fault::CutLink {
                    node: name.clone(),
                    refuse_ms,
                });
                format!("{name}'s broker link cut, refused {refuse_ms} ms")
            }
            4 | 5 => {
                let down_ms = rng.range(0, 800);
                server.inject(Fault::Restart {
                    down_ms,
                    data: Restored::All,
                });
                format!("broker restarted with all its data, down {down_ms} ms")
            }
            6 | 7 => {
                let age_ms = rng.range(100, 3_000);
                let down_ms = rng.range(0, 800);
                server.inject(Fault::Restart {
                    down_ms,
                    data: Restored::Snapshot { age_ms },
                });
                format!("broker restarted from a snapshot {age_ms} ms old, down {down_ms} ms")
            }
            8 => {
                let lag_ms = rng.range(10, 500);
                server.inject(Fault::Restart {
                    down_ms: 0,
                    data: Restored::Replica { lag_ms },
                });
                format!("a replica {lag_ms} ms behind promoted")
            }
            9 if rng.chance(0.2) => {
                server.inject(Fault::Restart {
                    down_ms: rng.range(0, 500),
                    data: Restored::Nothing,
                });
                "broker restarted with no data".to_owned()
            }
            _ => continue,
        };
        faults.push((now, what));
    }

    let logs = outcome.logs.lock().expect("logs").clone();
    let mut acks = outcome.acks.lock().expect("acks").clone();
    acks.sort_by(|a, b| {
        (a.at_ms, &a.channel, a.offset, &a.data).cmp(&(b.at_ms, &b.channel, b.offset, &b.data))
    });
    let settled = error.is_none();
    let mut violations = checker::check(&logs, &acks, settled);
    if let Some(e) = error {
        violations.insert(
            0,
            Violation {
                client: "-".into(),
                channel: "-".into(),
                at_ms: sim.elapsed().as_millis() as u64,
                what: format!("the simulation failed: {e}"),
            },
        );
    }
    let deliveries = logs
        .iter()
        .flat_map(|l| &l.events)
        .map(|(_, e)| match e {
            checker::Event::Pub { .. } => 1,
            checker::Event::Subscribed { publications, .. } => publications.len(),
            _ => 0,
        })
        .sum();
    let told = logs
        .iter()
        .flat_map(|l| &l.events)
        .filter(|(_, e)| {
            matches!(
                e,
                checker::Event::Unsub { code: 4003, .. }
                    | checker::Event::Subscribed {
                        recovered: Some(false),
                        ..
                    }
            )
        })
        .count();
    let unacked = *outcome.unacked.lock().expect("unacked");
    Report {
        seed,
        trace_hash: stable_hash(&(&logs, &acks, &faults)),
        violations,
        faults,
        acks: acks.len(),
        unacked,
        deliveries,
        told,
        server: server.stats(),
        logs,
    }
}
