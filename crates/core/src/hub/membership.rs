//! Presence: who is subscribed to a channel across the cluster, and the `join`/`leave` pushes.
//! Every protocol (Herald's session, the Pusher connection) records membership through these, so
//! what a join or leave does, and what it logs when the broker fails, is decided here once.
//! Presence is best effort: a broker failure is logged, and the subscription itself stands.

use super::*;

impl Hub {
    /// Record `who` as present on `channel`; with `announce`, publish its `join` to the
    /// channel's subscribers on every node.
    pub async fn join(&self, channel: &str, who: &ClientInfo, announce: bool) {
        self.add_member(channel, who).await;
        if announce {
            self.announce(channel, true, who).await;
        }
    }

    /// Forget `who` on `channel`; with `announce`, publish its `leave`.
    pub async fn leave(&self, channel: &str, who: &ClientInfo, announce: bool) {
        if let Err(e) = self.broker().remove_presence(channel, &who.client).await {
            tracing::warn!(channel, cause = %e, "presence not removed");
        }
        if announce {
            self.announce(channel, false, who).await;
        }
    }

    /// Record `who` as present without announcing it yet (a protocol that first reads the
    /// members, as Pusher's subscribe does, announces after).
    pub async fn add_member(&self, channel: &str, who: &ClientInfo) {
        if let Err(e) = self.broker().add_presence(channel, who).await {
            tracing::warn!(channel, cause = %e, "presence not recorded");
        }
    }

    /// Publish a `join` (`joined`) or `leave` of `who` to the channel's subscribers everywhere.
    pub async fn announce(&self, channel: &str, joined: bool, who: &ClientInfo) {
        if let Err(e) = self
            .broker()
            .publish_presence_change(channel, joined, who)
            .await
        {
            let what = if joined { "join" } else { "leave" };
            tracing::warn!(channel, cause = %e, "{what} not published");
        }
    }

    /// Everyone present on `channel`, across the cluster.
    pub async fn members(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.broker().presence(channel).await
    }
}
