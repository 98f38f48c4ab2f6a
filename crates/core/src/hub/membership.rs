//! Presence: who is subscribed to a channel across the cluster, and the `join`/`leave` pushes.
//! Every protocol (Herald's session, the Pusher connection) records membership through these, so
//! what a join or leave does, and what it logs when the broker fails, is decided here once.

use super::*;

impl Hub {
    /// Record `who` as present on `channel`; with `announce`, publish its `join` to the
    /// channel's subscribers on every node. A broker failure is logged and not fatal: presence is
    /// best effort, the subscription itself stands.
    pub async fn join(&self, channel: &str, who: &ClientInfo, announce: bool) {
        let broker = self.broker();
        if let Err(e) = broker.add_presence(channel, who).await {
            tracing::warn!(channel, cause = %e, "presence not recorded");
        }
        if announce {
            if let Err(e) = broker.publish_presence_change(channel, true, who).await {
                tracing::warn!(channel, cause = %e, "join not published");
            }
        }
    }

    /// Forget `who` on `channel`; with `announce`, publish its `leave`.
    pub async fn leave(&self, channel: &str, who: &ClientInfo, announce: bool) {
        let broker = self.broker();
        if let Err(e) = broker.remove_presence(channel, &who.client).await {
            tracing::warn!(channel, cause = %e, "presence not removed");
        }
        if announce {
            if let Err(e) = broker.publish_presence_change(channel, false, who).await {
                tracing::warn!(channel, cause = %e, "leave not published");
            }
        }
    }

    /// Everyone present on `channel`, across the cluster.
    pub async fn members(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.broker().presence(channel).await
    }
}
