//! `history`, and the reply body the HTTP API shares.

use super::*;

#[derive(Serialize)]
struct HistoryReply<'a> {
    epoch: &'a str,
    offset: u64,
    publications: Vec<PublicationWire<'a>>,
    /// With `since`: false when history no longer holds everything after it (extra field).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    incomplete: bool,
}

impl<'a> From<&'a herald_broker::HistoryResult> for HistoryReply<'a> {
    fn from(h: &'a herald_broker::HistoryResult) -> Self {
        HistoryReply {
            epoch: &h.position.epoch,
            offset: h.position.offset,
            publications: h.publications.iter().map(PublicationWire::from).collect(),
            incomplete: !h.continuous,
        }
    }
}

/// `history` reply body, shared with the HTTP API. Fails (never panics) on stored data that no
/// JSON parser here can read back, e.g. nested past serde_json's limit.
pub fn history_body(
    h: &herald_broker::HistoryResult,
) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(HistoryReply::from(h))
}

impl Session {
    pub(super) async fn history(
        &mut self,
        id: u64,
        p: HistoryParams,
    ) -> Result<Bytes, CommandError> {
        let (ns, _) = self.permit(&p.channel, Action::History)?;
        if !ns.history || ns.history_size == 0 {
            return Err(CommandError::new(
                ErrorCode::NotAvailable,
                "this namespace keeps no history for clients",
            ));
        }
        let query = HistoryQuery {
            since: p.since,
            limit: p.limit,
        };
        let h = self
            .ctx
            .hub
            .broker()
            .history(&p.channel, &query, &ns.stream_options())
            .await
            .map_err(broker_error)?;
        Ok(reply(id, "history", &HistoryReply::from(&h)))
    }
}
