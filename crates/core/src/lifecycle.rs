//! Lifecycle events (connect, subscribe, unsubscribe, disconnect) as the hub sees them, for a
//! sink the server installs (the durable lifecycle stream). The hub calls the sink at the points
//! every protocol passes through (the client registry and live subscriptions), so each front
//! door reports the same events without code of its own. No sink: one atomic load per event.

use std::sync::Arc;

use crate::hub::ConnKey;

/// Receives the hub's lifecycle events, in the order they happen on one connection. Called
/// under no lock the sink could contend on, and must not block (queue and return).
pub trait LifecycleSink: Send + Sync {
    /// A connection registered (it is connected, as `user`; empty for anonymous).
    fn connected(&self, key: ConnKey, client: &Arc<str>, user: &Arc<str>);
    /// A registered connection's user changed (a Pusher connection signed in).
    fn user_changed(&self, client: &str, user: &Arc<str>);
    /// A connection's subscription to `channel` went live.
    fn subscribed(&self, key: ConnKey, channel: &str);
    /// A connection's subscription to `channel` ended.
    fn unsubscribed(&self, key: ConnKey, channel: &str);
    /// How a connection is closing (called by the transport before the session ends; a
    /// connection that never says is reported as lost).
    fn closing(&self, client: &str, code: u16, reason: &str);
    /// A connection left the registry (after it left its channels).
    fn disconnected(&self, client: &str);
}
