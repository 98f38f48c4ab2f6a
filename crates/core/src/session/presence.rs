//! `presence` (every client, or one page) and `presence_stats`, and the reply bodies the HTTP API
//! shares.

use herald_broker::{Broker, PresencePage, PresenceStats};
use herald_protocol::command::PresenceParams;

use super::*;

/// The largest `limit` a `presence` page may ask for (client command and HTTP API).
pub const MAX_PRESENCE_PAGE: usize = 1000;

/// `{"clients": {client: {"user", "info"?}}, "cursor"?}`: `cursor` only on a page that has more
/// after it.
#[derive(Serialize)]
pub struct PresenceReply<'a> {
    clients: HashMap<&'a str, PresenceEntry<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<&'a str>,
}

#[derive(Serialize)]
struct PresenceEntry<'a> {
    user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    info: Option<&'a RawValue>,
}

impl<'a> From<&'a [ClientInfo]> for PresenceReply<'a> {
    fn from(clients: &'a [ClientInfo]) -> Self {
        PresenceReply {
            clients: clients
                .iter()
                .map(|c| {
                    (
                        c.client.as_str(),
                        PresenceEntry {
                            user: &c.user,
                            info: c.info.as_deref(),
                        },
                    )
                })
                .collect(),
            cursor: None,
        }
    }
}

impl<'a> From<&'a PresencePage> for PresenceReply<'a> {
    fn from(page: &'a PresencePage) -> Self {
        let mut reply = PresenceReply::from(&page.clients[..]);
        // The cursor is the page's last client id: the next page starts after it, so a client
        // that joins or leaves between pages neither shifts nor repeats the others.
        reply.cursor = page
            .clients
            .last()
            .filter(|_| page.more)
            .map(|c| c.client.as_str());
        reply
    }
}

/// What a `presence` request asks for: every client, or one page.
pub enum PresenceQuery {
    /// The whole member list (no `limit`).
    All,
    /// Up to `limit` clients after `cursor`.
    Page {
        /// The previous page's cursor.
        cursor: Option<String>,
        /// Page size, 1 to [`MAX_PRESENCE_PAGE`].
        limit: usize,
    },
}

impl PresenceQuery {
    /// Check `limit` and `cursor` (error 107 for a limit out of range, or a cursor without one).
    pub fn new(limit: Option<usize>, cursor: Option<String>) -> Result<Self, CommandError> {
        match (limit, cursor) {
            (None, None) => Ok(PresenceQuery::All),
            (None, Some(_)) => Err(CommandError::new(
                ErrorCode::BadRequest,
                "presence cursor needs a limit",
            )),
            (Some(limit), cursor) if (1..=MAX_PRESENCE_PAGE).contains(&limit) => {
                Ok(PresenceQuery::Page { cursor, limit })
            }
            (Some(limit), _) => Err(CommandError::new(
                ErrorCode::BadRequest,
                format!("presence limit {limit} is out of range: 1 to {MAX_PRESENCE_PAGE}"),
            )),
        }
    }

    /// Read what was asked from the broker, as the reply body.
    pub async fn run(
        &self,
        broker: &dyn Broker,
        channel: &str,
    ) -> Result<serde_json::Value, BrokerError> {
        let body = match self {
            PresenceQuery::All => {
                let clients = broker.presence(channel).await?;
                serde_json::to_value(PresenceReply::from(&clients[..]))
            }
            PresenceQuery::Page { cursor, limit } => {
                let page = broker
                    .presence_page(channel, cursor.as_deref(), *limit)
                    .await?;
                serde_json::to_value(PresenceReply::from(&page))
            }
        };
        Ok(body.expect("presence serializes"))
    }
}

/// `{"num_clients", "num_users"}`.
pub fn presence_stats_body(stats: &PresenceStats) -> serde_json::Value {
    serde_json::to_value(stats).expect("presence stats serialize")
}

impl Session {
    pub(super) async fn presence(
        &mut self,
        id: u64,
        p: PresenceParams,
    ) -> Result<Bytes, CommandError> {
        let query = PresenceQuery::new(p.limit, p.cursor)?;
        self.permit_presence(&p.channel)?;
        let body = query
            .run(self.ctx.hub.broker().as_ref(), &p.channel)
            .await
            .map_err(broker_error)?;
        Ok(reply(id, "presence", &body))
    }

    pub(super) async fn presence_stats(
        &mut self,
        id: u64,
        p: ChannelParams,
    ) -> Result<Bytes, CommandError> {
        self.permit_presence(&p.channel)?;
        let stats = self
            .ctx
            .hub
            .broker()
            .presence_stats(&p.channel)
            .await
            .map_err(broker_error)?;
        Ok(reply(id, "presence_stats", &presence_stats_body(&stats)))
    }

    /// The client may read the channel's presence, and its namespace keeps presence.
    fn permit_presence(&mut self, channel: &str) -> Result<(), CommandError> {
        let (ns, _) = self.permit(channel, Action::Presence)?;
        if !ns.presence {
            return Err(CommandError::new(
                ErrorCode::NotAvailable,
                "presence is off in this namespace",
            ));
        }
        Ok(())
    }
}
