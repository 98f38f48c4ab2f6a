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
