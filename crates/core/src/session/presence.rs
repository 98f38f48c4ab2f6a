//! `presence`, and the reply body the HTTP API shares.

use super::*;

/// `{"clients": {client: {"user", "info"?}}}`.
#[derive(Serialize)]
pub struct PresenceReply<'a> {
    clients: HashMap<&'a str, PresenceEntry<'a>>,
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
        }
    }
}

impl Session {
    pub(super) async fn presence(
        &mut self,
        id: u64,
        p: ChannelParams,
    ) -> Result<Bytes, CommandError> {
        let (ns, _) = self.permit(&p.channel, Action::Presence)?;
        if !ns.presence {
            return Err(CommandError::new(
                ErrorCode::NotAvailable,
                "presence is off in this namespace",
            ));
        }
        let clients = self
            .ctx
            .hub
            .members(&p.channel)
            .await
            .map_err(broker_error)?;
        Ok(reply(id, "presence", &PresenceReply::from(&clients[..])))
    }
}
