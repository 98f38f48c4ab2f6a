//! The broker conformance suite against the in-memory broker.

use std::sync::Arc;

use herald_broker::{MemoryBroker, SharedBroker};

#[tokio::test]
async fn memory_broker_conforms() {
    herald_broker::conformance::run(|| async { Arc::new(MemoryBroker::new()) as SharedBroker })
        .await;
}
