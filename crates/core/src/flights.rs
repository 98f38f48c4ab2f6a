//! Coalesced history reads: subscribers that ask the broker the same history question about a
//! channel at the same time share one read.
//!
//! A reconnect storm brings thousands of clients of one channel back at once, each with the same
//! `since`; without this each one is a broker round trip (Redis `XRANGE`, a JetStream read), and
//! the broker's queue, not the node, sets how fast they are back. Sharing is only safe when the
//! joiner could not have missed anything the first reader's answer predates: a reader may join a
//! read in flight only if the channel delivered nothing between the first reader's registration
//! and its own (both registered as pending before reading, so each holds what arrives later).
//! The hub passes the channel's delivery generation, read under the shard lock at registration,
//! and reads only join a flight of the same generation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use herald_broker::{Broker, BrokerError, HistoryQuery, HistoryResult, StreamOptions};

type Read = Shared<BoxFuture<'static, Result<HistoryResult, BrokerError>>>;

/// The question: channel, `since` (epoch, offset) and limit.
type Question = (Arc<str>, Option<(String, u64)>, Option<usize>);

struct Flight {
    generation: u64,
    read: Read,
}

/// History reads in flight, by question.
#[derive(Default)]
pub(crate) struct Flights {
    open: Mutex<HashMap<Question, Flight>>,
}

impl Flights {
    /// Read `channel`'s history, sharing a read in flight for the same question and generation.
    /// Returns the answer and whether it was shared.
    pub(crate) async fn history(
        &self,
        broker: &Arc<dyn Broker>,
        channel: &str,
        query: &HistoryQuery,
        opts: &StreamOptions,
        generation: u64,
    ) -> (Result<HistoryResult, BrokerError>, bool) {
        let question: Question = (
            Arc::from(channel),
            query.since.as_ref().map(|s| (s.epoch.clone(), s.offset)),
            query.limit,
        );
        let (read, shared) = {
            let mut open = self.open.lock().expect("flights lock");
            match open.get(&question) {
                Some(f) if f.generation == generation => (f.read.clone(), true),
                _ => {
                    let (broker, channel, query, opts) = (
                        broker.clone(),
                        channel.to_owned(),
                        query.clone(),
                        opts.clone(),
                    );
                    let read = async move { broker.history(&channel, &query, &opts).await }
                        .boxed()
                        .shared();
                    open.insert(
                        question.clone(),
                        Flight {
                            generation,
                            read: read.clone(),
                        },
                    );
                    (read, false)
                }
            }
        };
        let answer = read.clone().await;
        // The first reader back closes the flight (unless a newer one replaced it): later
        // subscribers ask afresh.
        let mut open = self.open.lock().expect("flights lock");
        if open.get(&question).is_some_and(|f| f.read.ptr_eq(&read)) {
            open.remove(&question);
        }
        (answer, shared)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use bytes::Bytes;
    use herald_broker::memory::MemoryBroker;
    use herald_broker::{BrokerHandler, ControlMessage, PublishOptions};
    use herald_protocol::{ClientInfo, StreamPosition};

    use super::*;

    /// A memory broker whose history reads take 20 ms and are counted.
    struct SlowHistory {
        inner: MemoryBroker,
        reads: AtomicUsize,
    }

    #[async_trait]
    impl Broker for SlowHistory {
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
            self.reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.inner.history(channel, query, opts).await
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

    fn since(offset: u64) -> HistoryQuery {
        HistoryQuery {
            since: Some(StreamPosition {
                epoch: "e".into(),
                offset,
            }),
            limit: None,
        }
    }

    #[tokio::test]
    async fn the_same_question_at_the_same_generation_is_read_once() {
        let slow = Arc::new(SlowHistory {
            inner: MemoryBroker::new(),
            reads: AtomicUsize::new(0),
        });
        let broker: Arc<dyn Broker> = slow.clone();
        let flights = Flights::default();
        let opts = StreamOptions::default();
        let (q, q4) = (since(3), since(4));
        let ((a, a_shared), (b, b_shared), (c, c_shared), (d, d_shared)) = tokio::join!(
            flights.history(&broker, "ch", &q, &opts, 7),
            flights.history(&broker, "ch", &q, &opts, 7),
            // Another generation (the channel delivered in between), another `since`.
            flights.history(&broker, "ch", &q, &opts, 8),
            flights.history(&broker, "ch", &q4, &opts, 7),
        );
        assert!(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
        assert_eq!(
            (a_shared, b_shared, c_shared, d_shared),
            (false, true, false, false)
        );
        assert_eq!(slow.reads.load(Ordering::SeqCst), 3);
        // Once answered, the flight is closed: the next subscriber reads afresh.
        let (_, shared) = flights.history(&broker, "ch", &q, &opts, 7).await;
        assert!(!shared);
        assert_eq!(slow.reads.load(Ordering::SeqCst), 4);
        assert!(flights.open.lock().unwrap().is_empty());
    }
}
