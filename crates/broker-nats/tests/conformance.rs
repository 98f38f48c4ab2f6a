//! The shared broker conformance suite against a real nats-server with JetStream.

use herald_broker::SharedBroker;
use herald_testkit::nats::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    let nats = NatsServer::start();
    let url = nats.url();
    herald_broker::conformance::run(|| {
        let url = url.clone();
        async move {
            herald_broker_nats::connect(&url, "conformance")
                .await
                .expect("connect to nats") as SharedBroker
        }
    })
    .await;
}

/// The same suite with replica-served direct gets and an in-memory history stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct_reads_memory_storage() {
    let nats = NatsServer::start();
    let config = herald_broker_nats::NatsConfig {
        direct_reads: true,
        storage: herald_broker_nats::Storage::Memory,
        stream: "HERALD_MEM".into(),
        subject_prefix: "hmem".into(),
        ..herald_broker_nats::NatsConfig::with_url(&nats.url())
    };
    herald_broker::conformance::run(|| {
        let config = config.clone();
        async move {
            herald_broker_nats::connect_with(config, "conformance")
                .await
                .expect("connect to nats") as SharedBroker
        }
    })
    .await;
}

/// Several nodes on one nats-server (a distinct node name each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_node_conforms() {
    let nats = NatsServer::start();
    let url = nats.url();
    let n = std::sync::atomic::AtomicUsize::new(0);
    herald_broker::conformance::run_multi_node(|| {
        let url = url.clone();
        let name = format!(
            "node-{}",
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        async move {
            herald_broker_nats::connect(&url, &name)
                .await
                .expect("connect to nats") as SharedBroker
        }
    })
    .await;
}
