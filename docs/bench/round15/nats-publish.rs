//! Round 15 (docs/benchmarks.md): how fast one NATS server stores 10,000 JetStream publications to
//! 10,000 subjects, each with `Nats-Expected-Last-Subject-Sequence` as Herald's publish sends it,
//! into a file stream republished to a delivery subject that a subscriber drains (Herald's
//! `HERALD` stream), from K client connections with F publishes in flight. Ten rounds; each prints
//! its time. Not part of the workspace: build it in an empty cargo project with
//!
//!     [dependencies]
//!     async-nats = { version = "0.51", default-features = false, features = ["ring", "jetstream", "nuid"] }
//!     tokio = { version = "1", features = ["full"] }
//!     futures-util = "0.3"
//!     bytes = "1"
//!
//! and run it as `nats-publish nats://127.0.0.1:18742 K F` against
//! `nats-server -a 127.0.0.1 -p 18742 -js -sd DIR`.
use async_nats::jetstream::{
    self,
    stream::{Config, Republish, StorageType},
};
use async_nats::HeaderMap;
use futures_util::{stream, StreamExt};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = &args[1];
    let conns: usize = args[2].parse().unwrap();
    let inflight: usize = args[3].parse().unwrap();
    let n: usize = 10_000;
    let mut js = Vec::new();
    for _ in 0..conns {
        let c = async_nats::connect(url.as_str()).await.unwrap();
        js.push(jetstream::new(c));
    }
    let _ = js[0].delete_stream("X").await;
    js[0]
        .create_stream(Config {
            name: "X".into(),
            subjects: vec!["x.h.>".into()],
            storage: StorageType::File,
            max_messages_per_subject: 100,
            allow_direct: true,
            republish: Some(Republish {
                source: "x.h.>".into(),
                destination: "x.d.>".into(),
                headers_only: false,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let sub_client = async_nats::connect(url.as_str()).await.unwrap();
    let mut sub = sub_client.subscribe("x.d.>").await.unwrap();
    tokio::spawn(async move { while sub.next().await.is_some() {} });
    let mut last = vec![0u64; n];
    for round in 0..10 {
        let t = Instant::now();
        let results: Vec<(usize, u64)> = stream::iter(0..n)
            .map(|i| {
                let ctx = js[i % conns].clone();
                let expect = last[i];
                async move {
                    let mut h = HeaderMap::new();
                    h.insert(
                        "Nats-Expected-Last-Subject-Sequence",
                        expect.to_string().as_str(),
                    );
                    h.insert("Herald-Epoch", "abcdefgh");
                    h.insert("Herald-Offset", "12");
                    let ack = ctx
                        .publish_with_headers(
                            format!("x.h.user{i}"),
                            h,
                            bytes::Bytes::from_static(&[b'x'; 64]),
                        )
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                    (i, ack.sequence)
                }
            })
            .buffer_unordered(inflight)
            .collect()
            .await;
        for (i, s) in results {
            last[i] = s;
        }
        println!(
            "conns={conns} inflight={inflight} round={round} {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}
