//! A broadcast on a Redis Cluster, grouped by master. The channels of a broadcast rarely share a
//! slot, and a script's keys must, so a broadcast is about one publish script call per channel;
//! sent one by one through the cluster connection, each is its own round trip and its own pass
//! through the client's routing. Here the calls whose slots one master owns go to that master as
//! one pipeline, on a connection of this node to that master: a round trip per master.
//!
//! The slot map (which master owns which slot) is read with `CLUSTER SLOTS` and may be stale. A
//! call that reaches a master that no longer owns its slot is answered `MOVED` or `ASK` before
//! anything runs, so it is safe to send again: such calls (and `TRYAGAIN`, `CLUSTERDOWN`,
//! `NOSCRIPT`, equally refused before running) go again one by one through the cluster
//! connection, which follows redirects, and the map is read again for the next broadcast. The
//! cluster connection's own pipelines cannot be used: a redirect in one reply makes it resend
//! the whole pipeline, running again the calls that had already run.
//!
//! Each master connection reads its server's `run_id` when it opens (as standalone links do), so
//! its calls bind epochs without the script's `INFO server` of the cluster path.
//!
//! The hub's tail check reads many channels' positions the same way (`read_by_master`): one
//! pipeline of reads per master instead of one script call per channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::join_all;
use herald_broker::{BrokerError, PublishTarget};
use herald_protocol::{ClientInfo, StreamPosition};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, ProtocolVersion, RedisConnectionInfo, RedisError, Value};

use crate::broker::Inner;
use crate::link;
use crate::publish::{Call, IDENTITY_ARG};
use crate::scripts;

/// Slots in a Redis Cluster.
const SLOTS: usize = 16_384;

/// Error codes that a Cluster answers before running a command: the call did nothing and goes
/// again through the cluster connection.
const REFUSED_BEFORE_RUNNING: [&str; 5] = ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT"];

/// Which master owns each slot, as `CLUSTER SLOTS` answered.
pub(crate) struct SlotMap {
    /// Per slot, an index into `masters`; `None` for a slot no master serves.
    owner: Vec<Option<u16>>,
    /// Master addresses, `host:port`.
    masters: Vec<String>,
}

impl SlotMap {
    /// The map in a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, …], replicas…], …]`.
    /// `None` when the reply has another shape or names a master by no usable host.
    pub(crate) fn from_reply(reply: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap {
            owner: vec![None; SLOTS],
            masters: Vec::new(),
        };
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok()?,
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            // "" or "?": the master's address is unknown (Redis 7 `cluster-preferred-endpoint-type`).
            if host.is_empty() || host == "?" {
                return None;
            }
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            let index = match map.masters.iter().position(|m| *m == addr) {
                Some(i) => i,
                None => {
                    map.masters.push(addr);
                    map.masters.len() - 1
                }
            };
            let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
            if start > end || end >= SLOTS {
                return None;
            }
            let index = u16::try_from(index).ok()?;
            for slot in &mut map.owner[start..=end] {
                *slot = Some(index);
            }
        }
        Some(map)
    }

    /// Master addresses, in the order `CLUSTER SLOTS` first names them (by slot, so a page
    /// cursor's master index stays meaningful while the map does not change).
    pub(crate) fn masters(&self) -> &[String] {
        &self.masters
    }

    /// The address of the master that owns `slot`, if any.
    pub(crate) fn master_of(&self, slot: usize) -> Option<&str> {
        let index = (*self.owner.get(slot)?)?;
        Some(&self.masters[usize::from(index)])
    }
}

/// This node's view of the Cluster's masters: the slot map and a connection to each master.
#[derive(Default)]
pub(crate) struct Masters {
    /// Connect with TLS (a `rediss://` seed, or `tls` in the config).
    tls: bool,
    /// The first seed's settings (credentials from its URL or the config): the cluster client
    /// uses them for every node it discovers, and so does this.
    settings: RedisConnectionInfo,
    /// `None`: read it before the next broadcast.
    map: Mutex<Option<Arc<SlotMap>>>,
    /// Per master address: its connection and the `run_id` of its server.
    conns: tokio::sync::Mutex<HashMap<String, (MultiplexedConnection, Arc<str>)>>,
}

/// Why a master's pipeline has no replies.
enum Unanswered {
    /// No connection to the master: nothing was sent.
    NotSent,
    /// Sent, but the replies did not all come back: what ran is unknown.
    Failed(BrokerError),
}

/// What became of one call sent in a master's pipeline.
enum Sent {
    /// Ran (or failed while running): its outcome.
    Done(Result<Vec<StreamPosition>, BrokerError>),
    /// Refused before running: send it again through the cluster connection.
    Again,
}

impl Masters {
    pub(crate) fn new(tls: bool, settings: RedisConnectionInfo) -> Masters {
        Masters {
            tls,
            settings,
            ..Masters::default()
        }
    }

    /// Read the slot map afresh before the next broadcast.
    fn forget_map(&self) {
        *self.map.lock().expect("slot map lock") = None;
    }
}

impl Inner {
    /// Publish `calls` (each of one slot), grouped into one pipeline per master; calls that no
    /// pipeline took (slot map unknown, a master unreachable, a redirect) go one by one through
    /// the cluster connection. Each call's targets with its outcome.
    pub(crate) async fn publish_by_master<'t>(
        &self,
        targets: &[PublishTarget],
        calls: Vec<Call<'t>>,
        data: &Bytes,
        info: Option<&ClientInfo>,
    ) -> Vec<(&'t [usize], Result<Vec<StreamPosition>, BrokerError>)> {
        let mut by_master: HashMap<String, Vec<Call<'t>>> = HashMap::new();
        let mut again: Vec<Call<'t>> = Vec::new();
        match self.slot_map().await {
            Some(map) => {
                for call in calls {
                    match map.master_of(call.place) {
                        Some(addr) => by_master.entry(addr.to_owned()).or_default().push(call),
                        None => again.push(call),
                    }
                }
            }
            None => again = calls,
        }
        let pipelines = by_master.into_iter().map(|(addr, calls)| async move {
            let sent = self.pipeline(&addr, targets, &calls, data, info).await;
            calls.into_iter().zip(sent).collect::<Vec<_>>()
        });
        let mut done = Vec::new();
        for (call, sent) in join_all(pipelines).await.into_iter().flatten() {
            match sent {
                Sent::Done(result) => done.push((call.chunk, result)),
                Sent::Again => again.push(call),
            }
        }
        if !again.is_empty() {
            tracing::debug!(calls = again.len(), "cluster calls sent again one by one");
        }
        let one_by_one = again.into_iter().map(|call| async move {
            let entries = call.entries(targets);
            let result = self.publish_call(0, &entries, data, info).await;
            (call.chunk, result)
        });
        done.extend(join_all(one_by_one).await);
        done
    }

    /// The slot map, read with `CLUSTER SLOTS` when not known; `None` when it cannot be read.
    pub(crate) async fn slot_map(&self) -> Option<Arc<SlotMap>> {
        if let Some(map) = self.masters.map.lock().expect("slot map lock").clone() {
            return Some(map);
        }
        let reply = self
            .run(0, |mut c| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut c)
                    .await
            })
            .await;
        let map = match reply.map(|r| SlotMap::from_reply(&r)) {
            Ok(Some(map)) => Arc::new(map),
            Ok(None) => {
                tracing::debug!(
                    "CLUSTER SLOTS names no usable master address; calls go one by one"
                );
                return None;
            }
            Err(e) => {
                tracing::debug!(cause = %e, "CLUSTER SLOTS failed; calls go one by one");
                return None;
            }
        };
        *self.masters.map.lock().expect("slot map lock") = Some(map.clone());
        Some(map)
    }

    /// This node's connection to the master at `addr` and its server's `run_id`, opened (with
    /// the publish script loaded) when there is none.
    async fn master_conn(
        &self,
        addr: &str,
    ) -> Result<(MultiplexedConnection, Arc<str>), BrokerError> {
        if let Some(c) = self.masters.conns.lock().await.get(addr) {
            return Ok(c.clone());
        }
        // Not locked while connecting: a master that does not answer must not hold up the
        // pipelines to the others. Two broadcasts may both connect; the later one is kept.
        let scheme = if self.masters.tls { "rediss" } else { "redis" };
        let info = link::connection_info(
            &format!("{scheme}://{addr}"),
            &self.cfg,
            ProtocolVersion::RESP2,
        )?
        .set_redis_settings(self.masters.settings.clone());
        let client = link::client(info, &self.cfg)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.cfg.connect_timeout()))
            .set_response_timeout(Some(self.cfg.command_timeout()));
        let opened = async {
            let mut c = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
            let run_id = link::run_id(&info).map(Arc::from).ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "INFO server has no run_id",
                ))
            })?;
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(scripts::PUBLISH_SOURCE)
                .query_async::<String>(&mut c)
                .await?;
            Ok::<_, RedisError>((c, run_id))
        };
        let conn = tokio::time::timeout(self.cfg.connect_timeout() * 2, opened)
            .await
            .map_err(|_| {
                BrokerError::unavailable(format!("redis master {addr}: connect timed out"))
            })?
            .map_err(link::broker_error)?;
        self.masters
            .conns
            .lock()
            .await
            .insert(addr.to_owned(), conn.clone());
        Ok(conn)
    }

    /// Run one command on the master at `addr` (a command for that node only, such as `SCAN`),
    /// on this node's connection to it. A failure drops the connection and the slot map, as a
    /// failed pipeline does.
    pub(crate) async fn on_master<T: redis::FromRedisValue>(
        &self,
        addr: &str,
        cmd: redis::Cmd,
    ) -> Result<T, BrokerError> {
        let (mut conn, _) = match self.master_conn(addr).await {
            Ok(c) => c,
            Err(e) => {
                self.masters.forget_map();
                return Err(e);
            }
        };
        let started = Instant::now();
        let reply =
            tokio::time::timeout(self.cfg.command_timeout(), cmd.query_async::<T>(&mut conn)).await;
        self.metrics.observe_rtt(started.elapsed());
        let err = match reply {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => link::broker_error(e),
            Err(_) => BrokerError::unavailable(format!("redis master {addr}: timed out")),
        };
        self.masters.conns.lock().await.remove(addr);
        self.masters.forget_map();
        Err(err)
    }

    /// Run one read-only command per key (`read(key)`), grouped into one pipeline per master:
    /// each key's reply with the identity its master's epochs bind to, or `None` where no
    /// pipeline answered for it (slot map unknown, master unreachable, a redirect or a failed
    /// pipeline). A read changes nothing, so the caller may read a `None` again any other way.
    pub(crate) async fn read_by_master(
        &self,
        keys: &[String],
        read: impl Fn(&str) -> redis::Cmd,
    ) -> Vec<Option<(Value, Arc<str>)>> {
        let mut out: Vec<Option<(Value, Arc<str>)>> = keys.iter().map(|_| None).collect();
        let Some(map) = self.slot_map().await else {
            return out;
        };
        let mut by_master: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            if let Some(addr) = map.master_of(usize::from(crate::names::slot(key))) {
                by_master.entry(addr).or_default().push(i);
            }
        }
        let read = &read;
        let pipelines = by_master.into_iter().map(|(addr, idx)| async move {
            let replies = self
                .master_pipeline(addr, idx.len(), |_| {
                    let mut pipe = redis::pipe();
                    for &i in &idx {
                        pipe.add_command(read(&keys[i]));
                    }
                    pipe
                })
                .await
                .ok();
            (idx, replies)
        });
        for (idx, replies) in join_all(pipelines).await {
            let Some((replies, identity)) = replies else {
                continue;
            };
            for (i, reply) in idx.into_iter().zip(replies) {
                match reply.extract_error() {
                    Ok(value) => out[i] = Some((value, identity.clone())),
                    Err(e) => {
                        if e.code()
                            .is_some_and(|c| REFUSED_BEFORE_RUNNING.contains(&c))
                        {
                            self.masters.forget_map();
                        }
                    }
                }
            }
        }
        out
    }

    /// Send a pipeline of `n` commands to the master at `addr`, built by `build` from the
    /// identity its epochs bind to (its server's `run_id`, `""` with synchronous persistence):
    /// the replies and that identity. On failure the connection (if any) and the slot map are
    /// dropped.
    async fn master_pipeline(
        &self,
        addr: &str,
        n: usize,
        build: impl FnOnce(&Arc<str>) -> redis::Pipeline,
    ) -> Result<(Vec<Value>, Arc<str>), Unanswered> {
        let Ok((mut conn, run_id)) = self.master_conn(addr).await else {
            self.masters.forget_map();
            return Err(Unanswered::NotSent);
        };
        let identity = if self.cfg.synchronous_persistence {
            Arc::from("")
        } else {
            run_id
        };
        let pipe = build(&identity);
        let started = Instant::now();
        let replies = tokio::time::timeout(
            self.cfg.command_timeout(),
            conn.req_packed_commands(&pipe, 0, n),
        )
        .await;
        self.metrics.observe_rtt(started.elapsed());
        let err = match replies {
            Ok(Ok(replies)) if replies.len() == n => return Ok((replies, identity)),
            Ok(Ok(replies)) => BrokerError::internal(format!(
                "redis master {addr} answered {} replies to {n} commands",
                replies.len()
            )),
            Ok(Err(e)) => link::broker_error(e),
            Err(_) => BrokerError::unavailable(format!("redis master {addr}: timed out")),
        };
        self.masters.conns.lock().await.remove(addr);
        self.masters.forget_map();
        Err(Unanswered::Failed(err))
    }

    /// Send `calls` to the master at `addr` as one pipeline of `EVALSHA`s: what became of each.
    async fn pipeline(
        &self,
        addr: &str,
        targets: &[PublishTarget],
        calls: &[Call<'_>],
        data: &Bytes,
        info: Option<&ClientInfo>,
    ) -> Vec<Sent> {
        let entries: Vec<_> = calls.iter().map(|call| call.entries(targets)).collect();
        let sent = self
            .master_pipeline(addr, calls.len(), |identity| {
                let mut pipe = redis::pipe();
                for call_entries in &entries {
                    let mut args = self.publish_args(call_entries, data, info);
                    args.argv[IDENTITY_ARG] = identity.as_bytes().to_vec();
                    let cmd = pipe
                        .cmd("EVALSHA")
                        .arg(scripts::PUBLISH.get_hash())
                        .arg(args.keys.len());
                    for key in &args.keys {
                        cmd.arg(key);
                    }
                    for a in &args.argv {
                        cmd.arg(&a[..]);
                    }
                }
                pipe
            })
            .await;
        let replies = match sent {
            Ok((replies, _)) => replies,
            // Nothing was sent: the cluster connection may still reach the slots.
            Err(Unanswered::NotSent) => return calls.iter().map(|_| Sent::Again).collect(),
            // The calls' outcome is unknown (some may have run): they fail, as a call through
            // the cluster connection that timed out does.
            Err(Unanswered::Failed(err)) => {
                return entries
                    .iter()
                    .map(|e| Sent::Done(self.stored_positions(e, Err(err.clone()))))
                    .collect();
            }
        };
        replies
            .into_iter()
            .zip(&entries)
            .map(|(reply, entries)| match reply.extract_error() {
                Err(e)
                    if e.code()
                        .is_some_and(|c| REFUSED_BEFORE_RUNNING.contains(&c)) =>
                {
                    self.masters.forget_map();
                    Sent::Again
                }
                Err(e) => Sent::Done(self.stored_positions(entries, Err(link::broker_error(e)))),
                Ok(reply) => {
                    let answer = redis::from_redis_value::<Vec<(String, u64, u8)>>(reply)
                        .map_err(|e| link::broker_error(e.into()));
                    Sent::Done(self.stored_positions(entries, answer))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
        ])
    }

    #[test]
    fn cluster_slots_reply_maps_each_slot_to_its_master() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7001),
            range(5461, 10922, "127.0.0.1", 7002),
            range(10923, 16383, "127.0.0.1", 7003),
            range(100, 100, "::1", 7004),
        ]);
        let map = SlotMap::from_reply(&reply).expect("a map");
        assert_eq!(map.master_of(0), Some("127.0.0.1:7001"));
        assert_eq!(map.master_of(5461), Some("127.0.0.1:7002"));
        assert_eq!(map.master_of(16383), Some("127.0.0.1:7003"));
        assert_eq!(map.master_of(100), Some("[::1]:7004"), "a later range wins");
        assert_eq!(map.master_of(16384), None);
    }

    #[test]
    fn unserved_slots_and_unknown_hosts() {
        let partial = SlotMap::from_reply(&Value::Array(vec![range(0, 10, "10.0.0.1", 6379)]))
            .expect("a map");
        assert_eq!(partial.master_of(11), None);
        assert!(SlotMap::from_reply(&Value::Array(vec![range(0, 10, "?", 6379)])).is_none());
        assert!(SlotMap::from_reply(&Value::Array(vec![range(0, 10, "", 6379)])).is_none());
        assert!(SlotMap::from_reply(&Value::Array(vec![range(5, 16384, "h", 1)])).is_none());
        assert!(SlotMap::from_reply(&Value::Int(1)).is_none());
    }
}
