//! Work from outside the connection (API subscribe/unsubscribe, lost continuity) and its end.

use super::*;

impl Session {
    /// Act on controls from the API (server-side subscribe / unsubscribe).
    pub async fn handle_controls(&mut self, controls: Vec<Control>) {
        if self.connected.is_none() {
            return;
        }
        for control in controls {
            match control {
                Control::Subscribe(channel) => {
                    match self.prepare(&channel, None, None, true, None, None).await {
                        Ok((result, _)) => {
                            self.out.push(push_subscribed(&channel, &result));
                            self.activate(&channel, &result).await;
                        }
                        Err(e) => {
                            tracing::debug!(channel, cause = ?e, "server-side subscribe skipped")
                        }
                    }
                }
                Control::Unsubscribe(channel) => {
                    if self.leave(&channel).await {
                        self.out.push(push_unsub(
                            &channel,
                            codes::UNSUB_SERVER,
                            "unsubscribed by the server",
                        ));
                    }
                }
                Control::Lost { channel, reason } => {
                    let conn = self.connected.as_ref().expect("connected");
                    let server_side = conn.server_side.contains(&channel);
                    if !self.leave(&channel).await {
                        continue;
                    }
                    if server_side {
                        self.out.close(close(CloseCode::INSUFFICIENT_STATE, reason));
                    } else {
                        self.out
                            .push(push_unsub(&channel, codes::UNSUB_RESUBSCRIBE, &reason));
                    }
                }
            }
        }
    }

    /// The connection is gone: leave every channel and forget the client.
    pub async fn end(mut self) {
        let Some(conn) = self.connected.as_ref() else {
            return;
        };
        // In name order, not the map's (random per process): the same run leaves the same way,
        // which the deterministic simulation (crates/sim) needs to replay a seed.
        let mut channels: Vec<String> = conn.channels.keys().cloned().collect();
        channels.sort_unstable();
        let client = conn.client.clone();
        for channel in channels {
            self.leave(&channel).await;
        }
        self.ctx.hub.unregister(&client);
    }
}
