//! Run parameters: the command line of one scenario, also sent as JSON to every worker and written
//! into the `--json` output so a result always carries what produced it.

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

/// The scenarios docs/benchmarking.md describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Open N subscribed connections and hold them: connect rate, server RSS per connection.
    Idle,
    /// N subscribers over C channels, open-loop HTTP publishing: delivered %, deliveries/s, latency.
    Broadcast,
    /// As broadcast, while every client drops TCP every 15–20 s, stays away ≥ 2 s and recovers.
    Jitter,
    /// Drop every client at once; time until 95% / 100% are back and re-subscribed.
    Storm,
    /// SIGTERM the node(s) started with `--server-cmd` a third of the way in (they drain: a
    /// `disconnect` with `after_ms` spread over `drain_ms`) and start them again; time from the
    /// signal until 95% / 100% are back and re-subscribed with `since`. Recovery across the
    /// restart needs a shared broker (`HERALD_BROKER_URL`).
    Drain,
    /// Rooms of ~12 members spread over several nodes: latency and broker messages per node.
    Rooms,
    /// One `/api/broadcast` to K personal channels: time to deliver to all K.
    Fanin,
}

impl Scenario {
    /// The name used on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Idle => "idle",
            Scenario::Broadcast => "broadcast",
            Scenario::Jitter => "jitter",
            Scenario::Storm => "storm",
            Scenario::Drain => "drain",
            Scenario::Rooms => "rooms",
            Scenario::Fanin => "fanin",
        }
    }

    /// Whether the scenario publishes through the HTTP API.
    pub fn publishes(self) -> bool {
        !matches!(self, Scenario::Idle)
    }
}

/// How clients reach the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// WebSocket (`--ws` URLs).
    #[default]
    Ws,
    /// Server-Sent Events (`GET /connection/sse` on the `--ws` URLs' host): receive only, for
    /// `idle` and `broadcast`; the same accounting as WebSocket (docs/transports.md).
    Sse,
}

/// Every knob of a run. Defaults are the documented ones in docs/benchmarks.md.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct Params {
    /// WebSocket URL(s) of the node(s) under test; repeat for several nodes (`rooms`).
    #[arg(long = "ws", default_value = "ws://127.0.0.1:8000/ws")]
    pub ws_urls: Vec<String>,
    /// HTTP API base URL(s); publications go round-robin (`rooms`: the room's home node).
    #[arg(long = "api", default_value = "http://127.0.0.1:8000")]
    pub api_urls: Vec<String>,
    /// The path a `--server-cmd` node answers 200 on once it is up (Sockudo: `/up`).
    #[arg(long, default_value = "/health")]
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// HTTP API key (`Authorization: Bearer …`).
    #[arg(long, env = "HERALD_API_KEY", default_value = "benchkey")]
    pub api_key: String,
    /// Client connections in total (over all workers).
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub connections: usize,
    /// Channels the connections are spread over (connection i subscribes channel i mod C). `rooms`:
    /// ignored (rooms = connections / room size); `fanin`: ignored (one personal channel each).
    #[arg(long, short = 'c', default_value_t = 1)]
    pub channels: usize,
    /// Members per room (`rooms`).
    #[arg(long, default_value_t = 12)]
    pub room_size: usize,
    /// Nodes each room's members are spread over (`rooms`), at most the number of `--ws` URLs.
    #[arg(long, default_value_t = 2)]
    pub room_spread: usize,
    /// Publications per second in total (over all channels), on a fixed schedule.
    #[arg(long, short = 'r', default_value_t = 10.0)]
    pub rate: f64,
    /// Seconds of publishing (`idle`: seconds to hold the connections).
    #[arg(long, short = 'd', default_value_t = 10.0)]
    pub duration: f64,
    /// Size in bytes of each publication's `data` JSON (at least 40: it carries the send time).
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Worker processes (0: one per 5,000 connections, at least 2).
    #[arg(long, short = 'w', default_value_t = 0)]
    pub workers: usize,
    /// Concurrent connection handshakes per worker while connecting.
    #[arg(long, default_value_t = 200)]
    pub connect_concurrency: usize,
    /// HTTP keep-alive connections the publisher uses (requests queue for a free one; latency still
    /// counts from the scheduled time).
    #[arg(long, default_value_t = 8)]
    pub publish_connections: usize,
    /// Seconds to wait for stragglers after the last publication before counting what is missing.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,
    /// `jitter`: shortest and longest time between a client's drops, seconds.
    #[arg(long, num_args = 2, default_values_t = [15.0, 20.0])]
    pub drop_every: Vec<f64>,
    /// `jitter`: shortest and longest time a dropped client stays away, seconds (≥ 2 per the rules).
    #[arg(long, num_args = 2, default_values_t = [2.0, 3.0])]
    pub offline: Vec<f64>,
    /// `storm`: each client waits a random 0..J ms before reconnecting (0: all at once).
    #[arg(long, default_value_t = 0)]
    pub reconnect_jitter_ms: u64,
    /// Seconds a connection attempt (TCP + WebSocket + connect reply) may take.
    #[arg(long, default_value_t = 15.0)]
    pub connect_timeout: f64,
    /// Seconds a connect/reconnect may keep retrying before the client gives up.
    #[arg(long, default_value_t = 30.0)]
    pub retry_for: f64,
    /// Prometheus counter that counts publications a node receives from the broker (`rooms`).
    #[arg(long, default_value = "herald_hub_publications_received_total")]
    pub broker_metric: String,
    /// First loopback source address; worker i dials from this + i (127.0.0.2, 127.0.0.3, …).
    #[arg(long, default_value = "127.0.0.2")]
    pub source_base: std::net::Ipv4Addr,
    /// Channel name prefix; a random suffix keeps runs apart in the server's history.
    #[arg(long, default_value = "bench")]
    pub prefix: String,
    /// Speak the Pusher protocol (docs/pusher.md) instead of Herald's: `--ws` URLs are
    /// `/app/{key}?protocol=7` endpoints, `--prefix` must name the app's Herald channels
    /// (`pusher:{app_id}:bench`), publications go out wrapped as the Pusher event `bench`, and
    /// clients subscribe with the catch-up extension for offsets and recovery.
    #[arg(long)]
    #[serde(default)]
    pub pusher: bool,
    /// With `--pusher`: a plain Pusher server (Sockudo, Soketi, or Herald's own Pusher endpoint
    /// used as one), `APP_ID:KEY:SECRET`. Clients subscribe without Herald's catch-up extension,
    /// `--prefix` names the Pusher channels as they are (`bench`), and publications go through the
    /// signed trigger API (`POST /apps/{APP_ID}/events`, Pusher's HMAC-SHA256 signature) of the
    /// `--api` nodes. Without offsets from the server, the k-th publication of a channel counts as
    /// its offset k (its sequence number is in the payload), so the same accounting of lost,
    /// duplicated and reordered deliveries holds. `idle` and `broadcast` only.
    #[arg(long, requires = "pusher")]
    #[serde(default)]
    pub pusher_app: Option<String>,
    /// Speak Centrifugo's JSON client protocol and HTTP API (v5/v6) instead of Herald's, for a
    /// side-by-side run against a Centrifugo node (scripts/peers.sh, docs/bench/peers/): `--ws`
    /// URLs are `/connection/websocket` endpoints; clients connect anonymously and subscribe in one
    /// frame (`recover` from the last offset after a drop), answer `{}` pings with `{}`; publications
    /// go to `POST /api/publish` with `X-API-Key`. Needs history on the channels (the offsets
    /// are the delivery accounting). `idle`, `broadcast`, `jitter`, `storm` only.
    #[arg(long, conflicts_with = "pusher")]
    #[serde(default)]
    pub centrifugo: bool,
    /// Speak Socket.IO (Engine.IO v4, Socket.IO protocol v5) over WebSocket, for a side-by-side
    /// run against a Socket.IO server (scripts/peers/socketio-server.mjs via scripts/peers.sh):
    /// `--ws` URLs are `/socket.io/?EIO=4&transport=websocket`; a client connects to the main
    /// namespace (`40`), emits `subscribe` with its channel and an ack id, and waits for the ack;
    /// it answers the server's `2` pings with `3`; publications arrive as
    /// `42["publication",channel,data]`. Publications go to the server's `POST /api/publish`
    /// (Herald's body, `Authorization: Bearer`). Socket.IO has no offsets: the k-th publication
    /// of a channel counts as offset k, as for `--pusher-app`. `idle` and `broadcast` only.
    #[arg(long, conflicts_with_all = ["pusher", "centrifugo"])]
    #[serde(default)]
    pub socketio: bool,
    /// Pid of a broker process (redis-server, nats-server, each master of a Redis Cluster;
    /// repeat): its CPU is sampled over the same window as the servers', reported apart, and
    /// added to theirs for the CPU per 1,000 deliveries of nodes and broker together.
    #[arg(long = "broker-pid")]
    #[serde(default)]
    pub broker_pids: Vec<u32>,
    /// `--centrifugo` against a server that keeps no history and so sends no offsets
    /// (Centrifugo on its NATS broker): the k-th publication of a channel counts as offset k, as
    /// for `--pusher-app`. No recovery: for `idle` and `broadcast` without drops.
    #[arg(long, requires = "centrifugo")]
    #[serde(default)]
    pub no_history: bool,
    /// Transport the clients use: `ws` (WebSocket) or `sse` (Server-Sent Events, the same
    /// node's `/connection/sse`; `idle` and `broadcast` only).
    #[arg(long, value_enum, default_value_t = Transport::Ws)]
    #[serde(default)]
    pub transport: Transport,
    /// WebSocket clients offer permessage-deflate (the node's `limits.compression` decides);
    /// the run reports how many got it.
    #[arg(long)]
    #[serde(default)]
    pub compression: bool,
    /// Tags on every publication, a JSON object of strings (`{"k":"v"}`; docs/protocol.md, "Tags
    /// and tag filters"). Herald's protocol only.
    #[arg(long, conflicts_with_all = ["pusher", "centrifugo", "socketio"])]
    #[serde(default)]
    pub tags: Option<String>,
    /// Every client subscribes with this tag filter (`subscribe` param `tf`, JSON), in a
    /// `subscribe` command after `connect` (whose `subs` take no filter). The namespace must set
    /// `allow_tags_filter`. Herald's protocol over WebSocket only.
    #[arg(long, conflicts_with_all = ["pusher", "centrifugo", "socketio"])]
    #[serde(default)]
    pub tags_filter: Option<String>,
    /// PEM CA certificate to trust for `wss://` and `https://` URLs (a node started with
    /// `--tls-cert`/`--tls-key`; scripts/bench-tls-cert.sh makes a test CA and certificate).
    #[arg(long)]
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// With `--tls-ca`: each client keeps the TLS 1.3 session tickets the node sends it and
    /// resumes its session with one when it reconnects, as a browser does (rustls' own store
    /// keeps 8 per server name for the whole process, too few for thousands of clients of one
    /// node). Off: every handshake is a full one.
    #[arg(long, requires = "tls_ca")]
    #[serde(default)]
    pub tls_resume: bool,
}

impl Params {
    /// Whether the server sends no offsets (`--pusher-app`, `--socketio`, `--no-history`): the
    /// k-th publication of a channel stands for offset k ([`crate::wire::plain_offset`]).
    pub fn plain_offsets(&self) -> bool {
        self.pusher_app.is_some() || self.socketio || self.no_history
    }

    /// `--pusher-app` split into its parts, or an error naming what is wrong.
    pub fn plain_pusher(&self) -> Result<Option<PusherApp>, String> {
        let Some(spec) = &self.pusher_app else {
            return Ok(None);
        };
        let mut parts = spec.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(id), Some(key), Some(secret))
                if !id.is_empty() && !key.is_empty() && !secret.is_empty() =>
            {
                Ok(Some(PusherApp {
                    id: id.to_string(),
                    key: key.to_string(),
                    secret: secret.to_string(),
                }))
            }
            _ => Err("--pusher-app: expected APP_ID:KEY:SECRET".into()),
        }
    }

    /// Worker count actually used.
    pub fn worker_count(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            self.connections.div_ceil(5000).max(2)
        }
    }
}

fn default_health_path() -> String {
    "/health".into()
}

/// A Pusher app's credentials (`--pusher-app`).
#[derive(Debug, Clone)]
pub struct PusherApp {
    /// App id, in the trigger path.
    pub id: String,
    /// App key, in the signed query.
    pub key: String,
    /// App secret, the HMAC key.
    pub secret: String,
}

/// What one worker is responsible for; sent beside [`Params`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shard {
    /// Worker index, 0-based.
    pub index: usize,
    /// First global connection index it owns.
    pub start: usize,
    /// One past its last connection index.
    pub end: usize,
    /// Source address it dials from.
    pub source: std::net::Ipv4Addr,
    /// Run start (ns since the UNIX epoch): second 0 of every timeline.
    pub t0_ns: u64,
}

/// Where global connection `i` goes: its channel and its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Channel it subscribes.
    pub channel: String,
    /// Index into `ws_urls`.
    pub node: usize,
}

/// The layout of connections on channels and nodes, shared by coordinator and workers.
pub fn place(p: &Params, scenario: Scenario, i: usize) -> Placement {
    let nodes = p.ws_urls.len().max(1);
    match scenario {
        Scenario::Fanin => Placement {
            channel: format!("{}u{i}", p.prefix),
            node: i % nodes,
        },
        Scenario::Rooms => {
            let size = p.room_size.max(1);
            let (room, member) = (i / size, i % size);
            let spread = p.room_spread.clamp(1, nodes);
            Placement {
                channel: format!("{}room{room}", p.prefix),
                node: (room + member % spread) % nodes,
            }
        }
        _ => Placement {
            channel: format!("{}{}", p.prefix, i % p.channels.max(1)),
            node: i % nodes,
        },
    }
}

/// Channel names in publishing order and each one's home API node.
pub fn channels(p: &Params, scenario: Scenario) -> Vec<(String, usize)> {
    let apis = p.api_urls.len().max(1);
    match scenario {
        Scenario::Fanin => (0..p.connections)
            .map(|i| (format!("{}u{i}", p.prefix), 0))
            .collect(),
        Scenario::Rooms => (0..p.connections.div_ceil(p.room_size.max(1)))
            .map(|r| (format!("{}room{r}", p.prefix), r % apis))
            .collect(),
        _ => (0..p.channels.max(1))
            .map(|c| (format!("{}{c}", p.prefix), c % apis))
            .collect(),
    }
}

/// Nodes hosting each room (the ideal broker fan-out), for `rooms`.
pub fn room_nodes(p: &Params, room: usize) -> Vec<usize> {
    let nodes = p.ws_urls.len().max(1);
    let spread = p.room_spread.clamp(1, nodes);
    let members = p
        .room_size
        .max(1)
        .min(p.connections - room * p.room_size.max(1));
    let mut v: Vec<usize> = (0..members.min(spread))
        .map(|m| (room + m) % nodes)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
