//! Publishing: the atomic publish script (offset, history append, pub/sub in one step, with
//! idempotency keys and the rollback floor), and raw pub/sub payloads for presence changes and
//! control messages.

use std::time::Duration;

use bytes::Bytes;
use herald_broker::{new_epoch, BrokerError, ControlMessage, PublishOptions};
use herald_protocol::{ClientInfo, StreamPosition};

use crate::broker::Inner;
use crate::{codec, scripts};

/// How long an idempotency key is remembered (as in the memory broker).
const IDEMPOTENCY_TTL_S: u64 = 300;

/// Milliseconds for a script argument: at least 1, so a zero TTL never means "forever".
pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, u128::from(u64::MAX)) as u64
}

impl Inner {
    /// Publish through the script: the position it got, or why not.
    pub(crate) async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        let k = self.names.channel(channel);
        let idem = opts
            .idempotency_key
            .as_ref()
            .map(|key| self.names.idempotency(channel, key));
        let info_json = match &info {
            Some(i) => serde_json::to_vec(i)
                .map_err(|e| BrokerError::internal(e.to_string()).caused_by(e))?,
            None => Vec::new(),
        };
        let s = &opts.stream;
        let command = self.publish_command();
        let (floor_epoch, floor_offset) = self.dispatch.watermarks.floor(channel);
        let result = self
            .run(self.shard(channel), |mut c| async move {
                let mut inv = scripts::PUBLISH.prepare_invoke();
                inv.key(&k.meta).key(&k.history);
                if let Some(idem) = &idem {
                    inv.key(idem);
                }
                inv.arg(&k.pubsub)
                    .arg(command)
                    .arg(new_epoch())
                    .arg(s.history_size)
                    .arg(ms(s.history_ttl))
                    .arg(ms(s.meta_ttl))
                    .arg(&info_json[..])
                    .arg(&data[..])
                    .arg(IDEMPOTENCY_TTL_S)
                    .arg(&floor_epoch)
                    .arg(floor_offset);
                inv.invoke_async::<(String, u64, u8)>(&mut c).await
            })
            .await;
        match result {
            Ok((epoch, offset, duplicate)) => {
                self.dispatch.watermarks.observe(channel, &epoch, offset);
                if duplicate == 0 {
                    self.metrics.published.inc();
                }
                Ok(StreamPosition { epoch, offset })
            }
            Err(e) => {
                self.metrics.publish_errors.inc();
                Err(e)
            }
        }
    }

    /// A join or leave, on the channel's pub/sub channel (not stored).
    pub(crate) async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        let payload = codec::encode_presence(joined, who);
        let pubsub = self.names.pubsub(channel);
        self.publish_raw(self.shard(channel), pubsub, payload).await
    }

    /// A control message for every node. Standalone shards: the control channel lives on shard
    /// 0, where every node subscribes to it.
    pub(crate) async fn publish_control(
        &self,
        message: &ControlMessage,
    ) -> Result<(), BrokerError> {
        let payload = serde_json::to_vec(message)
            .map_err(|e| BrokerError::internal(e.to_string()).caused_by(e))?;
        self.publish_raw(0, self.names.control.clone(), payload)
            .await
    }

    /// `PUBLISH`/`SPUBLISH` a raw payload on `pubsub`, through `shard`'s command connection.
    async fn publish_raw(
        &self,
        shard: usize,
        pubsub: String,
        payload: Vec<u8>,
    ) -> Result<(), BrokerError> {
        let command = self.publish_command();
        self.run(shard, |mut c| async move {
            redis::cmd(command)
                .arg(&pubsub)
                .arg(payload)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }
}
