//! `Broker::positions`' default (NATS, memory, the simulation's broker): reads go
//! `POSITIONS_AT_ONCE` at a time, so that a connection carries them together, and every answer
//! lands in its channel's place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, BrokerHandler, ControlMessage, HistoryQuery, HistoryResult, MemoryBroker,
    PublishOptions, StreamOptions, POSITIONS_AT_ONCE,
};
use herald_protocol::{ClientInfo, StreamPosition};

/// The in-memory broker with history reads that take a moment, counting how many run at once.
struct SlowReads {
    inner: MemoryBroker,
    now: AtomicUsize,
    most: AtomicUsize,
}

#[async_trait]
impl Broker for SlowReads {
    async fn start(&self, handler: Arc<dyn BrokerHandler>) -> Result<(), BrokerError> {
        self.inner.start(handler).await
    }
    async fn publish(
        &self,
        channel: &str,
        data: Bytes,
        info: Option<ClientInfo>,
        opts: &PublishOptions,
    ) -> Result<StreamPosition, BrokerError> {
        self.inner.publish(channel, data, info, opts).await
    }
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.inner.subscribe(channel).await
    }
    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.inner.unsubscribe(channel).await
    }
    async fn history(
        &self,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
    ) -> Result<HistoryResult, BrokerError> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let read = self.inner.history(channel, query, opts).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        read
    }
    async fn add_presence(&self, channel: &str, who: &ClientInfo) -> Result<(), BrokerError> {
        self.inner.add_presence(channel, who).await
    }
    async fn remove_presence(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        self.inner.remove_presence(channel, client).await
    }
    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.inner.presence(channel).await
    }
    async fn publish_presence_change(
        &self,
        channel: &str,
        joined: bool,
        who: &ClientInfo,
    ) -> Result<(), BrokerError> {
        self.inner
            .publish_presence_change(channel, joined, who)
            .await
    }
    async fn publish_control(&self, message: &ControlMessage) -> Result<(), BrokerError> {
        self.inner.publish_control(message).await
    }
}

#[tokio::test]
async fn the_default_reads_positions_several_at_once_each_in_its_place() {
    let broker = SlowReads {
        inner: MemoryBroker::new(),
        now: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    };
    let opts = PublishOptions::default();
    let channels: Vec<(Arc<str>, StreamOptions)> = (0..100)
        .map(|i| (Arc::from(format!("pos{i}").as_str()), opts.stream.clone()))
        .collect();
    // Channel i has i publications (0: a stream the read creates).
    for (i, (channel, _)) in channels.iter().enumerate() {
        for _ in 0..i {
            broker
                .publish(channel, Bytes::from_static(b"1"), None, &opts)
                .await
                .unwrap();
        }
    }
    let got = tokio::time::timeout(Duration::from_secs(10), broker.positions(&channels))
        .await
        .expect("100 reads of 1 ms did not finish within 10 s");
    assert_eq!(got.len(), channels.len());
    for (i, ((channel, _), got)) in channels.iter().zip(got).enumerate() {
        assert_eq!(got.unwrap().offset, i as u64, "{channel}");
    }
    assert_eq!(
        broker.most.load(Ordering::SeqCst),
        POSITIONS_AT_ONCE,
        "reads under way at once"
    );
}
