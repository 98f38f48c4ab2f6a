//! The multi-node suite (`herald_testkit::multinode`, shared with every broker) with real herald
//! nodes on one real nats-server. Needs the `herald` binary: `HERALD_BIN`, or
//! `<target>/debug/herald` (built if missing).

use std::collections::BTreeMap;

use herald_broker_nats::subject::unescape;
use herald_testkit::multinode::{self, BrokerProcess};
use herald_testkit::nats::NatsServer;

/// NatsServer as the suite's broker; the subject escaping is the broker crate's, hence here.
struct Nats(NatsServer);

impl Nats {
    /// Per herald connection (named `herald-<node>`): the channels of its delivery subjects
    /// (`herald.d.<channel>`), from the server's `/connz?subs=1`.
    fn connections(&self) -> Vec<(String, Vec<String>)> {
        let body = self
            .0
            .monitor_get("/connz?subs=1&limit=1024")
            .expect("connz");
        let connz: serde_json::Value = serde_json::from_str(&body).expect("connz json");
        let mut out = Vec::new();
        for conn in connz["connections"].as_array().into_iter().flatten() {
            let Some(name) = conn["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("herald-"))
            else {
                continue;
            };
            let mut channels = Vec::new();
            for sub in conn["subscriptions_list"].as_array().into_iter().flatten() {
                let sub = sub.as_str().unwrap_or_default();
                if let Some(token) = sub.strip_prefix("herald.d.") {
                    channels.push(unescape(token).expect("escaped channel"));
                }
            }
            out.push((name.to_owned(), channels));
        }
        out
    }
}

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

    fn channel_subscriptions(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (_, channels) in self.connections() {
            for channel in channels {
                *out.entry(channel).or_default() += 1;
            }
        }
        out
    }

    fn assert_no_patterns(&self) {
        let body = self
            .0
            .monitor_get("/connz?subs=1&limit=1024")
            .expect("connz");
        let connz: serde_json::Value = serde_json::from_str(&body).expect("connz json");
        for conn in connz["connections"].as_array().into_iter().flatten() {
            for sub in conn["subscriptions_list"].as_array().into_iter().flatten() {
                let sub = sub.as_str().unwrap_or_default();
                assert!(
                    !(sub.starts_with("herald.") && (sub.contains('*') || sub.contains('>'))),
                    "{} holds a wildcard subscription {sub}",
                    conn["name"]
                );
            }
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.0.port()).into()
    }

    fn url_via(&self, addr: std::net::SocketAddr) -> String {
        format!("nats://{addr}")
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
