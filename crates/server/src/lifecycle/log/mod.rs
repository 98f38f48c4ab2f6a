//! The log the events go through: Redis (a stream every node appends to, each node's connection
//! set, leases), NATS JetStream (the same, as a stream and a KV bucket: [`nats`]) or, for a
//! single node, memory.
//!
//! Keys (one hash slot: `{prefix}`): `{p}:events` the stream; `{p}:conns:<node>` a node's
//! connections (`c:<client>` → user, `s:<client>\n<channel>` for each live subscription);
//! `{p}:lease:<node>`; `{p}:nodes` the nodes with a connection set; `{p}:sender` which node
//! delivers; `{p}:acked` the last event the endpoint took.

mod nats;

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use redis::Script;
use tokio::sync::mpsc;

use super::recorder::{now_ms, Effect, Entry};
use super::LifecycleConfig;

/// Each Redis call's limit: a stuck Redis fails the call (and it is retried), never hangs it.
const CALL_LIMIT: Duration = Duration::from_secs(5);

/// See the module docs.
pub(super) enum Log {
    Memory(MemoryLog),
    // Boxed: the Redis client is large, and there is one log per node.
    Redis(Box<RedisLog>),
    Nats(Box<nats::NatsLog>),
}

/// A single node's log: nothing survives the node.
#[derive(Default)]
pub(super) struct MemoryLog {
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    events: VecDeque<(u64, String)>,
    next: u64,
    acked: u64,
}

pub(super) struct RedisLog {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    node: String,
    lease_ms: u64,
    prefix: String,
}

/// An append was refused: this node's lease had lapsed and another node already emitted its
/// connections' disconnects.
#[derive(Debug, thiserror::Error)]
#[error("this node's lifecycle lease lapsed: another node reported its connections lost")]
pub(super) struct Fenced;

const APPEND: &str = r#"
if redis.call('EXISTS', KEYS[3]) == 0 then return -1 end
local n = #ARGV / 4
for i = 0, n - 1 do
  local op, client, arg, json = ARGV[i*4+1], ARGV[i*4+2], ARGV[i*4+3], ARGV[i*4+4]
  if op == 'c' then redis.call('HSET', KEYS[2], 'c:' .. client, arg)
  elseif op == 's' then redis.call('HSET', KEYS[2], 's:' .. client .. '\n' .. arg, '1')
  elseif op == 'u' then redis.call('HDEL', KEYS[2], 's:' .. client .. '\n' .. arg)
  elseif op == 'd' then redis.call('HDEL', KEYS[2], 'c:' .. client) end
  redis.call('XADD', KEYS[1], '*', 'e', json)
end
return n
"#;

/// A lost node's connections become events and leave the log, in one step: whichever node runs
/// it first emits them, the others find nothing.
const REAP: &str = r#"
if ARGV[3] ~= '1' and redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
local all = redis.call('HGETALL', KEYS[2])
local users, order = {}, {}
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'c:' then
    local client = string.sub(all[i], 3)
    users[client] = all[i + 1]
    order[#order + 1] = client
  end
end
table.sort(order)
local n = 0
local function emit(kind, client, channel, id)
  local e = {id = id, type = kind, time_ms = tonumber(ARGV[2]), node = ARGV[1],
             client = client, user = users[client] or ''}
  if channel then e.channel = channel end
  if kind == 'disconnect' then e.code = 1006; e.reason = 'node lost' end
  redis.call('XADD', KEYS[1], '*', 'e', cjson.encode(e))
  n = n + 1
end
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 's:' then
    local rest = string.sub(all[i], 3)
    local nl = string.find(rest, '\n', 1, true)
    local client, channel = string.sub(rest, 1, nl - 1), string.sub(rest, nl + 1)
    emit('unsubscribe', client, channel, ARGV[1] .. '/' .. client .. '/lost/' .. channel)
  end
end
for _, client in ipairs(order) do
  emit('disconnect', client, nil, ARGV[1] .. '/' .. client .. '/lost')
end
redis.call('DEL', KEYS[2])
if ARGV[3] ~= '1' then redis.call('SREM', KEYS[4], ARGV[1]) end
return n
"#;

const LEAD: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur == false then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"#;

const ACK: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('XTRIM', KEYS[3], 'MINID', ARGV[2])
return 1
"#;

impl RedisLog {
    fn key(&self, name: &str) -> String {
        format!("{{{}}}:{name}", self.prefix)
    }

    async fn conn(&self) -> anyhow::Result<MultiplexedConnection> {
        let mut cached = self.conn.lock().await;
        if let Some(c) = &*cached {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(CALL_LIMIT, self.client.get_multiplexed_async_connection())
            .await
            .context("connecting to the lifecycle Redis timed out")?
            .context("connecting to the lifecycle Redis")?;
        *cached = Some(c.clone());
        Ok(c)
    }

    /// Run one call; a failed or stuck one drops the connection (the next call reconnects).
    async fn call<T: redis::FromRedisValue>(
        &self,
        f: impl AsyncFnOnce(MultiplexedConnection) -> redis::RedisResult<T>,
    ) -> anyhow::Result<T> {
        let conn = self.conn().await?;
        let result = match tokio::time::timeout(CALL_LIMIT, f(conn)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => anyhow::Error::new(e).context("lifecycle Redis"),
            Err(_) => anyhow::anyhow!("lifecycle Redis: no answer in {CALL_LIMIT:?}"),
        };
        *self.conn.lock().await = None;
        Err(result)
    }
}

impl Log {
    pub(super) async fn connect(config: &LifecycleConfig, node: &str) -> anyhow::Result<Self> {
        if let Some(url) = &config.nats_url {
            return Ok(Log::Nats(Box::new(
                nats::NatsLog::connect(url, config, node).await?,
            )));
        }
        let Some(url) = &config.redis_url else {
            return Ok(Log::Memory(MemoryLog::default()));
        };
        let client = redis::Client::open(url.as_str()).map_err(|_| {
            anyhow::anyhow!("invalid [lifecycle] redis_url (expected redis://host:port)")
        })?;
        let log = RedisLog {
            client,
            conn: tokio::sync::Mutex::new(None),
            node: node.to_owned(),
            lease_ms: config.lease_ms,
            prefix: config.prefix.clone(),
        };
        log.conn().await?;
        Ok(Log::Redis(Box::new(log)))
    }

    fn lease_ms(&self) -> u64 {
        match self {
            Log::Memory(_) => 10_000,
            Log::Redis(r) => r.lease_ms,
            Log::Nats(n) => n.lease_ms,
        }
    }

    /// Append events in order, with their effects on this node's connection set.
    pub(super) async fn append(&self, entries: &[Entry]) -> anyhow::Result<()> {
        match self {
            Log::Memory(m) => {
                let mut s = m.state.lock().expect("lifecycle log");
                for e in entries {
                    s.next += 1;
                    let id = s.next;
                    s.events.push_back((id, serde_json::to_string(&e.event)?));
                }
                Ok(())
            }
            Log::Nats(n) => n.append(entries).await,
            Log::Redis(r) => {
                let keys = [
                    r.key("events"),
                    r.key(&format!("conns:{}", r.node)),
                    r.key(&format!("lease:{}", r.node)),
                ];
                let mut args: Vec<String> = Vec::with_capacity(entries.len() * 4);
                for e in entries {
                    let (op, arg) = match &e.effect {
                        Effect::Connected(user) => ("c", user.clone()),
                        Effect::Subscribed(channel) => ("s", channel.clone()),
                        Effect::Unsubscribed(channel) => ("u", channel.clone()),
                        Effect::Disconnected => ("d", String::new()),
                    };
                    args.push(op.into());
                    args.push(e.event.client.clone());
                    args.push(arg);
                    args.push(serde_json::to_string(&e.event)?);
                }
                let n: i64 = r
                    .call(async |mut c| {
                        let script = Script::new(APPEND);
                        let mut inv = script.prepare_invoke();
                        inv.key(&keys[..]).arg(&args[..]);
                        inv.invoke_async(&mut c).await
                    })
                    .await?;
                if n < 0 {
                    return Err(Fenced.into());
                }
                Ok(())
            }
        }
    }

    /// Turn `node`'s connection set into events, if its lease lapsed (or `force`: this node's
    /// own set, left by an earlier run). The number of events emitted.
    pub(super) async fn reap(&self, node: &str, force: bool) -> anyhow::Result<u64> {
        if let Log::Nats(n) = self {
            return n.reap(node, force).await;
        }
        let Log::Redis(r) = self else { return Ok(0) };
        let keys = [
            r.key("events"),
            r.key(&format!("conns:{node}")),
            r.key(&format!("lease:{node}")),
            r.key("nodes"),
        ];
        let args = [
            node.to_owned(),
            now_ms().to_string(),
            if force { "1" } else { "0" }.to_owned(),
        ];
        let n: i64 = r
            .call(async |mut c| {
                let script = Script::new(REAP);
                let mut inv = script.prepare_invoke();
                inv.key(&keys[..]).arg(&args[..]);
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n.max(0) as u64)
    }

    /// Renew this node's lease (and say it has a connection set).
    pub(super) async fn renew_lease(&self) -> anyhow::Result<()> {
        if let Log::Nats(n) = self {
            return n.renew_lease().await;
        }
        let Log::Redis(r) = self else { return Ok(()) };
        let (lease, nodes) = (r.key(&format!("lease:{}", r.node)), r.key("nodes"));
        r.call(async |mut c| {
            redis::pipe()
                .atomic()
                .cmd("SET")
                .arg(&lease)
                .arg(1)
                .arg("PX")
                .arg(r.lease_ms)
                .ignore()
                .cmd("SADD")
                .arg(&nodes)
                .arg(&r.node)
                .ignore()
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// The node stopped with nothing left: its lease and its place in the node set go.
    pub(super) async fn release(&self, node: &str) -> anyhow::Result<()> {
        if let Log::Nats(n) = self {
            return n.release(node).await;
        }
        let Log::Redis(r) = self else { return Ok(()) };
        let (lease, nodes, conns) = (
            r.key(&format!("lease:{node}")),
            r.key("nodes"),
            r.key(&format!("conns:{node}")),
        );
        r.call(async |mut c| {
            // A connection set still holding connections keeps the node listed (and reaped).
            let left: u64 = redis::cmd("HLEN").arg(&conns).query_async(&mut c).await?;
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("DEL").arg(&lease).ignore();
            if left == 0 {
                pipe.cmd("SREM").arg(&nodes).arg(node).ignore();
            }
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }

    /// Nodes listed with a connection set whose lease lapsed.
    async fn lost_nodes(&self) -> anyhow::Result<Vec<String>> {
        if let Log::Nats(n) = self {
            return n.lost_nodes().await;
        }
        let Log::Redis(r) = self else {
            return Ok(Vec::new());
        };
        let nodes: Vec<String> = r
            .call(async |mut c| {
                redis::cmd("SMEMBERS")
                    .arg(r.key("nodes"))
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let mut lost = Vec::new();
        for node in nodes.into_iter().filter(|n| *n != r.node) {
            let lease = r.key(&format!("lease:{node}"));
            let alive: bool = r
                .call(async |mut c| redis::cmd("EXISTS").arg(&lease).query_async(&mut c).await)
                .await?;
            if !alive {
                lost.push(node);
            }
        }
        Ok(lost)
    }

    /// Take or keep the right to deliver (one node at a time).
    pub(super) async fn lead(&self) -> anyhow::Result<bool> {
        if let Log::Nats(n) = self {
            return n.lead().await;
        }
        let Log::Redis(r) = self else { return Ok(true) };
        let key = r.key("sender");
        let args = (r.node.clone(), r.lease_ms);
        let led: i64 = r
            .call(async |mut c| {
                Script::new(LEAD)
                    .key(&key)
                    .arg(&args.0)
                    .arg(args.1)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(led == 1)
    }

    /// The events after the last acknowledged one, at most `max`: (cursor, JSON) in order.
    pub(super) async fn unacked(&self, max: usize) -> anyhow::Result<Vec<(String, String)>> {
        match self {
            Log::Memory(m) => {
                let s = m.state.lock().expect("lifecycle log");
                Ok(s.events
                    .iter()
                    .filter(|(id, _)| *id > s.acked)
                    .take(max)
                    .map(|(id, e)| (id.to_string(), e.clone()))
                    .collect())
            }
            Log::Nats(n) => n.unacked(max).await,
            Log::Redis(r) => {
                let (events, acked) = (r.key("events"), r.key("acked"));
                let from: Option<String> = r
                    .call(async |mut c| redis::cmd("GET").arg(&acked).query_async(&mut c).await)
                    .await?;
                let start = format!("({}", from.as_deref().unwrap_or("0-0"));
                let read: Vec<(String, Vec<(String, String)>)> = r
                    .call(async |mut c| {
                        redis::cmd("XRANGE")
                            .arg(&events)
                            .arg(&start)
                            .arg("+")
                            .arg("COUNT")
                            .arg(max)
                            .query_async(&mut c)
                            .await
                    })
                    .await?;
                Ok(read
                    .into_iter()
                    .filter_map(|(id, fields)| {
                        let e = fields.into_iter().find(|(k, _)| k == "e")?.1;
                        Some((id, e))
                    })
                    .collect())
            }
        }
    }

    /// The endpoint took everything up to `cursor`: forget it (if this node still delivers).
    pub(super) async fn ack(&self, cursor: &str) -> anyhow::Result<()> {
        match self {
            Log::Memory(m) => {
                let mut s = m.state.lock().expect("lifecycle log");
                let upto: u64 = cursor.parse().context("cursor")?;
                s.acked = s.acked.max(upto);
                while s.events.front().is_some_and(|(id, _)| *id <= upto) {
                    s.events.pop_front();
                }
                Ok(())
            }
            Log::Nats(n) => n.ack(cursor).await,
            Log::Redis(r) => {
                let keys = [r.key("sender"), r.key("acked"), r.key("events")];
                let args = [r.node.clone(), cursor.to_owned()];
                r.call(async |mut c| {
                    let script = Script::new(ACK);
                    let mut inv = script.prepare_invoke();
                    inv.key(&keys[..]).arg(&args[..]);
                    inv.invoke_async::<i64>(&mut c).await
                })
                .await?;
                Ok(())
            }
        }
    }
}

/// Write queued events to the log in batches, in order; a failed write is retried (nothing is
/// dropped) until the node stops. Ends when the recorder closes and the queue is empty.
pub(super) async fn write(log: Arc<Log>, mut rx: mpsc::UnboundedReceiver<Entry>, batch_max: usize) {
    let mut batch = Vec::with_capacity(batch_max);
    // Clients whose connect is in the log and disconnect not yet: what a lapsed lease lost.
    let mut written: HashSet<String> = HashSet::new();
    // Clients another node already reported disconnected: their later events are dropped.
    let mut fenced: HashSet<String> = HashSet::new();
    let mut backoff = Duration::from_millis(50);
    loop {
        if rx.recv_many(&mut batch, batch_max).await == 0 {
            return;
        }
        loop {
            if !fenced.is_empty() {
                batch.retain(|e| {
                    let keep = !fenced.contains(&e.event.client);
                    if !keep && matches!(e.effect, Effect::Disconnected) {
                        fenced.remove(&e.event.client);
                    }
                    keep
                });
            }
            match log.append(&batch).await {
                Ok(()) => {
                    for e in &batch {
                        match e.effect {
                            Effect::Connected(_) => written.insert(e.event.client.clone()),
                            Effect::Disconnected => written.remove(&e.event.client),
                            _ => false,
                        };
                    }
                    backoff = Duration::from_millis(50);
                    break;
                }
                Err(e) if e.is::<Fenced>() => {
                    tracing::error!(
                        connections = written.len(),
                        "lifecycle: this node's lease lapsed and another node reported its connections lost; their later events are dropped"
                    );
                    fenced.extend(written.drain());
                    if let Err(e) = log.renew_lease().await {
                        tracing::warn!(cause = %e, "lifecycle: lease not renewed");
                    }
                }
                Err(e) => {
                    tracing::warn!(cause = %e, "lifecycle: events not written yet, retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        batch.clear();
    }
}

/// Renew this node's lease three times per lease period.
pub(super) async fn keep_lease(log: Weak<Log>) {
    loop {
        let Some(every) = log
            .upgrade()
            .map(|l| Duration::from_millis(l.lease_ms() / 3))
        else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(log) = log.upgrade() else { return };
        if let Err(e) = log.renew_lease().await {
            tracing::warn!(cause = %e, "lifecycle: lease not renewed");
        }
    }
}

/// Look for lost nodes twice per lease period and emit their connections' disconnects.
pub(super) async fn reap_lost(log: Weak<Log>) {
    loop {
        let Some(every) = log
            .upgrade()
            .map(|l| Duration::from_millis(l.lease_ms() / 2))
        else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(log) = log.upgrade() else { return };
        // Bounded: a listing that never ended once stopped this loop for good.
        let lost = match tokio::time::timeout(CALL_LIMIT * 2, log.lost_nodes())
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer in {:?}", CALL_LIMIT * 2)))
        {
            Ok(lost) => lost,
            Err(e) => {
                tracing::warn!(cause = %e, "lifecycle: lost nodes not checked");
                continue;
            }
        };
        for node in lost {
            match log.reap(&node, false).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(%node, events = n, "lifecycle: a lost node's connections reported disconnected")
                }
                Err(e) => tracing::warn!(%node, cause = %e, "lifecycle: lost node not reaped"),
            }
        }
    }
}
