//! Webhooks: `channel_occupied`, `channel_vacated`, `member_added`, `member_removed` and
//! `client_event`, batched per app, signed (`X-Pusher-Key`, `X-Pusher-Signature` = hex
//! HMAC-SHA256 of the body with the app secret) and retried with back-off.
//!
//! Occupancy is decided for the cluster, not the node: a node's first local subscriber to a
//! channel records the node in a broker presence set of its own (`pusher-occupancy:` and the
//! Herald channel; [`crate::cluster`]), and `channel_occupied` is sent when no other node was
//! there; the node's last subscriber leaving removes it, and `channel_vacated` is sent when the
//! set is empty. Two nodes
//! racing on the same channel may both report; no transition goes unreported.
//! `member_added`/`member_removed` are decided from the cluster-wide presence list.
//!
//! Order: each app's URL has one delivery queue, sent one batch at a time, and a failed batch is
//! retried in place, so a later batch never overtakes an earlier one (a retried
//! `channel_occupied` arriving after the `channel_vacated` that followed it). The queue holds at
//! most [`QUEUED_BATCHES`]; beyond, new batches are dropped (logged) rather than held without
//! bound while an endpoint is down.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_broker::Backoff;
use herald_core::Hub;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::apps::PusherApp;
use super::auth::sign;
use super::census::Census;
use crate::cluster::{self, unix_ms};

/// One `webhooks` entry of an app.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Where batches are POSTed.
    pub url: String,
    /// Event names sent there; empty: all of them.
    #[serde(default)]
    pub event_types: Vec<String>,
    /// Only events of channels whose names match (Soketi's webhook `filter`).
    #[serde(default)]
    pub filter: WebhookFilter,
    /// Extra request headers (an API key of the receiver, say); not `content-type` nor the
    /// `x-pusher-*` signature headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// Which channels' events a webhook receives (both given: both must match).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFilter {
    /// The channel name starts with this.
    #[serde(default)]
    pub channel_name_starts_with: Option<String>,
    /// The channel name ends with this.
    #[serde(default)]
    pub channel_name_ends_with: Option<String>,
}

/// Headers a webhook may not set: the request's own and the signature's.
const RESERVED_HEADERS: [&str; 5] = [
    "content-type",
    "content-length",
    "host",
    "x-pusher-key",
    "x-pusher-signature",
];

impl WebhookConfig {
    /// Refuse headers that are not valid HTTP or that the signed request sets itself. The error
    /// names the header, never its value (which may be a credential).
    pub fn check(&self) -> anyhow::Result<()> {
        for (name, value) in &self.headers {
            let lower = name.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) {
                anyhow::bail!("header {name:?} is set by Herald and may not be configured");
            }
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                anyhow::bail!("header name {name:?} is not a valid HTTP header name");
            }
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                anyhow::bail!("the value of header {name:?} is not a valid HTTP header value");
            }
        }
        Ok(())
    }

    /// Whether this webhook wants `event` (its type and its channel).
    fn wants(&self, event: &Value) -> bool {
        let name = event["name"].as_str();
        let typed = self.event_types.is_empty() || self.event_types.iter().any(|t| name == Some(t));
        let channel = event["channel"].as_str().unwrap_or("");
        let f = &self.filter;
        typed
            && f.channel_name_starts_with
                .as_deref()
                .is_none_or(|p| channel.starts_with(p))
            && f.channel_name_ends_with
                .as_deref()
                .is_none_or(|s| channel.ends_with(s))
    }
}

/// Events gathered into one request at most this long after the first.
const BATCH_WINDOW: Duration = Duration::from_millis(50);
/// Events in one request at most.
const MAX_BATCH: usize = 100;
/// Deliveries tried at most, 1 s apart doubling.
const ATTEMPTS: u32 = 5;
/// A delivery that takes longer fails (and is retried).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Batches waiting for one URL at most (while it is slow or down) before new ones are dropped.
pub const QUEUED_BATCHES: usize = 1000;

/// A signed batch for one URL.
struct Delivery {
    key: String,
    signature: String,
    body: String,
    /// The webhook's own headers.
    headers: BTreeMap<String, String>,
}

/// Where an app's batches go: the app id and the URL.
type Destination = (String, String);

enum Hook {
    /// The node's first local subscriber joined (or its last left) a channel.
    Occupancy {
        app: Arc<PusherApp>,
        internal: String,
        occupied: bool,
    },
    /// A ready event.
    Event { app: Arc<PusherApp>, event: Value },
    /// A subscription to `internal` began or ended on this node (an app with subscription
    /// counting): `subscription_count` with the cluster's count, once per batch and channel.
    Count {
        app: Arc<PusherApp>,
        internal: String,
    },
}

/// The node's webhook sender. See the module docs.
pub struct Webhooks {
    queue: mpsc::UnboundedSender<Hook>,
    /// Local subscribers per Herald channel of apps with webhooks.
    local: Mutex<HashMap<String, usize>>,
}

impl Webhooks {
    /// Start the sender: one task that batches, resolves occupancy and counts, and spawns
    /// deliveries.
    pub fn start(hub: Hub, census: Option<Arc<Census>>) -> Arc<Webhooks> {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, hub, census));
        Arc::new(Webhooks {
            queue,
            local: Mutex::default(),
        })
    }

    /// A Pusher subscription to `internal` began on this node.
    pub fn subscribed(&self, app: &Arc<PusherApp>, internal: &str) {
        let mut local = self.local.lock().expect("webhooks lock");
        let n = local.entry(internal.to_owned()).or_default();
        *n += 1;
        if *n == 1 {
            // Sent under the lock: the worker sees a channel's transitions in order.
            let _ = self.queue.send(Hook::Occupancy {
                app: app.clone(),
                internal: internal.to_owned(),
                occupied: true,
            });
        }
    }

    /// A Pusher subscription to `internal` ended on this node.
    pub fn unsubscribed(&self, app: &Arc<PusherApp>, internal: &str) {
        let mut local = self.local.lock().expect("webhooks lock");
        let Some(n) = local.get_mut(internal) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            local.remove(internal);
            let _ = self.queue.send(Hook::Occupancy {
                app: app.clone(),
                internal: internal.to_owned(),
                occupied: false,
            });
        }
    }

    /// The subscription count of `internal` changed here (subscription counting apps only).
    pub fn count_changed(&self, app: &Arc<PusherApp>, internal: &str) {
        let _ = self.queue.send(Hook::Count {
            app: app.clone(),
            internal: internal.to_owned(),
        });
    }

    /// Queue an event (`{"name", …}`) for the app's webhooks.
    pub fn event(&self, app: &Arc<PusherApp>, event: Value) {
        let _ = self.queue.send(Hook::Event {
            app: app.clone(),
            event,
        });
    }
}

async fn run(mut rx: mpsc::UnboundedReceiver<Hook>, hub: Hub, census: Option<Arc<Census>>) {
    let client = reqwest::Client::new();
    let mut queues: HashMap<Destination, mpsc::Sender<Delivery>> = HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = Instant::now() + BATCH_WINDOW;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(hook)) => batch.push(hook),
                _ => break,
            }
        }
        let mut per_app: HashMap<String, (Arc<PusherApp>, Vec<Value>)> = HashMap::new();
        let mut counted: Vec<(Arc<PusherApp>, String)> = Vec::new();
        for hook in batch {
            let (app, event) = match hook {
                Hook::Event { app, event } => (app, Some(event)),
                Hook::Count { app, internal } => {
                    if !counted.iter().any(|(_, c)| *c == internal) {
                        counted.push((app, internal));
                    }
                    continue;
                }
                Hook::Occupancy {
                    app,
                    internal,
                    occupied,
                } => {
                    let event = occupancy(&hub, &app, &internal, occupied).await;
                    (app, event)
                }
            };
            if let Some(event) = event {
                per_app
                    .entry(app.config.id.clone())
                    .or_insert_with(|| (app.clone(), Vec::new()))
                    .1
                    .push(event);
            }
        }
        for (app, internal) in counted {
            let (Some(census), Some(name)) = (&census, app.external(&internal)) else {
                continue;
            };
            match census.channel(&app, name).await {
                Ok(n) => per_app
                    .entry(app.config.id.clone())
                    .or_insert_with(|| (app.clone(), Vec::new()))
                    .1
                    .push(json!({"name": "subscription_count", "channel": name, "subscription_count": n})),
                Err(e) => tracing::warn!(channel = %internal, cause = %e, "subscription count not read for its webhook"),
            }
        }
        for (app, events) in per_app.into_values() {
            for hook in &app.config.webhooks {
                let wanted: Vec<&Value> = events.iter().filter(|e| hook.wants(e)).collect();
                if wanted.is_empty() {
                    continue;
                }
                let body = json!({"time_ms": unix_ms(), "events": wanted}).to_string();
                let delivery = Delivery {
                    key: app.config.key.clone(),
                    signature: sign(&app.config.secret, &body),
                    body,
                    headers: hook.headers.clone(),
                };
                let queue = queues
                    .entry((app.config.id.clone(), hook.url.clone()))
                    .or_insert_with(|| {
                        let (tx, rx) = mpsc::channel(QUEUED_BATCHES);
                        tokio::spawn(deliver_in_order(client.clone(), hook.url.clone(), rx));
                        tx
                    });
                if queue.try_send(delivery).is_err() {
                    tracing::error!(
                        url = hook.url,
                        app = app.config.id,
                        "webhook dropped: {QUEUED_BATCHES} batches already wait for this URL"
                    );
                }
            }
        }
    }
}

/// Record or clear this node in the channel's occupancy set; the cluster-wide transition, if any.
async fn occupancy(hub: &Hub, app: &PusherApp, internal: &str, occupied: bool) -> Option<Value> {
    let set = format!("pusher-occupancy:{internal}");
    let broker = hub.broker();
    let me = hub.node_name();
    let channel = app.external(internal)?;
    let transition = if occupied {
        let before = broker.presence(&set).await.ok()?;
        cluster::put::<()>(&**broker, &set, me, None).await.ok()?;
        !cluster::others_in(&before, me)
    } else {
        cluster::remove(&**broker, &set, me).await.ok()?;
        broker.presence(&set).await.ok()?.is_empty()
    };
    let name = if occupied {
        "channel_occupied"
    } else {
        "channel_vacated"
    };
    transition.then(|| json!({"name": name, "channel": channel}))
}

/// One URL's queue: each batch delivered (or given up) before the next is sent.
async fn deliver_in_order(client: reqwest::Client, url: String, mut rx: mpsc::Receiver<Delivery>) {
    while let Some(delivery) = rx.recv().await {
        deliver(&client, &url, delivery).await;
    }
}

async fn deliver(client: &reqwest::Client, url: &str, delivery: Delivery) {
    let Delivery {
        key,
        signature,
        body,
        headers,
    } = delivery;
    // 1, 2, 4, 8 s between the attempts.
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8)).exact();
    for attempt in 1..=ATTEMPTS {
        let mut request = client.post(url);
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        let sent = request
            .header("content-type", "application/json")
            .header("x-pusher-key", &key)
            .header("x-pusher-signature", &signature)
            .body(body.clone())
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => tracing::warn!(url, status = %r.status(), attempt, "webhook refused"),
            Err(e) => tracing::warn!(url, cause = %e, attempt, "webhook not delivered"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    tracing::error!(url, "webhook dropped after {ATTEMPTS} attempts");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(config: Value) -> WebhookConfig {
        serde_json::from_value(config).unwrap()
    }

    #[test]
    fn filters_match_type_and_channel() {
        let h = hook(json!({
            "url": "http://x",
            "event_types": ["channel_occupied"],
            "filter": {"channel_name_starts_with": "orders-", "channel_name_ends_with": "-eu"},
        }));
        let event = |name: &str, channel: &str| json!({"name": name, "channel": channel});
        assert!(h.wants(&event("channel_occupied", "orders-1-eu")));
        assert!(!h.wants(&event("channel_occupied", "orders-1-us")));
        assert!(!h.wants(&event("channel_occupied", "chat-1-eu")));
        assert!(!h.wants(&event("channel_vacated", "orders-1-eu")));
        assert!(hook(json!({"url": "http://x"})).wants(&event("member_added", "any")));
    }

    #[test]
    fn reserved_and_invalid_headers_are_refused_without_their_values() {
        let with = |name: &str, value: &str| hook(json!({"url": "u", "headers": {name: value}}));
        assert!(with("X-Api-Token", "t").check().is_ok());
        let why = with("X-Pusher-Signature", "secret-value")
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("X-Pusher-Signature") && !why.contains("secret-value"),
            "{why}"
        );
        let why = with("X-A", "line\nbreak").check().unwrap_err().to_string();
        assert!(why.contains("X-A") && !why.contains("break"), "{why}");
        assert!(with("bad name", "v").check().is_err());
    }
}
