//! The broker conformance suite that the real brokers pass, against the simulated broker (no
//! faults): the model answers as Redis and NATS do when nothing fails.

use std::sync::Arc;

use herald_broker::SharedBroker;
use herald_sim::broker::{Faults, NodeBroker, NodeOptions, Server};

fn server() -> Arc<Server> {
    let server = Server::new(1, Faults::none());
    tokio::spawn(server.clone().run());
    server
}

#[tokio::test]
async fn simulated_broker_conforms() {
    herald_broker::conformance::run(|| async {
        NodeBroker::new("n0", server(), NodeOptions::default()) as SharedBroker
    })
    .await;
}

#[tokio::test]
async fn simulated_broker_conforms_across_nodes() {
    let shared = server();
    let next = std::sync::atomic::AtomicUsize::new(0);
    herald_broker::conformance::run_multi_node(|| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shared = shared.clone();
        async move {
            NodeBroker::new(&format!("n{n}"), shared, NodeOptions::default()) as SharedBroker
        }
    })
    .await;
}
