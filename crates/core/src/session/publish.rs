//! `publish` from a client, through the publish hook where the namespace has one.

use super::*;

impl Session {
    pub(super) async fn publish(&mut self, p: PublishParams) -> Result<StreamPosition, Refusal> {
        let (ns, allowed) = self.permit(&p.channel, Action::Publish)?;
        check_data_depth(p.data.get())?;
        herald_protocol::tags::check_tags(&p.tags)
            .map_err(|why| CommandError::new(ErrorCode::BadRequest, why))?;
        let mut data = Bytes::copy_from_slice(p.data.get().as_bytes());
        if allowed == Allowed::IfPublishHookAllows {
            let Some(proxy) = self.channel_hook(Hook::Publish, Some(&p.channel)) else {
                return Err(
                    CommandError::new(ErrorCode::Internal, "publish proxy not configured").into(),
                );
            };
            let r: DataResult = self
                .ask_connected(
                    proxy.as_ref(),
                    Hook::Publish,
                    Some(&p.channel),
                    None,
                    Some(&p.data),
                )
                .await?;
            if let Some(rewritten) = r.data {
                if json_depth(rewritten.get()) > MAX_DATA_DEPTH {
                    tracing::error!(channel = %p.channel, "publish proxy's data nests too deep");
                    return Err(ErrorCode::Internal.into());
                }
                data = Bytes::copy_from_slice(rewritten.get().as_bytes());
            }
        }
        let conn = self.connected.as_ref().expect("connected");
        let info = conn.who();
        let opts = PublishOptions {
            stream: ns.stream_options(),
            idempotency_key: None,
            traceparent: None,
            tags: p.tags,
            skip_history: false,
        };
        let position = self
            .ctx
            .hub
            .publish(&p.channel, data, Some(info), &opts)
            .await
            .map_err(broker_error)?;
        Ok(position)
    }
}
