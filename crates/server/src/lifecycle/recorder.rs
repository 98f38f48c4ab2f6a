//! The hub's lifecycle sink: keeps what each connection's events need (client, user, live
//! channels, how it closes, its event count) and queues the events, in order, for the log.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use herald_core::hub::ConnKey;
use herald_core::lifecycle::LifecycleSink;
use serde::Serialize;
use tokio::sync::mpsc;

/// One event as the endpoint receives it.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Event {
    /// Unique per event and the same on every delivery of it: deduplicate on it.
    pub(super) id: String,
    /// `connect`, `subscribe`, `unsubscribe` or `disconnect`.
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    /// When it happened on the node, in Unix milliseconds.
    pub(super) time_ms: u64,
    pub(super) node: String,
    pub(super) client: String,
    pub(super) user: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) channel: Option<String>,
    /// For `disconnect`: the close code and reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<String>,
}

/// What an event does to the node's connection set in the log (kept with it atomically).
#[derive(Debug, Clone)]
pub(super) enum Effect {
    /// The client is connected as this user.
    Connected(String),
    /// The client's subscription to this channel is live.
    Subscribed(String),
    /// It ended.
    Unsubscribed(String),
    /// The client left.
    Disconnected,
}

/// An event queued for the log.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) event: Event,
    pub(super) effect: Effect,
}

struct Conn {
    key: ConnKey,
    user: Arc<str>,
    channels: HashSet<String>,
    close: Option<(u16, String)>,
    /// Events emitted so far: the next event's sequence number.
    seq: u64,
}

#[derive(Default)]
struct State {
    clients: HashMap<ConnKey, Arc<str>>,
    conns: HashMap<Arc<str>, Conn>,
}

/// See the module docs.
pub struct Recorder {
    node: String,
    state: Mutex<State>,
    queue: Mutex<Option<mpsc::UnboundedSender<Entry>>>,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Recorder {
    pub(super) fn new(node: String, queue: mpsc::UnboundedSender<Entry>) -> Self {
        Recorder {
            node,
            state: Mutex::default(),
            queue: Mutex::new(Some(queue)),
        }
    }

    /// No more events: the writer ends once it wrote what is queued.
    pub(super) fn close(&self) {
        self.queue.lock().expect("lifecycle queue").take();
    }

    fn emit(&self, client: &str, conn: &mut Conn, kind: &'static str, effect: Effect) {
        let (channel, code, reason) = match (&effect, &conn.close) {
            (Effect::Subscribed(c) | Effect::Unsubscribed(c), _) => (Some(c.clone()), None, None),
            (Effect::Disconnected, Some((code, reason))) => {
                (None, Some(*code), Some(reason.clone()))
            }
            (Effect::Disconnected, None) => (None, Some(1006), Some("connection lost".into())),
            (Effect::Connected(_), _) => (None, None, None),
        };
        let event = Event {
            id: format!("{}/{client}/{}", self.node, conn.seq),
            kind,
            time_ms: now_ms(),
            node: self.node.clone(),
            client: client.to_owned(),
            user: conn.user.to_string(),
            channel,
            code,
            reason,
        };
        conn.seq += 1;
        if let Some(queue) = &*self.queue.lock().expect("lifecycle queue") {
            // The writer holds the receiver until the node stops; after that, nothing is said.
            let _ = queue.send(Entry { event, effect });
        }
    }
}

impl LifecycleSink for Recorder {
    fn connected(&self, key: ConnKey, client: &Arc<str>, user: &Arc<str>) {
        let mut state = self.state.lock().expect("lifecycle state");
        state.clients.insert(key, client.clone());
        let mut conn = Conn {
            key,
            user: user.clone(),
            channels: HashSet::new(),
            close: None,
            seq: 0,
        };
        self.emit(
            client,
            &mut conn,
            "connect",
            Effect::Connected(user.to_string()),
        );
        state.conns.insert(client.clone(), conn);
    }

    fn user_changed(&self, client: &str, user: &Arc<str>) {
        let mut state = self.state.lock().expect("lifecycle state");
        if let Some(conn) = state.conns.get_mut(client) {
            // Said as a fresh `connect` with the new user (a Pusher connection signed in).
            conn.user = user.clone();
            self.emit(client, conn, "connect", Effect::Connected(user.to_string()));
        }
    }

    fn subscribed(&self, key: ConnKey, channel: &str) {
        let mut state = self.state.lock().expect("lifecycle state");
        let State { clients, conns } = &mut *state;
        let Some((client, conn)) = clients
            .get(&key)
            .and_then(|c| conns.get_mut(c).map(|n| (c, n)))
        else {
            return;
        };
        if conn.channels.insert(channel.to_owned()) {
            self.emit(
                client,
                conn,
                "subscribe",
                Effect::Subscribed(channel.to_owned()),
            );
        }
    }

    fn unsubscribed(&self, key: ConnKey, channel: &str) {
        let mut state = self.state.lock().expect("lifecycle state");
        let State { clients, conns } = &mut *state;
        let Some((client, conn)) = clients
            .get(&key)
            .and_then(|c| conns.get_mut(c).map(|n| (c, n)))
        else {
            return;
        };
        if conn.channels.remove(channel) {
            self.emit(
                client,
                conn,
                "unsubscribe",
                Effect::Unsubscribed(channel.to_owned()),
            );
        }
    }

    fn closing(&self, client: &str, code: u16, reason: &str) {
        let mut state = self.state.lock().expect("lifecycle state");
        if let Some(conn) = state.conns.get_mut(client) {
            conn.close.get_or_insert_with(|| (code, reason.to_owned()));
        }
    }

    fn disconnected(&self, client: &str) {
        let mut state = self.state.lock().expect("lifecycle state");
        let Some(mut conn) = state.conns.remove(client) else {
            return;
        };
        state.clients.remove(&conn.key);
        // Channels still live (a session that ends unsubscribes first; this is the safety net).
        for channel in std::mem::take(&mut conn.channels) {
            self.emit(
                client,
                &mut conn,
                "unsubscribe",
                Effect::Unsubscribed(channel),
            );
        }
        self.emit(client, &mut conn, "disconnect", Effect::Disconnected);
    }
}
