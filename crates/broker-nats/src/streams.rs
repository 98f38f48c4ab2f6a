//! The three JetStream streams Herald keeps, created at connect and again after a reconnect, and
//! grown (never shrunk) when a namespace needs more history than they hold.
//!
//! | stream | subjects | storage | per channel | republished to |
//! | --- | --- | --- | --- | --- |
//! | `HERALD` | `herald.h.>` | file (config) | `max_msgs_per_channel` | `herald.d.>` |
//! | `HERALD_LIVE` | `herald.l.>` | file (config) | 1 (the offset counter) | `herald.d.>` |
//! | `HERALD_PRESENCE` | `herald.p.>` | memory | 1 per client, expires | — |
//! | `HERALD_BOOT` | `herald.boot` | memory | 1 (the boot id) | — |
//!
//! `HERALD_BOOT` exists unless `synchronous_persistence` is set (see the `boot` module).
//!
//! Delivery goes through RePublish (nats-server ≥ 2.9): the server forwards a message to the
//! delivery subject only after storing it, in stream order, so a node never receives a
//! publication that was refused (wrong expected sequence) or is not in history.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::stream::{self, Config, DiscardPolicy, Republish, StorageType};
use async_nats::jetstream::{self, context::GetStreamErrorKind, ErrorCode};
use herald_broker::{BrokerError, StreamOptions};
use tokio::sync::Mutex as AsyncMutex;
use tracing::{info, warn};

use crate::config::{NatsConfig, Storage};
use crate::names::Subjects;

/// Which stream a channel's publications go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// Namespace with history.
    History,
    /// Namespace without history: only the newest publication is kept (for its offset).
    Live,
}

/// Names, handles and current limits of the streams.
pub(crate) struct Streams {
    js: jetstream::Context,
    subjects: Subjects,
    storage: Storage,
    replicas: usize,
    max_bytes: i64,
    duplicate_window: Duration,
    presence_ttl: Duration,
    pub(crate) history_name: String,
    pub(crate) live_name: String,
    pub(crate) presence_name: String,
    pub(crate) boot_name: String,
    /// Create the boot stream (not with `synchronous_persistence`).
    with_boot: bool,
    /// Handles for reads (no info request behind them).
    pub(crate) history: stream::Stream<()>,
    pub(crate) live: stream::Stream<()>,
    pub(crate) presence: stream::Stream<()>,
    pub(crate) boot: stream::Stream<()>,
    /// Current `max_msgs_per_subject` of the history stream.
    per_channel: AtomicI64,
    /// Current `max_age` of the history and live streams, in seconds.
    max_age_s: AtomicU64,
    /// Serializes stream updates (rare: at connect, reconnect and growth).
    update_lock: AsyncMutex<()>,
}

fn unavailable(what: &str, err: impl std::error::Error + Send + Sync + 'static) -> BrokerError {
    BrokerError::unavailable(format!("{what}: {err}")).caused_by(err)
}

impl Streams {
    pub(crate) fn new(js: jetstream::Context, config: &NatsConfig) -> Result<Self, BrokerError> {
        let history_name = config.stream.clone();
        let live_name = format!("{}_LIVE", config.stream);
        let presence_name = format!("{}_PRESENCE", config.stream);
        let boot_name = format!("{}_BOOT", config.stream);
        let handle = |name: &str| {
            // A name check only; no request is made.
            futures_util::FutureExt::now_or_never(js.get_stream_no_info(name))
                .expect("get_stream_no_info does not wait")
                .map_err(|e| {
                    BrokerError::internal(format!("stream name {name:?}: {e}")).caused_by(e)
                })
        };
        Ok(Streams {
            history: handle(&history_name)?,
            live: handle(&live_name)?,
            presence: handle(&presence_name)?,
            boot: handle(&boot_name)?,
            js: js.clone(),
            subjects: Subjects::new(&config.subject_prefix),
            storage: config.storage,
            replicas: config.replicas.max(1),
            max_bytes: config.max_bytes,
            duplicate_window: Duration::from_secs(config.duplicate_window_s.max(1)),
            presence_ttl: config.presence_ttl(),
            history_name,
            live_name,
            presence_name,
            boot_name,
            with_boot: !config.synchronous_persistence,
            per_channel: AtomicI64::new(config.max_msgs_per_channel.max(1)),
            max_age_s: AtomicU64::new(config.max_age_s.max(1)),
            update_lock: AsyncMutex::new(()),
        })
    }

    /// Stream handle and name of a kind.
    pub(crate) fn of(&self, kind: Kind) -> &stream::Stream<()> {
        match kind {
            Kind::History => &self.history,
            Kind::Live => &self.live,
        }
    }

    fn desired(&self) -> [Config; 3] {
        let filters = self.subjects.stream_filters();
        let max_age = Duration::from_secs(self.max_age_s.load(Ordering::Relaxed));
        let duplicate_window = self.duplicate_window.min(max_age);
        let replicas = self.replicas;
        let storage = match self.storage {
            Storage::File => StorageType::File,
            Storage::Memory => StorageType::Memory,
        };
        let history = Config {
            name: self.history_name.clone(),
            description: Some("Herald channel history (one subject per channel)".into()),
            subjects: vec![filters.history.clone()],
            max_messages_per_subject: self.per_channel.load(Ordering::Relaxed),
            max_age,
            max_bytes: self.max_bytes,
            max_messages: -1,
            discard: DiscardPolicy::Old,
            storage,
            num_replicas: replicas,
            duplicate_window,
            allow_direct: true,
            republish: Some(Republish {
                source: filters.history.clone(),
                destination: filters.delivery.clone(),
                headers_only: false,
            }),
            ..Config::default()
        };
        let live = Config {
            name: self.live_name.clone(),
            description: Some("Herald channels without history: newest publication only".into()),
            subjects: vec![filters.live.clone()],
            max_messages_per_subject: 1,
            max_age,
            max_bytes: -1,
            max_messages: -1,
            discard: DiscardPolicy::Old,
            // Same storage as history: with files, a NATS restart keeps these channels' epochs
            // and offsets, so their subscribers are not told to recover for nothing.
            storage,
            num_replicas: replicas,
            duplicate_window,
            allow_direct: true,
            republish: Some(Republish {
                source: filters.live.clone(),
                destination: filters.delivery.clone(),
                headers_only: false,
            }),
            ..Config::default()
        };
        let presence = Config {
            name: self.presence_name.clone(),
            description: Some("Herald presence: one record per channel and client".into()),
            subjects: vec![filters.presence.clone()],
            max_messages_per_subject: 1,
            max_age: self.presence_ttl,
            max_bytes: -1,
            max_messages: -1,
            discard: DiscardPolicy::Old,
            storage: StorageType::Memory,
            num_replicas: replicas,
            duplicate_window: self.presence_ttl.min(Duration::from_secs(1)),
            allow_direct: true,
            ..Config::default()
        };
        [history, live, presence]
    }

    /// The boot stream: in memory on purpose, so that a restart of the server(s) holding it
    /// empties it (see the `boot` module); as many replicas as the other streams, so that on a
    /// cluster it survives what they survive.
    fn boot_config(&self) -> Config {
        Config {
            name: self.boot_name.clone(),
            description: Some("Herald boot id: emptied by every restart of its servers".into()),
            subjects: vec![self.subjects.boot()],
            max_messages_per_subject: 1,
            max_messages: -1,
            max_bytes: -1,
            discard: DiscardPolicy::Old,
            storage: StorageType::Memory,
            num_replicas: self.replicas,
            allow_direct: true,
            ..Config::default()
        }
    }

    /// When the history and live streams were created, as the server reports them now; `None`
    /// for a stream that cannot be read right now.
    pub(crate) async fn created(&self) -> [Option<i128>; 2] {
        let mut out = [None, None];
        for (slot, name) in out.iter_mut().zip([&self.history_name, &self.live_name]) {
            if let Ok(mut stream) = self.js.get_stream(name.as_str()).await {
                if let Ok(info) = stream.info().await {
                    *slot = Some(info.created.unix_timestamp_nanos());
                }
            }
        }
        out
    }

    /// Current per-channel limit of the history stream.
    pub(crate) fn per_channel(&self) -> i64 {
        self.per_channel.load(Ordering::Relaxed)
    }

    /// Create the streams that are missing and update those whose limits are smaller than
    /// wanted. Called at connect and after every reconnect (the server may have lost them).
    pub(crate) async fn ensure(&self) -> Result<(), BrokerError> {
        let _guard = self.update_lock.lock().await;
        let [history, live, presence] = self.desired();
        self.ensure_one(history, false).await?;
        self.ensure_one(live, false).await?;
        if self.with_boot {
            self.ensure_one(self.boot_config(), false).await?;
        }
        // Presence expiry is the configured TTL exactly, shorter or longer.
        self.ensure_one(presence, true).await
    }

    async fn ensure_one(&self, desired: Config, exact_age: bool) -> Result<(), BrokerError> {
        let name = desired.name.clone();
        match self.js.get_stream(&name).await {
            Ok(mut stream) => {
                let existing = stream
                    .info()
                    .await
                    .map_err(|e| unavailable("stream info", e))?
                    .config
                    .clone();
                if let Some(update) = merge(&existing, &desired, exact_age) {
                    info!(stream = %name, "updating stream limits");
                    self.js
                        .update_stream(update)
                        .await
                        .map_err(|e| unavailable(&format!("update stream {name}"), e))?;
                }
                if existing.storage != desired.storage {
                    warn!(stream = %name, existing = ?existing.storage, wanted = ?desired.storage,
                        "stream storage differs from the configuration; keeping the existing one");
                }
                Ok(())
            }
            Err(err) => match err.kind() {
                GetStreamErrorKind::JetStream(e)
                    if e.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    info!(stream = %name, "creating stream");
                    self.js
                        .create_stream(desired)
                        .await
                        .map(|_| ())
                        .map_err(|e| unavailable(&format!("create stream {name}"), e))
                }
                GetStreamErrorKind::JetStream(e)
                    if e.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED =>
                {
                    Err(BrokerError::unavailable(
                        "JetStream is not enabled on the NATS server (start it with -js)",
                    ))
                }
                _ => Err(unavailable(&format!("stream {name}"), err)),
            },
        }
    }

    /// Make the history stream keep at least `opts.history_size` publications per channel and
    /// the streams keep a channel's newest publication at least `opts.meta_ttl`. Cheap when
    /// nothing needs to grow (two atomic loads).
    pub(crate) async fn fit(&self, kind: Kind, opts: &StreamOptions) -> Result<(), BrokerError> {
        let want_per_channel = if kind == Kind::History {
            i64::try_from(opts.history_size).unwrap_or(i64::MAX)
        } else {
            0
        };
        let want_age = opts.meta_ttl.as_secs().max(opts.history_ttl.as_secs());
        if want_per_channel <= self.per_channel.load(Ordering::Relaxed)
            && want_age <= self.max_age_s.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        self.per_channel
            .fetch_max(want_per_channel, Ordering::Relaxed);
        self.max_age_s.fetch_max(want_age, Ordering::Relaxed);
        info!(
            per_channel = self.per_channel.load(Ordering::Relaxed),
            max_age_s = self.max_age_s.load(Ordering::Relaxed),
            "growing streams for a namespace"
        );
        self.ensure().await
    }
}

/// The existing configuration with our subjects and republish, and limits raised to what we
/// want; `None` when nothing changes. Limits are never lowered: another node (or an operator)
/// may need them.
fn merge(existing: &Config, desired: &Config, exact_age: bool) -> Option<Config> {
    let mut update = existing.clone();
    update.subjects = desired.subjects.clone();
    update.republish = desired.republish.clone();
    update.allow_direct = true;
    update.discard = DiscardPolicy::Old;
    if desired.max_messages_per_subject == 1 {
        update.max_messages_per_subject = 1;
    } else {
        update.max_messages_per_subject = existing
            .max_messages_per_subject
            .max(desired.max_messages_per_subject);
    }
    if exact_age {
        update.max_age = desired.max_age;
        update.duplicate_window = desired.duplicate_window;
    } else {
        update.max_age = existing.max_age.max(desired.max_age);
    }
    let same = update.subjects == existing.subjects
        && update.republish == existing.republish
        && update.allow_direct == existing.allow_direct
        && update.discard == existing.discard
        && update.max_messages_per_subject == existing.max_messages_per_subject
        && update.max_age == existing.max_age
        && update.duplicate_window == existing.duplicate_window;
    (!same).then_some(update)
}
