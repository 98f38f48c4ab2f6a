//! Pusher's "subscription counting" (opt-in per app, `enable_subscription_count`): the
//! subscribers of a non-presence channel receive `pusher_internal:subscription_count`
//! `{"subscription_count": N}` when the channel's count changes (pusher-js emits it as
//! `pusher:subscription_count` and keeps it in `channel.subscriptionCount`).
//!
//! N is the count for the cluster, from [`Census`] (this node's subscriptions exact, the other
//! nodes' about a second old). One task per node: a subscribe or unsubscribe here wakes it
//! (after [`GATHER`], so that a burst is read once), and while the node has counted channels it
//! also looks every [`POLL`] (other nodes' changes). A subscriber that has no count yet gets the
//! current one at once; one that has a count gets a change at most once per [`THROTTLE`] per
//! channel, so that a busy channel's subscribers are not flooded while others come and go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::Outbound;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::apps::PusherApp;
use super::census::{Census, Counts};
use super::wire;

/// Changes gathered this long after a wake-up before the counts are read.
const GATHER: Duration = Duration::from_millis(50);
/// How often the counts are read while the node has counted channels (other nodes' changes).
const POLL: Duration = Duration::from_secs(1);
/// A channel's subscribers that already have a count are sent a change at most this often.
pub const THROTTLE: Duration = Duration::from_secs(1);
/// Up to this many channels of an app are read one by one; more: the app's whole census.
const ONE_BY_ONE: usize = 8;

struct Subscriber {
    out: Arc<Outbound>,
    /// The count this subscriber was last sent.
    sent: Option<u64>,
}

/// A counted channel on this node.
struct Counted {
    app: Arc<PusherApp>,
    /// The Pusher channel name.
    name: String,
    /// By socket id.
    subscribers: HashMap<Arc<str>, Subscriber>,
    /// When a change was last sent to subscribers that had a count.
    changed_at: Option<Instant>,
}

/// See the module docs.
pub struct Counting {
    census: Arc<Census>,
    /// By Herald channel.
    channels: Mutex<HashMap<String, Counted>>,
    wake: Notify,
}

impl Counting {
    /// Start the node's task.
    pub fn start(census: Arc<Census>) -> Arc<Counting> {
        let counting = Arc::new(Counting {
            census,
            channels: Mutex::default(),
            wake: Notify::new(),
        });
        tokio::spawn(run(counting.clone()));
        counting
    }

    /// A connection subscribed to `name` (Herald channel `internal`) of `app`.
    pub fn add(
        &self,
        app: &Arc<PusherApp>,
        name: &str,
        internal: &str,
        socket: &Arc<str>,
        out: &Arc<Outbound>,
    ) {
        let mut channels = self.channels.lock().expect("counting lock");
        let counted = channels
            .entry(internal.to_owned())
            .or_insert_with(|| Counted {
                app: app.clone(),
                name: name.to_owned(),
                subscribers: HashMap::new(),
                changed_at: None,
            });
        counted.subscribers.insert(
            socket.clone(),
            Subscriber {
                out: out.clone(),
                sent: None,
            },
        );
        drop(channels);
        self.wake.notify_one();
    }

    /// A connection left `internal` (if it was counted there).
    pub fn remove(&self, internal: &str, socket: &str) {
        let mut channels = self.channels.lock().expect("counting lock");
        let Some(counted) = channels.get_mut(internal) else {
            return;
        };
        if counted.subscribers.remove(socket).is_none() {
            return;
        }
        if counted.subscribers.is_empty() {
            channels.remove(internal);
        }
        drop(channels);
        self.wake.notify_one();
    }

    /// Read the counts of every counted channel and send the changes.
    async fn pass(&self) {
        let mut wanted: HashMap<String, (Arc<PusherApp>, Vec<String>)> = HashMap::new();
        for counted in self.channels.lock().expect("counting lock").values() {
            wanted
                .entry(counted.app.config.id.clone())
                .or_insert_with(|| (counted.app.clone(), Vec::new()))
                .1
                .push(counted.name.clone());
        }
        let mut counts: HashMap<String, Counts> = HashMap::new();
        for (id, (app, names)) in wanted {
            let read = match names.len() <= ONE_BY_ONE {
                true => {
                    let mut each = Counts::new();
                    let mut failed = None;
                    for name in names {
                        match self.census.channel(&app, &name).await {
                            Ok(n) => {
                                each.insert(name, n);
                            }
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    failed.map_or(Ok(each), Err)
                }
                false => self.census.channels(&app).await,
            };
            match read {
                Ok(c) => {
                    counts.insert(id, c);
                }
                Err(e) => {
                    tracing::warn!(app = %id, cause = %e, "subscription counts not read");
                }
            }
        }
        let now = Instant::now();
        let mut channels = self.channels.lock().expect("counting lock");
        for counted in channels.values_mut() {
            let Some(app_counts) = counts.get(&counted.app.config.id) else {
                continue;
            };
            let n = app_counts.get(&counted.name).copied().unwrap_or(0);
            let due = counted
                .changed_at
                .is_none_or(|at| now.duration_since(at) >= THROTTLE);
            let mut frame = None;
            let mut changed = false;
            for sub in counted.subscribers.values_mut() {
                if sub.sent == Some(n) || (sub.sent.is_some() && !due) {
                    continue;
                }
                changed |= sub.sent.is_some();
                sub.sent = Some(n);
                let frame = frame.get_or_insert_with(|| wire::subscription_count(&counted.name, n));
                sub.out.push(frame.clone());
            }
            if changed {
                counted.changed_at = Some(now);
            }
        }
    }
}

async fn run(counting: Arc<Counting>) {
    loop {
        let idle = counting.channels.lock().expect("counting lock").is_empty();
        if idle {
            counting.wake.notified().await;
        } else {
            let _ = tokio::time::timeout(POLL, counting.wake.notified()).await;
        }
        tokio::time::sleep(GATHER).await;
        counting.pass().await;
    }
}
