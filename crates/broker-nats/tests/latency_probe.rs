//! Not a test of behaviour: prints publish latency percentiles (run with `--ignored --nocapture`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_broker::{PublishOptions, StreamOptions};
use herald_broker_nats::NatsConfig;
use herald_testkit::nats::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn publish_latency_profile() {
    let nats = NatsServer::start();
    let broker = herald_broker_nats::connect_with(NatsConfig::with_url(&nats.url()), "p")
        .await
        .unwrap();
    let opts = PublishOptions {
        stream: StreamOptions {
            history_size: 1000,
            ..StreamOptions::default()
        },
        idempotency_key: None,
    };
    for round in 0..3 {
        let mut lat: Vec<Duration> = Vec::new();
        let ch = format!("probe{round}");
        for i in 0..3000 {
            let t = Instant::now();
            broker
                .publish(&ch, Bytes::from(i.to_string()), None, &opts)
                .await
                .unwrap();
            lat.push(t.elapsed());
        }
        println!("round {round} first five: {:?}", &lat[..5]);
        lat.sort();
        let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
        println!(
            "round {round}: p50 {:?} p90 {:?} p99 {:?} p99.9 {:?} max {:?}; >20ms: {}",
            p(0.5),
            p(0.9),
            p(0.99),
            p(0.999),
            lat[lat.len() - 1],
            lat.iter()
                .filter(|d| **d > Duration::from_millis(20))
                .count()
        );
    }
}
