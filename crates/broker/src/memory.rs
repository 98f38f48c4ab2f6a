//! The in-memory broker: streams, history and presence for a single node.
//!
//! Publishing appends to the channel's stream and hands the publication to the hub under the
//! stream's lock, so that publications of one channel reach the hub in offset order without a
//! queue in between.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::ops::Bound;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ClientInfo, Publication, StreamPosition};

use crate::{
    new_epoch, Broker, BrokerError, BrokerHandler, ControlMessage, HistoryChannels, HistoryQuery,
    HistoryResult, PresencePage, PresenceStats, PublishOptions, StreamOptions,
};

/// Stream map shards: publishes to different channels rarely contend on one lock.
const SHARDS: usize = 64;
/// How long an idempotency key is remembered.
const IDEMPOTENCY_TTL: Duration = Duration::from_secs(300);

/// One channel's stream.
struct Stream {
    epoch: String,
    top: u64,
    /// (publication, when it was appended), oldest first; bounded by size and TTL.
    entries: VecDeque<(Publication, Instant)>,
    /// When the stream is forgotten: `meta_ttl` after its last publication, or, while nothing was
    /// ever published to it, `empty_ttl` after its last read.
    expires: Instant,
    /// Idempotency keys seen recently: key → (offset, when).
    recent_keys: HashMap<String, (u64, Instant)>,
}

impl Stream {
    fn new(expires: Instant) -> Self {
        Stream {
            epoch: new_epoch(),
            top: 0,
            entries: VecDeque::new(),
            expires,
            recent_keys: HashMap::new(),
        }
    }

    fn position(&self) -> StreamPosition {
        StreamPosition {
            epoch: self.epoch.clone(),
            offset: self.top,
        }
    }

    /// Drop entries beyond the size bound or older than the TTL.
    fn trim(&mut self, opts: &StreamOptions, now: Instant) {
        while self.entries.len() > opts.history_size {
            self.entries.pop_front();
        }
        while let Some((_, at)) = self.entries.front() {
            if now.duration_since(*at) < opts.history_ttl {
                break;
            }
            self.entries.pop_front();
        }
        self.recent_keys
            .retain(|_, (_, at)| now.duration_since(*at) < IDEMPOTENCY_TTL);
    }
}

/// One channel's presence: clients ordered by id (for pages) and clients per user (for counts).
#[derive(Default)]
struct ChannelPresence {
    clients: BTreeMap<String, ClientInfo>,
    users: HashMap<String, usize>,
}

impl ChannelPresence {
    fn add(&mut self, who: &ClientInfo) {
        if let Some(old) = self.clients.insert(who.client.clone(), who.clone()) {
            self.forget_user(&old.user);
        }
        *self.users.entry(who.user.clone()).or_default() += 1;
    }

    fn remove(&mut self, client: &str) {
        if let Some(old) = self.clients.remove(client) {
            self.forget_user(&old.user);
        }
    }

    fn forget_user(&mut self, user: &str) {
        if let Some(n) = self.users.get_mut(user) {
            *n -= 1;
            if *n == 0 {
                self.users.remove(user);
            }
        }
    }
}

/// The single-node broker. Cheap to share: clone the `Arc` it lives in.
#[derive(Default)]
pub struct MemoryBroker {
    streams: Box<[Mutex<HashMap<String, Stream>>]>,
    presence: Mutex<HashMap<String, ChannelPresence>>,
    handler: OnceLock<Arc<dyn BrokerHandler>>,
}

impl MemoryBroker {
    /// An empty broker.
    pub fn new() -> Self {
        MemoryBroker {
            streams: (0..SHARDS).map(|_| Mutex::default()).collect(),
            presence: Mutex::default(),
            handler: OnceLock::new(),
        }
    }

    fn shard(&self, channel: &str) -> &Mutex<HashMap<String, Stream>> {
        let mut h = DefaultHasher::new();
        channel.hash(&mut h);
        &self.streams[(h.finish() as usize) % self.streams.len()]
    }

    /// Forget expired streams. Called by [`Self::spawn_sweeper`].
    pub fn sweep(&self) {
        let now = Instant::now();
        for shard in self.streams.iter() {
            let mut streams = shard.lock().expect("stream lock");
            streams.retain(|_, s| s.expires > now);
        }
    }

    /// Sweep expired streams every `every`, so that channels published once (or only read) do
    /// not stay forever.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(broker) => broker.sweep(),
                    None => return,
                }
            }
        });
    }
}

/// Current stream of a channel, created (new epoch) when absent or expired. A read of a stream
/// nothing was published to yet keeps it `empty_ttl` longer.
fn live_stream<'a>(
    streams: &'a mut HashMap<String, Stream>,
    channel: &str,
    opts: &StreamOptions,
    now: Instant,
) -> &'a mut Stream {
    // One lookup and no key allocation for a live stream (the common case: a broadcast to
    // 100,000 channels goes through here 100,000 times).
    let live = streams.get(channel).is_some_and(|s| s.expires > now);
    if !live {
        streams.insert(channel.to_owned(), Stream::new(now + opts.empty_ttl));
    }
    streams.get_mut(channel).expect("inserted above if absent")
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        self.handler
            .set(handler)
            .map_err(|_| BrokerError::internal("broker started twice"))
    }

    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        if opts.skip_history {
            // Under the stream lock, as stored publications are: delivered in publish order.
            let _streams = self.shard(channel).lock().expect("stream lock");
            if let Some(handler) = self.handler.get() {
                let publication = Publication {
                    offset: 0,
                    data,
                    info,
                    tags: opts.tags.clone(),
                };
                handler.on_publication(channel, "", publication);
            }
            return Ok(crate::unstored());
        }
        let now = Instant::now();
        let mut streams = self.shard(channel).lock().expect("stream lock");
        let stream = live_stream(&mut streams, channel, &opts.stream, now);
        if let Some(key) = &opts.idempotency_key {
            if let Some((offset, _)) = stream.recent_keys.get(key) {
                return Ok(StreamPosition {
                    epoch: stream.epoch.clone(),
                    offset: *offset,
                });
            }
        }
        stream.top += 1;
        stream.expires = now + opts.stream.meta_ttl;
        let publication = Publication {
            offset: stream.top,
            data,
            info,
            tags: opts.tags.clone(),
        };
        if let Some(key) = &opts.idempotency_key {
            stream.recent_keys.insert(key.clone(), (stream.top, now));
        }
        if opts.stream.history_size > 0 {
            stream.entries.push_back((publication.clone(), now));
        }
        stream.trim(&opts.stream, now);
        // Delivered under the stream lock: the hub sees this channel's offsets in order.
        if let Some(handler) = self.handler.get() {
            match &opts.traceparent {
                None => handler.on_publication(channel, &stream.epoch, publication),
                Some(tp) => handler.on_traced_publication(channel, &stream.epoch, publication, tp),
            }
        }
        Ok(stream.position())
    }

    async fn subscribe(&self, _channel: &str) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn unsubscribe(&self, _channel: &str) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        let now = Instant::now();
        let mut streams = self.shard(channel).lock().expect("stream lock");
        let stream = live_stream(&mut streams, channel, opts, now);
        if stream.top == 0 {
            stream.expires = now + opts.empty_ttl;
        }
        stream.trim(opts, now);
        Ok(with_times(
            read_history(stream, query),
            &stream.entries,
            now,
        ))
    }

    async fn remove_history(&self, channel: &str) -> Result<bool, BrokerError> {
        let mut streams = self.shard(channel).lock().expect("stream lock");
        if let Some(stream) = streams.get_mut(channel) {
            stream.entries.clear();
        }
        Ok(true)
    }

    /// Names in order; each call visits every stream (one shard lock at a time), which for a
    /// single node's memory is cheap enough: a million streams take some tens of milliseconds.
    async fn history_channels(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryChannels>, BrokerError> {
        let now = Instant::now();
        let mut names: Vec<String> = Vec::new();
        for shard in self.streams.iter() {
            let streams = shard.lock().expect("stream lock");
            names.extend(names_with_history(&streams, cursor, now).cloned());
            // Keep only the first `limit + 1` so far: memory stays bounded by the page.
            if names.len() > 2 * (limit + 1) {
                names.sort_unstable();
                names.truncate(limit + 1);
            }
        }
        names.sort_unstable();
        let more = names.len() > limit;
        names.truncate(limit);
        let cursor = if more { names.last().cloned() } else { None };
        Ok(Some(HistoryChannels {
            channels: names,
            cursor,
        }))
    }

    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        let mut presence = self.presence.lock().expect("presence lock");
        presence.entry(channel.to_owned()).or_default().add(who);
        Ok(())
    }

    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let mut presence = self.presence.lock().expect("presence lock");
        if let Some(clients) = presence.get_mut(channel) {
            clients.remove(client);
            if clients.clients.is_empty() {
                presence.remove(channel);
            }
        }
        Ok(())
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        let presence = self.presence.lock().expect("presence lock");
        Ok(presence
            .get(channel)
            .map(|c| c.clients.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn presence_stats(&self, channel: &str) -> Result<PresenceStats, BrokerError> {
        let presence = self.presence.lock().expect("presence lock");
        Ok(presence
            .get(channel)
            .map(|c| PresenceStats {
                num_clients: c.clients.len() as u64,
                num_users: c.users.len() as u64,
            })
            .unwrap_or_default())
    }

    async fn presence_page(
        &self,
        channel: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        let presence = self.presence.lock().expect("presence lock");
        let Some(c) = presence.get(channel) else {
            return Ok(PresencePage::default());
        };
        let from = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut rest = c
            .clients
            .range::<str, _>((from, Bound::Unbounded))
            .map(|(_, who)| who);
        let clients: Vec<ClientInfo> = rest.by_ref().take(limit).cloned().collect();
        let more = rest.next().is_some();
        Ok(PresencePage { clients, more })
    }

    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        if let Some(handler) = self.handler.get() {
            handler.on_presence_change(channel, joined, who.clone());
        }
        Ok(())
    }

    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        if let Some(handler) = self.handler.get() {
            handler.on_control(message.clone());
        }
        Ok(())
    }
}

/// Answer a history query from a trimmed stream.
fn read_history(stream: &Stream, query: &HistoryQuery) -> HistoryResult {
    answer_history(&stream.epoch, stream.top, &stream.entries, query)
}

/// Answer a history query from a stream's epoch, its top offset and its kept entries (oldest
/// first, each with whatever the store keeps beside it). The recovery guarantee's one rule, shared
/// by the in-memory broker and the simulator's broker model: with `since`, the answer is
/// `continuous` only if the epoch matches and nothing after `since.offset` has been trimmed away,
/// and a discontinuous answer carries no publications.
pub fn answer_history<T>(
    epoch: &str,
    top: u64,
    entries: &VecDeque<(Publication, T)>,
    query: &HistoryQuery,
) -> HistoryResult {
    let position = StreamPosition {
        epoch: epoch.to_owned(),
        offset: top,
    };
    let limit = query.limit.unwrap_or(usize::MAX);
    let (publications, continuous) = match &query.since {
        Some(since) => {
            if since.epoch != epoch || since.offset > top {
                (Vec::new(), false)
            } else {
                let first_kept = entries.front().map_or(top + 1, |(p, _)| p.offset);
                let continuous = since.offset + 1 >= first_kept;
                let pubs = entries
                    .iter()
                    .filter(|(p, _)| p.offset > since.offset)
                    .take(limit)
                    .map(|(p, _)| p.clone())
                    .collect();
                (if continuous { pubs } else { Vec::new() }, continuous)
            }
        }
        None => {
            let skip = entries.len().saturating_sub(limit);
            let pubs = entries.iter().skip(skip).map(|(p, _)| p.clone()).collect();
            (pubs, true)
        }
    };
    HistoryResult {
        position,
        publications,
        continuous,
        stored_at_ms: Vec::new(),
    }
}

/// `h` with each publication's storage time, from the stream's entries (appended at `Instant`s;
/// turned into wall-clock time against `now` and the system clock).
fn with_times(
    mut h: HistoryResult,
    entries: &VecDeque<(Publication, Instant)>,
    now: Instant,
) -> HistoryResult {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    h.stored_at_ms = h
        .publications
        .iter()
        .map(|p| {
            entries
                .binary_search_by_key(&p.offset, |(e, _)| e.offset)
                .ok()
                .map_or(0, |i| {
                    now_ms.saturating_sub(now.duration_since(entries[i].1).as_millis() as u64)
                })
        })
        .collect();
    h
}

/// The names of `streams` that hold publications, greater than `after`, sorted.
fn names_with_history<'a>(
    streams: &'a HashMap<String, Stream>,
    after: Option<&'a str>,
    now: Instant,
) -> impl Iterator<Item = &'a String> + 'a {
    streams
        .iter()
        .filter(move |(name, s)| {
            s.expires > now && !s.entries.is_empty() && after.is_none_or(|a| name.as_str() > a)
        })
        .map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(size: usize) -> StreamOptions {
        StreamOptions {
            history_size: size,
            ..StreamOptions::default()
        }
    }

    fn stream_with(offsets: impl IntoIterator<Item = u64>, top: u64) -> Stream {
        let now = Instant::now();
        let mut s = Stream::new(now + Duration::from_secs(60));
        s.top = top;
        for o in offsets {
            let p = Publication {
                offset: o,
                data: Bytes::from_static(b"1"),
                info: None,
                tags: Default::default(),
            };
            s.entries.push_back((p, now));
        }
        s
    }

    fn since(s: &Stream, offset: u64) -> HistoryQuery {
        HistoryQuery {
            since: Some(StreamPosition {
                epoch: s.epoch.clone(),
                offset,
            }),
            limit: None,
        }
    }

    #[test]
    fn recovers_when_everything_after_since_is_kept() {
        let s = stream_with(5..=10, 10);
        let r = read_history(&s, &since(&s, 4));
        assert!(r.continuous);
        assert_eq!(r.publications.first().unwrap().offset, 5);
        assert_eq!(r.publications.len(), 6);
    }

    #[test]
    fn refuses_when_a_publication_was_trimmed() {
        let s = stream_with(5..=10, 10);
        let r = read_history(&s, &since(&s, 3));
        assert!(!r.continuous);
        assert!(r.publications.is_empty(), "never partial");
    }

    #[test]
    fn up_to_date_since_is_continuous_and_empty() {
        let s = stream_with(5..=10, 10);
        let r = read_history(&s, &since(&s, 10));
        assert!(r.continuous && r.publications.is_empty());
        // Even with nothing kept at all.
        let empty = stream_with([], 10);
        assert!(read_history(&empty, &since(&empty, 10)).continuous);
        assert!(!read_history(&empty, &since(&empty, 9)).continuous);
    }

    #[test]
    fn other_epoch_or_future_offset_is_not_continuous() {
        let s = stream_with(1..=3, 3);
        let mut q = since(&s, 1);
        q.since.as_mut().unwrap().epoch = "other".into();
        assert!(!read_history(&s, &q).continuous);
        assert!(!read_history(&s, &since(&s, 4)).continuous);
    }

    #[test]
    fn limit_without_since_returns_newest() {
        let s = stream_with(1..=10, 10);
        let r = read_history(
            &s,
            &HistoryQuery {
                since: None,
                limit: Some(3),
            },
        );
        let offsets: Vec<u64> = r.publications.iter().map(|p| p.offset).collect();
        assert_eq!(offsets, vec![8, 9, 10]);
    }

    #[test]
    fn trim_bounds_size_and_ttl() {
        let mut s = stream_with(1..=10, 10);
        s.trim(&opts(4), Instant::now());
        assert_eq!(s.entries.len(), 4);
        let ttl = StreamOptions {
            history_ttl: Duration::ZERO,
            ..opts(100)
        };
        s.trim(&ttl, Instant::now());
        assert!(s.entries.is_empty());
        assert_eq!(s.top, 10, "trimming keeps the stream position");
    }

    #[tokio::test]
    async fn a_stream_only_read_lives_empty_ttl_after_its_last_read_a_published_one_meta_ttl() {
        let broker = MemoryBroker::new();
        let opts = StreamOptions {
            empty_ttl: Duration::from_millis(80),
            ..StreamOptions::default()
        };
        let top = HistoryQuery {
            since: None,
            limit: Some(0),
        };
        let epoch = |h: HistoryResult| h.position.epoch;
        let first = epoch(broker.history("quiet", &top, &opts).await.unwrap());
        broker.history("busy", &top, &opts).await.unwrap();
        let publish = PublishOptions {
            stream: opts.clone(),
            idempotency_key: None,
            traceparent: None,
            tags: Default::default(),
            skip_history: false,
        };
        broker
            .publish("busy", Bytes::from_static(b"1"), None, &publish)
            .await
            .unwrap();
        // Each read of the empty stream keeps its epoch another `empty_ttl`.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let again = epoch(broker.history("quiet", &top, &opts).await.unwrap());
            assert_eq!(again, first, "read within empty_ttl of the last read");
        }
        tokio::time::sleep(Duration::from_millis(120)).await;
        broker.sweep();
        let kept: Vec<String> = broker
            .streams
            .iter()
            .flat_map(|s| s.lock().unwrap().keys().cloned().collect::<Vec<_>>())
            .collect();
        assert_eq!(
            kept,
            vec!["busy".to_string()],
            "the read-only stream is gone"
        );
        let fresh = broker.history("quiet", &top, &opts).await.unwrap();
        assert_ne!(fresh.position.epoch, first, "a new epoch after it expired");
        assert_eq!(fresh.position.offset, 0);
    }
}
