//! The multi-node suite (`multinode/`) with three real herald nodes on one real nats-server.
//! Needs the `herald` binary: `HERALD_BIN`, or `<target>/debug/herald` (built if missing).

mod multinode;

use herald_broker_nats::subject::unescape;
use herald_testkit::nats::NatsServer;
use multinode::BrokerProcess;

struct Nats(NatsServer);

impl BrokerProcess for Nats {
    fn url(&self) -> String {
        self.0.url()
    }

    fn stop(&mut self) {
        self.0.stop();
    }

    fn start_again(&mut self) {
        self.0.start_again();
    }

    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.0.port()).into()
    }

    fn url_via(&self, addr: std::net::SocketAddr) -> String {
        format!("nats://{addr}")
    }

    /// From the server's `/connz?subs=1`: the delivery subjects (`herald.d.<channel>`) held by
    /// the connection named `herald-<node>`.
    fn subscribed_channels(&self, node: &str) -> Vec<String> {
        let body = self
            .0
            .monitor_get("/connz?subs=1&limit=1024")
            .expect("connz");
        let connz: serde_json::Value = serde_json::from_str(&body).expect("connz json");
        let name = format!("herald-{node}");
        let mut channels = Vec::new();
        for conn in connz["connections"].as_array().into_iter().flatten() {
            if conn["name"] != name.as_str() {
                continue;
            }
            for sub in conn["subscriptions_list"].as_array().into_iter().flatten() {
                let sub = sub.as_str().unwrap_or_default();
                assert!(
                    !(sub.starts_with("herald.") && (sub.contains('*') || sub.contains('>'))),
                    "{node} holds a wildcard subscription {sub}"
                );
                if let Some(token) = sub.strip_prefix("herald.d.") {
                    channels.push(unescape(token).expect("escaped channel"));
                }
            }
        }
        channels
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_delivery_exactly_once() {
    multinode::cross_node_delivery_exactly_once(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_across_nodes() {
    multinode::recovery_across_nodes(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restart_mid_stream_loses_nothing() {
    multinode::broker_restart_mid_stream_loses_nothing(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_across_nodes() {
    multinode::presence_across_nodes(&mut Nats(NatsServer::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_node_blip_loses_nothing() {
    multinode::subscriber_node_blip_loses_nothing(&mut Nats(NatsServer::start())).await;
}
