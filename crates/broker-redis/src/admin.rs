//! What the admin UI asks of a channel's history beyond reading it: removing it, and listing the
//! channels that hold one.
//!
//! The listing walks the history keys with `SCAN … MATCH <prefix>:{*}:h TYPE stream`, a bounded
//! number of `SCAN` calls per page (each `COUNT` [`SCAN_COUNT`]), so a page never blocks Redis
//! for long, whatever the key count; the page's cursor is `<shard>:<scan cursor>`.
//!
//! On a Cluster a `SCAN` reaches one node only, so each master is scanned in turn, on this node's
//! connection to it (the masters and connections of the broadcast pipeline, `masters.rs`); the
//! cursor is `<master index>:<scan cursor>`, the index into the master list of `CLUSTER SLOTS`.
//! Replicas are not scanned (they hold copies). The master list is read again when a master
//! fails; a list that changed between two pages (a failover, a resharding), or a slot that is
//! migrating (its keys on two masters for a while), may make the listing skip or repeat names,
//! as a `SCAN` itself may repeat them: callers tolerate repeats.

use herald_broker::{BrokerError, HistoryChannels};
use redis::Value;

use crate::broker::Inner;
use crate::link::Commands;

/// Keys a `SCAN` call looks at (a hint to Redis; about the work of one call).
const SCAN_COUNT: usize = 1000;
/// `SCAN` calls per page at most: a page looks at about `SCAN_COUNT × SCAN_CALLS` keys.
const SCAN_CALLS: usize = 20;

impl Inner {
    /// Delete the channel's history stream; its meta hash (epoch, top offset) stays.
    pub(crate) async fn remove_history(&self, channel: &str) -> Result<(), BrokerError> {
        let k = self.names.channel(channel);
        self.run(self.shard(channel), |mut c| async move {
            redis::cmd("DEL")
                .arg(&k.history)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// One page of the channels with a history stream (see the module docs).
    pub(crate) async fn history_channels(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryChannels>, BrokerError> {
        // Standalone: the shards, scanned on their links. Cluster: the masters.
        let masters = match &self.commands {
            Commands::Shards(_) => None,
            Commands::Cluster(_) => Some(self.slot_map().await.ok_or_else(|| {
                BrokerError::unavailable("redis cluster: CLUSTER SLOTS gave no master list")
            })?),
        };
        let nodes = match (&self.commands, &masters) {
            (_, Some(map)) => map.masters().len(),
            (Commands::Shards(links), None) => links.len(),
            (Commands::Cluster(_), None) => unreachable!("a cluster has a master list"),
        };
        let (mut shard, mut scan) = match cursor {
            None => (0, 0u64),
            Some(c) => parse_cursor(c, nodes)?,
        };
        let pattern = format!("{}:{{*}}:h", glob_escape(self.names.prefix()));
        let mut channels = Vec::new();
        for _ in 0..SCAN_CALLS {
            let command = scan_command(scan, &pattern);
            let (next, keys) = match &masters {
                None => {
                    self.run(shard, |mut c| async move {
                        command.query_async::<(u64, Vec<Value>)>(&mut c).await
                    })
                    .await?
                }
                Some(map) => self.on_master(&map.masters()[shard], command).await?,
            };
            channels.extend(keys.iter().filter_map(|k| {
                match k {
                    Value::BulkString(b) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|key| self.names.channel_of_history(key))
                        .map(str::to_owned),
                    _ => None,
                }
            }));
            scan = next;
            if scan == 0 {
                shard += 1;
                if shard == nodes {
                    return Ok(Some(HistoryChannels {
                        channels,
                        cursor: None,
                    }));
                }
            }
            if channels.len() >= limit {
                break;
            }
        }
        Ok(Some(HistoryChannels {
            channels,
            cursor: Some(format!("{shard}:{scan}")),
        }))
    }
}

/// One `SCAN` call for history streams from `scan`.
fn scan_command(scan: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(scan)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT)
        .arg("TYPE")
        .arg("stream");
    cmd
}

/// `<shard or master index>:<scan cursor>`, checked against the shard (or master) count.
fn parse_cursor(c: &str, shards: usize) -> Result<(usize, u64), BrokerError> {
    let bad = || BrokerError::internal(format!("redis: not a history listing cursor: {c:?}"));
    let (shard, scan) = c.split_once(':').ok_or_else(bad)?;
    let shard: usize = shard.parse().map_err(|_| bad())?;
    let scan: u64 = scan.parse().map_err(|_| bad())?;
    if shard >= shards {
        return Err(bad());
    }
    Ok((shard, scan))
}

/// `s` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_and_patterns() {
        assert_eq!(parse_cursor("1:42", 2).unwrap(), (1, 42));
        assert!(parse_cursor("2:0", 2).is_err());
        assert!(parse_cursor("x", 2).is_err());
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }
}
