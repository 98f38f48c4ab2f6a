//! The audit log of admin actions: who did what to which target, and when.
//!
//! Per node: each node keeps the actions taken through its own admin UI or API, the last
//! [`KEPT`] in memory (older ones are dropped), and writes each one as a structured log line
//! (`INFO herald::admin::audit` with fields `who`, `source`, `action`, `target`, `ok`), which is
//! where a durable, cluster-wide record belongs (the log collector). Nothing secret is recorded:
//! `who` names the credential (`password`, `token`) or the login session (`session-<n>`), never
//! its value.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Mutex;

use serde::Serialize;

use crate::cluster::unix_ms;

/// Entries kept in memory per node; the oldest is dropped beyond.
pub const KEPT: usize = 1000;

/// One admin action.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// When, ms since the epoch (this node's clock).
    pub at_ms: u64,
    /// Which credential or login session acted: `password`, `token` (bearer) or `session-<n>`
    /// (the n-th browser login on this node).
    pub who: String,
    /// The caller's address (the TCP peer).
    pub source: String,
    /// `login`, `publish`, `broadcast`, `disconnect`, `subscribe`, `unsubscribe`, …
    pub action: String,
    /// What it acted on: a channel, `user=…`/`client=…`, or empty.
    pub target: String,
    /// Whether the action succeeded.
    pub ok: bool,
}

/// The last [`KEPT`] admin actions on this node.
#[derive(Default)]
pub struct AuditLog {
    entries: Mutex<VecDeque<Entry>>,
}

impl AuditLog {
    /// Record one action: kept in memory and logged.
    pub fn record(&self, who: &str, source: IpAddr, action: &str, target: &str, ok: bool) {
        tracing::info!(
            target: "herald::admin::audit",
            who,
            source = %source,
            action,
            target,
            ok,
            "admin action"
        );
        let entry = Entry {
            at_ms: unix_ms(),
            who: who.to_owned(),
            source: source.to_string(),
            action: action.to_owned(),
            target: target.to_owned(),
            ok,
        };
        let mut entries = self.entries.lock().expect("audit lock");
        if entries.len() == KEPT {
            entries.pop_front();
        }
        entries.push_back(entry);
    }

    /// The newest `limit` entries, newest first.
    pub fn newest(&self, limit: usize) -> Vec<Entry> {
        let entries = self.entries.lock().expect("audit lock");
        entries.iter().rev().take(limit).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_entries_newest_first() {
        let log = AuditLog::default();
        let ip = IpAddr::from([127, 0, 0, 1]);
        for n in 0..KEPT + 5 {
            log.record("password", ip, "publish", &format!("c{n}"), true);
        }
        let all = log.newest(usize::MAX);
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0].target, format!("c{}", KEPT + 4));
        assert_eq!(all[KEPT - 1].target, "c5");
        assert_eq!(log.newest(2).len(), 2);
    }
}
