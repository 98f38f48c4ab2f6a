//! `rpc`: answered by the backend's rpc hook.

use super::*;

/// Longest `rpc` method name.
const MAX_RPC_METHOD_LEN: usize = 255;

impl Session {
    /// `rpc`: the backend's `result.data` is the reply.
    pub(super) async fn rpc(&mut self, id: u64, p: RpcParams) -> Result<Bytes, Refusal> {
        let Some(proxy) = self.hook(Hook::Rpc) else {
            return Err(CommandError::new(ErrorCode::NotAvailable, "rpc is not configured").into());
        };
        if p.method.len() > MAX_RPC_METHOD_LEN {
            return Err(CommandError::new(
                ErrorCode::BadRequest,
                format!("rpc method longer than {MAX_RPC_METHOD_LEN} bytes"),
            )
            .into());
        }
        if let Some(data) = &p.data {
            check_data_depth(data.get())?;
        }
        let r: DataResult = self
            .ask_connected(
                proxy.as_ref(),
                Hook::Rpc,
                None,
                Some(&p.method),
                p.data.as_deref(),
            )
            .await?;
        #[derive(Serialize)]
        struct RpcReply<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            data: Option<&'a RawValue>,
        }
        Ok(reply(
            id,
            "rpc",
            &RpcReply {
                data: r.data.as_deref(),
            },
        ))
    }
}
