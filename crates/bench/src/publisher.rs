//! Open-loop publishing through the HTTP API: publication k is due at `start + k / rate`, whatever
//! happened to publication k − 1, and its `data` carries that scheduled time, so latency is measured
//! from when it *should* have gone out (no coordinated omission, docs/benchmarking.md rule 3).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::accounting::Expected;
use crate::hist::{self, new_hist, Summary};
use crate::http::{Client, Target};
use crate::params::{Params, Scenario};
use crate::wire::make_data;
use crate::worker::now_ns;

/// What the publisher did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PublishOutcome {
    /// Publications scheduled (for `fanin`: broadcast requests).
    pub scheduled: u64,
    /// Requests that got a 2xx answer.
    pub ok: u64,
    /// Failed requests by cause.
    pub errors: BTreeMap<String, u64>,
    /// API round trip measured from the scheduled time (µs).
    pub api_latency: Summary,
    /// The same, V2+base64.
    pub api_latency_hist: String,
    /// Offsets the API returned, per channel.
    pub expect: BTreeMap<String, Expected>,
    /// Channels whose offsets were not contiguous (someone else published, or a publish failed
    /// after being applied).
    pub noncontiguous: Vec<String>,
    /// Scheduled window, seconds.
    pub window_s: f64,
}

struct State {
    api: Histogram<u64>,
    ok: u64,
    errors: BTreeMap<String, u64>,
    expect: BTreeMap<String, Expected>,
}

impl State {
    fn got(&mut self, channel: &str, v: &serde_json::Value) {
        let (Some(epoch), Some(offset)) = (v["epoch"].as_str(), v["offset"].as_u64()) else {
            *self
                .errors
                .entry(format!("result without offset: {v}"))
                .or_default() += 1;
            return;
        };
        let e = self
            .expect
            .entry(channel.to_string())
            .or_insert_with(|| Expected {
                epoch: epoch.to_string(),
                first: offset,
                last: offset,
                count: 0,
            });
        e.first = e.first.min(offset);
        e.last = e.last.max(offset);
        e.count += 1;
        if e.epoch != epoch {
            *self
                .errors
                .entry("epoch changed mid-run".into())
                .or_default() += 1;
        }
    }

    fn error(&mut self, kind: String) {
        *self.errors.entry(kind).or_default() += 1;
    }
}

/// One due publication.
struct Job {
    seq: u64,
    sched_ns: u64,
}

/// Publishes `rate × duration` publications over `channels` (name, API node) on a fixed schedule
/// starting `lead` from now, and returns what the API answered.
pub async fn run(
    p: &Params,
    scenario: Scenario,
    channels: &[(String, usize)],
    lead: Duration,
) -> PublishOutcome {
    let count = (p.rate * p.duration).floor().max(0.0) as u64;
    let state = Arc::new(Mutex::new(State {
        api: new_hist(),
        ok: 0,
        errors: BTreeMap::new(),
        expect: BTreeMap::new(),
    }));
    let channels = Arc::new(channels.to_vec());
    let targets: Vec<Target> = p
        .api_urls
        .iter()
        .map(|u| Target::parse(u).expect("validated before the run"))
        .collect();
    // `fanin`: one body naming every channel, built once.
    let all_channels = Arc::new(
        serde_json::to_string(&channels.iter().map(|c| &c.0).collect::<Vec<_>>())
            .unwrap_or_default(),
    );

    let (tx, rx) = mpsc::unbounded_channel::<Job>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut lanes = Vec::new();
    // Every lane holds one keep-alive connection per API node.
    for _ in 0..p.publish_connections.max(1) {
        let rx = rx.clone();
        let state = state.clone();
        let channels = channels.clone();
        let all_channels = all_channels.clone();
        let mut clients: Vec<Client> = targets
            .iter()
            .map(|t| match (p.centrifugo, p.pusher_app.is_some()) {
                (true, _) => Client::with_x_api_key(t.clone(), &p.api_key),
                // The trigger API is authenticated by its signed query alone.
                (_, true) => Client::new(t.clone(), None),
                _ => Client::new(t.clone(), Some(&p.api_key)),
            })
            .collect();
        let payload = p.payload;
        let plain_pusher = p.plain_pusher().expect("validated before the run");
        let pusher = p.pusher && plain_pusher.is_none();
        let centrifugo = p.centrifugo;
        let plain_offsets = p.plain_offsets();
        let p_tags = p.tags.clone();
        lanes.push(tokio::spawn(async move {
            loop {
                let job = { rx.lock().await.recv().await };
                let Some(job) = job else { break };
                let mut data = make_data(job.sched_ns, job.seq, payload);
                if pusher {
                    data = crate::wire::pusher_envelope(&data);
                }
                if scenario == Scenario::Fanin {
                    let body = format!("{{\"channels\":{all_channels},\"data\":{data}}}");
                    let r = clients[0]
                        .request("POST", "/api/broadcast", Some(&body))
                        .await;
                    let done = now_ns();
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    s.api
                        .saturating_record((done.saturating_sub(job.sched_ns) / 1000).max(1));
                    match r {
                        Ok(r) if r.status / 100 == 2 => {
                            s.ok += 1;
                            let v: serde_json::Value =
                                serde_json::from_slice(&r.body).unwrap_or_default();
                            let results = v["results"].as_array().cloned().unwrap_or_default();
                            if results.len() != channels.len() {
                                s.error(format!(
                                    "broadcast answered {} results for {} channels",
                                    results.len(),
                                    channels.len()
                                ));
                            }
                            for (c, res) in channels.iter().zip(results.iter()) {
                                s.got(&c.0, res);
                            }
                        }
                        Ok(r) => s.error(format!(
                            "HTTP {}: {}",
                            r.status,
                            String::from_utf8_lossy(&r.body)
                                .chars()
                                .take(120)
                                .collect::<String>()
                        )),
                        Err(e) => s.error(format!("request: {e}")),
                    }
                } else {
                    let (channel, node) = &channels[(job.seq % channels.len() as u64) as usize];
                    let lane = *node % clients.len();
                    let r = match &plain_pusher {
                        Some(app) => {
                            let body = crate::wire::pusher_trigger_body(channel, &data);
                            let path = crate::wire::pusher_trigger_path(
                                app,
                                &body,
                                now_ns() / 1_000_000_000,
                            );
                            clients[lane].request("POST", &path, Some(&body)).await
                        }
                        None => {
                            let body = match &p_tags {
                                Some(tags) => format!(
                                    "{{\"channel\":\"{channel}\",\"data\":{data},\"tags\":{tags}}}"
                                ),
                                None => format!("{{\"channel\":\"{channel}\",\"data\":{data}}}"),
                            };
                            clients[lane]
                                .request("POST", "/api/publish", Some(&body))
                                .await
                        }
                    };
                    let done = now_ns();
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    s.api
                        .saturating_record((done.saturating_sub(job.sched_ns) / 1000).max(1));
                    match r {
                        Ok(r) if r.status / 100 == 2 => {
                            s.ok += 1;
                            let v: serde_json::Value =
                                serde_json::from_slice(&r.body).unwrap_or_default();
                            let refused = if centrifugo {
                                crate::wire::centrifugo_api_result(&v).err()
                            } else {
                                None
                            };
                            if let Some(e) = refused {
                                // Centrifugo answers its errors with HTTP 200 too.
                                s.ok -= 1;
                                s.error(e.chars().take(160).collect());
                            } else if plain_offsets {
                                // A Pusher trigger (and our Socket.IO server, and Centrifugo
                                // without history) answers without an offset: the offset is the
                                // publication's number in its channel.
                                let n = crate::wire::plain_offset(job.seq, channels.len());
                                s.got(channel, &serde_json::json!({"epoch": "", "offset": n}));
                            } else if !centrifugo {
                                s.got(channel, &v);
                            } else {
                                // Centrifugo answers its errors with HTTP 200 too.
                                match crate::wire::centrifugo_api_result(&v) {
                                    Ok(res) => s.got(channel, res),
                                    Err(e) => {
                                        s.ok -= 1;
                                        s.error(e.chars().take(160).collect());
                                    }
                                }
                            }
                        }
                        Ok(r) => s.error(format!(
                            "HTTP {}: {}",
                            r.status,
                            String::from_utf8_lossy(&r.body)
                                .chars()
                                .take(120)
                                .collect::<String>()
                        )),
                        Err(e) => s.error(format!("request: {e}")),
                    }
                }
            }
        }));
    }

    // The schedule: sleep to each due time, hand the job to whichever lane is free.
    let interval_ns = if p.rate > 0.0 { 1e9 / p.rate } else { 0.0 };
    let start_ns = now_ns() + lead.as_nanos() as u64;
    let start = tokio::time::Instant::now() + lead;
    for seq in 0..count {
        let offset = Duration::from_nanos((seq as f64 * interval_ns) as u64);
        tokio::time::sleep_until(start + offset).await;
        let _ = tx.send(Job {
            seq,
            sched_ns: start_ns + offset.as_nanos() as u64,
        });
    }
    drop(tx);
    for l in lanes {
        let _ = l.await;
    }
    let s = state.lock().unwrap_or_else(|e| e.into_inner());
    let noncontiguous = s
        .expect
        .iter()
        .filter(|(_, e)| e.last - e.first + 1 != e.count)
        .map(|(c, _)| c.clone())
        .collect();
    PublishOutcome {
        scheduled: count,
        ok: s.ok,
        errors: s.errors.clone(),
        api_latency: Summary::of(&s.api),
        api_latency_hist: hist::encode(&s.api),
        expect: s.expect.clone(),
        noncontiguous,
        window_s: count as f64 * interval_ns / 1e9,
    }
}
