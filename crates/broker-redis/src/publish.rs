//! Publishing: the atomic publish script (offset, history append, pub/sub in one step, with
//! idempotency keys and the rollback floor), one call for one channel or for several of one
//! slot, and raw pub/sub payloads for presence changes and control messages.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use herald_broker::{new_epoch, BrokerError, ControlMessage, PublishOptions, PublishTarget};
use herald_protocol::tags::Tags;
use herald_protocol::{ClientInfo, StreamPosition};

use crate::broker::Inner;
use crate::{codec, names, scripts};

/// How long an idempotency key is remembered (as in the memory broker).
const IDEMPOTENCY_TTL_S: u64 = 300;

/// Milliseconds for a script argument: at least 1, so a zero TTL never means "forever".
pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, u128::from(u64::MAX)) as u64
}

/// At most this many channels per script call. Redis spends about 8 µs a channel in it, so a
/// call holds Redis's one thread for under a millisecond and other commands interleave.
const MAX_CHANNELS_PER_CALL: usize = 64;

/// One channel of a script call: its name and options.
pub(crate) type Entry<'a> = (&'a str, &'a PublishOptions);

/// The index of the server identity in the publish script's `ARGV` (`ARGV[6]`).
pub(crate) const IDENTITY_ARG: usize = 5;

/// The `KEYS` and `ARGV` of one publish script call.
pub(crate) struct ScriptArgs {
    pub(crate) keys: Vec<String>,
    pub(crate) argv: Vec<Vec<u8>>,
}

/// One script call of a broadcast: the slot (Cluster) or shard it goes to, and the indices of
/// its targets.
pub(crate) struct Call<'t> {
    pub(crate) place: usize,
    pub(crate) chunk: &'t [usize],
}

impl Call<'_> {
    /// The call's channels and options.
    pub(crate) fn entries<'a>(&self, targets: &'a [PublishTarget]) -> Vec<Entry<'a>> {
        self.chunk
            .iter()
            .map(|&i| (targets[i].channel.as_str(), &targets[i].opts))
            .collect()
    }
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
        let shard = self.shard(channel);
        if opts.skip_history {
            return self
                .publish_unstored(shard, channel, &data, info.as_ref(), opts)
                .await;
        }
        let mut positions = self
            .publish_call(shard, &[(channel, opts)], &data, info.as_ref())
            .await?;
        Ok(positions.remove(0))
    }

    /// Publish to several channels: one script call per slot (Cluster) or shard (standalone) and
    /// idempotency (with a key or without), of at most [`MAX_CHANNELS_PER_CALL`] channels, the
    /// calls concurrent. On a Cluster the calls for one master go out as one pipeline
    /// (`crate::masters`), so a broadcast costs a round trip per master, not per slot. Results in
    /// `targets`' order.
    pub(crate) async fn publish_many(
        &self,
        targets: &[PublishTarget],
        data: Bytes,
        info: Option<ClientInfo>,
    ) -> Vec<Result<StreamPosition, BrokerError>> {
        if targets.iter().any(|t| t.opts.skip_history) {
            // Nothing to store: each is one pub/sub message, sent concurrently.
            let each = targets
                .iter()
                .map(|t| self.publish(&t.channel, data.clone(), info.clone(), &t.opts));
            return join_all(each).await;
        }
        // Group the targets' indices by where one call may take them (a call stores one info
        // and tags for all its channels: a broadcast's are the same for every channel).
        let mut groups: HashMap<(usize, bool, &Tags), Vec<usize>> = HashMap::new();
        for (i, t) in targets.iter().enumerate() {
            let place = if self.cluster {
                usize::from(names::slot(&self.names.pubsub(&t.channel)))
            } else {
                self.shard(&t.channel)
            };
            let keyed = t.opts.idempotency_key.is_some();
            groups
                .entry((place, keyed, &t.opts.tags))
                .or_default()
                .push(i);
        }
        let calls: Vec<Call> = groups
            .iter()
            .flat_map(|(&(place, _, _), indices)| {
                indices
                    .chunks(MAX_CHANNELS_PER_CALL)
                    .map(move |chunk| Call { place, chunk })
            })
            .collect();
        let (data, info) = (&data, info.as_ref());
        let done = if self.cluster && calls.len() > 1 {
            self.publish_by_master(targets, calls, data, info).await
        } else {
            let each = calls.into_iter().map(|call| async move {
                let entries = call.entries(targets);
                let shard = if self.cluster { 0 } else { call.place };
                let result = self.publish_call(shard, &entries, data, info).await;
                (call.chunk, result)
            });
            join_all(each).await
        };
        let mut results: Vec<Option<Result<StreamPosition, BrokerError>>> =
            targets.iter().map(|_| None).collect();
        for (chunk, result) in done {
            match result {
                Ok(positions) => {
                    for (&i, position) in chunk.iter().zip(positions) {
                        results[i] = Some(Ok(position));
                    }
                }
                Err(e) => {
                    for &i in chunk {
                        results[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every target is in one call"))
            .collect()
    }

    /// The keys and arguments of one publish script call for `entries` (all on one shard, and on
    /// one slot on a Cluster; all with an idempotency key or all without; all with the same
    /// tags). The server identity (`ARGV[6]`, at [`IDENTITY_ARG`]) is left empty: the connection
    /// that runs the call sets it.
    pub(crate) fn publish_args(
        &self,
        entries: &[Entry<'_>],
        data: &Bytes,
        info: Option<&ClientInfo>,
    ) -> ScriptArgs {
        // The script stores and sends this slot as it is (see `codec`).
        let info_json = herald_broker::meta::encode_meta(info, &entries[0].1.tags);
        let keyed = entries[0].1.idempotency_key.is_some();
        let mut keys = Vec::with_capacity(entries.len() * 3);
        let mut argv: Vec<Vec<u8>> = Vec::with_capacity(6 + entries.len() * 8);
        argv.push(self.publish_command().as_bytes().to_vec());
        argv.push(info_json);
        argv.push(data.to_vec());
        argv.push(IDEMPOTENCY_TTL_S.to_string().into_bytes());
        argv.push(if keyed { b"3".to_vec() } else { b"2".to_vec() });
        argv.push(Vec::new()); // the identity, at IDENTITY_ARG
        for (channel, opts) in entries {
            let k = self.names.channel(channel);
            keys.push(k.meta);
            keys.push(k.history);
            if let Some(key) = &opts.idempotency_key {
                keys.push(self.names.idempotency(channel, key));
            }
            let s = &opts.stream;
            let (floor_epoch, floor_offset) = self.dispatch.watermarks.floor(channel);
            argv.push(k.pubsub.into_bytes());
            argv.push(new_epoch().into_bytes());
            argv.push(s.history_size.to_string().into_bytes());
            argv.push(ms(s.history_ttl).to_string().into_bytes());
            argv.push(ms(s.meta_ttl).to_string().into_bytes());
            argv.push(floor_epoch.into_bytes());
            argv.push(floor_offset.to_string().into_bytes());
            // The message's first field: only a traced publication pays for more. A space would
            // split the message's fields: such a value is not a traceparent.
            argv.push(
                match opts.traceparent.as_deref().filter(|tp| !tp.contains(' ')) {
                    None => b"p".to_vec(),
                    Some(tp) => format!("p,{tp}").into_bytes(),
                },
            );
        }
        ScriptArgs { keys, argv }
    }

    /// The positions a publish script call answered for `entries`, noted in the watermarks and
    /// metrics; or why there are none.
    pub(crate) fn stored_positions(
        &self,
        entries: &[Entry<'_>],
        answer: Result<Vec<(String, u64, u8)>, BrokerError>,
    ) -> Result<Vec<StreamPosition>, BrokerError> {
        let stored = match answer {
            Ok(stored) if stored.len() == entries.len() => stored,
            Ok(stored) => {
                self.metrics.publish_errors.inc_by(entries.len() as u64);
                return Err(BrokerError::internal(format!(
                    "the publish script answered {} positions for {} channels",
                    stored.len(),
                    entries.len()
                )));
            }
            Err(e) => {
                self.metrics.publish_errors.inc_by(entries.len() as u64);
                return Err(e);
            }
        };
        let mut positions = Vec::with_capacity(stored.len());
        for ((channel, _), (epoch, offset, duplicate)) in entries.iter().zip(stored) {
            self.dispatch.watermarks.observe(channel, &epoch, offset);
            if duplicate == 0 {
                self.metrics.published.inc();
            }
            positions.push(StreamPosition { epoch, offset });
        }
        Ok(positions)
    }

    /// One script call publishing `data` to `entries` (all on `shard`, and on one slot on a
    /// Cluster; all with an idempotency key or all without; all with the same tags): their
    /// positions in order.
    pub(crate) async fn publish_call(
        &self,
        shard: usize,
        entries: &[Entry<'_>],
        data: &Bytes,
        info: Option<&ClientInfo>,
    ) -> Result<Vec<StreamPosition>, BrokerError> {
        let ScriptArgs { keys, mut argv } = self.publish_args(entries, data, info);
        let answer = self
            .run(shard, |mut c| async move {
                argv[IDENTITY_ARG] = self.identity(&c).as_bytes().to_vec();
                let mut inv = scripts::PUBLISH.prepare_invoke();
                for key in &keys {
                    inv.key(key);
                }
                for a in &argv {
                    inv.arg(&a[..]);
                }
                inv.invoke_async::<Vec<(String, u64, u8)>>(&mut c).await
            })
            .await;
        self.stored_positions(entries, answer)
    }

    /// A publication kept out of history: only sent on the channel's pub/sub channel, with offset
    /// 0 and no epoch (`-`), in the format the publish script writes (see `codec`).
    async fn publish_unstored(
        &self,
        shard: usize,
        channel: &str,
        data: &Bytes,
        info: Option<&ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        let meta = herald_broker::meta::encode_meta(info, &opts.tags);
        let mut payload = match opts.traceparent.as_deref().filter(|tp| !tp.contains(' ')) {
            None => b"p".to_vec(),
            Some(tp) => format!("p,{tp}").into_bytes(),
        };
        payload.extend_from_slice(format!(" - 0 {} ", meta.len()).as_bytes());
        payload.extend_from_slice(&meta);
        payload.extend_from_slice(data);
        self.publish_raw(shard, self.names.pubsub(channel), payload)
            .await?;
        Ok(herald_broker::unstored())
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
