//! History: the history script (read from a position, with the epoch check and the rollback
//! floor) and the parsing of its reply.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use herald_broker::{new_epoch, BrokerError, HistoryQuery, HistoryResult, StreamOptions};
use herald_protocol::{Publication, StreamPosition};
use redis::Value;

use crate::broker::Inner;
use crate::publish::ms;
use crate::scripts;

impl Inner {
    /// Publications of `channel` after `query.since` (or its top), and whether they continue it.
    pub(crate) async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        let k = self.names.channel(channel);
        let (since_epoch, since_offset) = match &query.since {
            Some(p) => (p.epoch.clone(), p.offset),
            None => (String::new(), 0),
        };
        let limit: i64 = query
            .limit
            .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
        let (floor_epoch, floor_offset) = self.dispatch.watermarks.floor(channel);
        let reply = self
            .run(self.shard(channel), |mut c| async move {
                let identity = self.identity(&c);
                scripts::HISTORY
                    .key(&k.meta)
                    .key(&k.history)
                    .arg(new_epoch())
                    .arg(ms(opts.empty_ttl))
                    .arg(ms(opts.history_ttl))
                    .arg(&since_epoch)
                    .arg(since_offset)
                    .arg(limit)
                    .arg(&floor_epoch)
                    .arg(floor_offset)
                    .arg(&*identity)
                    .invoke_async::<Vec<Value>>(&mut c)
                    .await
            })
            .await?;
        let result = parse_history(reply)?;
        let top = &result.position;
        self.dispatch
            .watermarks
            .observe(channel, &top.epoch, top.offset);
        Ok(result)
    }
}

/// One channel's meta hash as `HMGET meta e o r` returns it: epoch, top offset, server identity.
type Meta = (Option<String>, Option<u64>, Option<String>);

/// The read of one channel's meta hash that [`Meta`] parses.
fn read_meta(meta: &str) -> redis::Cmd {
    let mut hmget = redis::cmd("HMGET");
    hmget.arg(meta).arg("e").arg("o").arg("r");
    hmget
}

impl Inner {
    /// The newest position of each channel, for the hub's tail check (up to hundreds a second).
    ///
    /// On standalone shards, one pipeline of `HMGET`s per shard reads the meta hashes: a script
    /// call per channel cost Redis about as much as a publication, so in a chat-like fan-in the
    /// tail check made Redis run nearly as many scripts as the publications did. A channel whose
    /// meta is not plainly current goes through the history script instead, which starts it over
    /// or extends it as a read does:
    /// - no meta (expired) or top offset 0 (a read-created stream, whose TTL each read extends);
    /// - bound to another server identity (Redis restarted or failed over);
    /// - below this node's watermark in the same epoch (Redis rolled back).
    ///
    /// On a Cluster the `HMGET`s go as one pipeline per master, on this node's connection to it
    /// (`crate::masters`); a channel that pipeline does not answer for (a redirect, a master
    /// unreachable) takes the history script through the cluster connection.
    pub(crate) async fn positions(
        &self,
        channels: &[(Arc<str>, StreamOptions)],
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        let mut out: Vec<Option<Result<StreamPosition, BrokerError>>> =
            channels.iter().map(|_| None).collect();
        if self.cluster {
            let metas: Vec<String> = channels
                .iter()
                .map(|(channel, _)| self.names.channel(channel).meta)
                .collect();
            let reads = self.read_by_master(&metas, read_meta).await;
            for (i, read) in reads.into_iter().enumerate() {
                let Some((reply, identity)) = read else {
                    continue;
                };
                if let Ok(meta) = redis::from_redis_value::<Meta>(reply) {
                    out[i] = self.current(&channels[i].0, &identity, meta).map(Ok);
                }
            }
        } else {
            let mut by_shard: HashMap<usize, Vec<usize>> = HashMap::new();
            for (i, (channel, _)) in channels.iter().enumerate() {
                by_shard.entry(self.shard(channel)).or_default().push(i);
            }
            let reads = by_shard.into_iter().map(|(shard, idx)| async move {
                let mut pipe = redis::pipe();
                for &i in &idx {
                    pipe.add_command(read_meta(&self.names.channel(&channels[i].0).meta));
                }
                let read = self
                    .run(shard, |mut c| async move {
                        let identity = self.identity(&c);
                        let metas: Vec<Meta> = pipe.query_async(&mut c).await?;
                        Ok((identity, metas))
                    })
                    .await;
                (idx, read)
            });
            for (idx, read) in futures_util::future::join_all(reads).await {
                match read {
                    Ok((identity, metas)) => {
                        for (i, meta) in idx.into_iter().zip(metas) {
                            out[i] = self.current(&channels[i].0, &identity, meta).map(Ok);
                        }
                    }
                    Err(e) => {
                        for i in idx {
                            out[i] = Some(Err(e.clone()));
                        }
                    }
                }
            }
        }
        // The rest at once, not one round trip after another: the connection pipelines them, so
        // Redis reads and answers many in one go. A quiet node's sweep is mostly these (every
        // read-created stream each minute), and one by one cost Redis more in I/O than in the
        // script (50,000 idle subscribers on 10,000 channels: 5% of a core; see
        // docs/benchmarks.md, "The sweep of quiet channels").
        let script = out
            .iter()
            .zip(channels)
            .filter(|(known, _)| known.is_none());
        let mut read = futures_util::future::join_all(script.map(|(_, (channel, opts))| async {
            self.history(channel, &HistoryQuery::POSITION, opts)
                .await
                .map(|h| h.position)
        }))
        .await
        .into_iter();
        out.into_iter()
            .map(|known| match known {
                Some(known) => known,
                None => read.next().expect("one script read per unknown channel"),
            })
            .collect()
    }

    /// The position a meta hash read plainly gives, or `None` when the history script must
    /// decide (see [`Inner::positions`]).
    fn current(&self, channel: &str, identity: &str, meta: Meta) -> Option<StreamPosition> {
        let (Some(epoch), Some(offset), bound) = meta else {
            return None;
        };
        if offset == 0 || (!identity.is_empty() && bound.as_deref() != Some(identity)) {
            return None;
        }
        let (floor_epoch, floor_offset) = self.dispatch.watermarks.floor(channel);
        if floor_epoch == epoch && offset < floor_offset {
            return None;
        }
        self.dispatch.watermarks.observe(channel, &epoch, offset);
        Some(StreamPosition { epoch, offset })
    }
}

fn bad_reply(what: &str) -> BrokerError {
    BrokerError::internal(format!("redis: unexpected reply to {what}"))
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

fn into_string(v: Value) -> Option<String> {
    String::from_utf8(into_bytes(v)?).ok()
}

/// Parse the history script's reply.
fn parse_history(reply: Vec<Value>) -> Result<HistoryResult, BrokerError> {
    let mut it = reply.into_iter();
    let epoch = it
        .next()
        .and_then(into_string)
        .ok_or_else(|| bad_reply("history"))?;
    let top = it
        .next()
        .as_ref()
        .and_then(as_u64)
        .ok_or_else(|| bad_reply("history"))?;
    let continuous = it
        .next()
        .as_ref()
        .and_then(as_u64)
        .ok_or_else(|| bad_reply("history"))?
        == 1;
    let mut publications = Vec::new();
    let mut stored_at_ms = Vec::new();
    while let Some(offset) = it.next() {
        let offset = as_u64(&offset).ok_or_else(|| bad_reply("history"))?;
        let data = it
            .next()
            .and_then(into_bytes)
            .ok_or_else(|| bad_reply("history"))?;
        let info = it
            .next()
            .and_then(into_bytes)
            .ok_or_else(|| bad_reply("history"))?;
        let (info, tags) =
            herald_broker::meta::decode_meta(&info).ok_or_else(|| bad_reply("history info"))?;
        let id = it
            .next()
            .and_then(into_string)
            .ok_or_else(|| bad_reply("history"))?;
        // The entry id's first part is the Redis time (ms) when it was appended.
        let ms = id
            .split_once('-')
            .and_then(|(ms, _)| ms.parse().ok())
            .ok_or_else(|| bad_reply("history entry id"))?;
        publications.push(Publication {
            offset,
            data: Bytes::from(data),
            info,
            tags,
        });
        stored_at_ms.push(ms);
    }
    Ok(HistoryResult {
        position: StreamPosition { epoch, offset: top },
        publications,
        continuous,
        stored_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_history_reply() {
        let reply = vec![
            Value::BulkString(b"ep".to_vec()),
            Value::Int(9),
            Value::Int(1),
            Value::BulkString(b"8".to_vec()),
            Value::BulkString(b"{\"a\":1}".to_vec()),
            Value::BulkString(Vec::new()),
            Value::BulkString(b"1764290000000-0".to_vec()),
            Value::BulkString(b"9".to_vec()),
            Value::BulkString(b"2".to_vec()),
            Value::BulkString(br#"{"user":"u","client":"c"}"#.to_vec()),
            Value::BulkString(b"1764290000001-3".to_vec()),
        ];
        let h = parse_history(reply).unwrap();
        assert_eq!(
            h.position,
            StreamPosition {
                epoch: "ep".into(),
                offset: 9
            }
        );
        assert!(h.continuous);
        assert_eq!(h.publications.len(), 2);
        assert!(h.publications[0].info.is_none());
        assert_eq!(h.publications[1].info.as_ref().unwrap().client, "c");
        assert_eq!(h.stored_at_ms, [1764290000000, 1764290000001]);
        assert!(parse_history(vec![Value::Nil]).is_err());
    }
}
