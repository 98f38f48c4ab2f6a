//! Benchmarking the proxy hooks (docs/benchmarks.md, "proxy"):
//!
//! - `herald-proxy-bench backend --port 9000 --delay-ms 5`: an application backend that answers
//!   every hook after a fixed delay (`/connect`: a user; anything else: an empty `result`), on
//!   keep-alive HTTP/1.1, each request in its own task, so it adds its delay and nothing else.
//! - `herald-proxy-bench publish-latency --ws ws://127.0.0.1:8000/ws --channel c -n 2000`: one
//!   client publishes `n` times in a row and reports the round trip (command sent → reply read)
//!   at p50 / p99 / max; run it on a channel with and without `publish_proxy` for the added cost.
//!
//! Connect rate through the connect proxy is measured with `herald-bench idle` against a node
//! whose `proxy.connect_url` points at the backend (its clients connect without a token).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
#[command(name = "herald-proxy-bench")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the hooks with a fixed delay.
    Backend {
        /// Port on 127.0.0.1 (0: a free one, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Milliseconds before each answer.
        #[arg(long, default_value_t = 5)]
        delay_ms: u64,
    },
    /// Publish from one client, one after the other, and report the round trips.
    PublishLatency {
        /// The node's WebSocket URL.
        #[arg(long, default_value = "ws://127.0.0.1:8000/ws")]
        ws: String,
        /// Channel to publish to.
        #[arg(long)]
        channel: String,
        /// Publications.
        #[arg(short, default_value_t = 2000)]
        n: u64,
        /// Connection token, if the node needs one.
        #[arg(long)]
        token: Option<String>,
    },
}

fn main() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match Cli::parse().command {
        Command::Backend { port, delay_ms } => rt.block_on(backend(port, delay_ms)),
        Command::PublishLatency {
            ws,
            channel,
            n,
            token,
        } => rt.block_on(publish_latency(&ws, &channel, n, token)),
    }
}

async fn backend(port: u16, delay_ms: u64) -> Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening {}", listener.local_addr()?.port());
    let delay = Duration::from_millis(delay_ms);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = serve(stream, delay).await;
        });
    }
}

/// Answer requests on one keep-alive connection until the peer closes it.
async fn serve(stream: TcpStream, delay: Duration) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut users: u64 = 0;
    loop {
        let mut request_line = String::new();
        if read.read_line(&mut request_line).await? == 0 {
            return Ok(());
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .to_owned();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().context("content-length")?;
                }
            }
        }
        let mut body = vec![0; length];
        read.read_exact(&mut body).await?;
        tokio::time::sleep(delay).await;
        users += 1;
        let answer = match path.as_str() {
            "/connect" => format!(r#"{{"result":{{"user":"bench-{users}"}}}}"#),
            _ => r#"{"result":{}}"#.to_owned(),
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        write.write_all(response.as_bytes()).await?;
    }
}

type Ws = tokio_websockets::WebSocketStream<tokio_websockets::MaybeTlsStream<TcpStream>>;

/// Send a command and read until its reply, answering pings on the way.
async fn call(
    ws: &mut Ws,
    id: u64,
    method: &str,
    params: serde_json::Value,
) -> Result<serde_json::Value> {
    let command = serde_json::json!({"id": id, method: params});
    ws.send(tokio_websockets::Message::text(command.to_string()))
        .await?;
    loop {
        let Some(message) = ws.next().await else {
            bail!("connection closed");
        };
        let message = message?;
        let Some(text) = message.as_text() else {
            continue;
        };
        for line in text.split('\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)?;
            if v == serde_json::json!({}) {
                ws.send(tokio_websockets::Message::text("{}".to_owned()))
                    .await?;
            } else if v["id"] == id {
                if v.get("error").is_some() {
                    bail!("{method} refused: {v}");
                }
                return Ok(v);
            }
        }
    }
}

async fn publish_latency(ws: &str, channel: &str, n: u64, token: Option<String>) -> Result<()> {
    let (mut ws, _) = tokio_websockets::ClientBuilder::from_uri(ws.parse()?)
        .connect()
        .await?;
    let connect = match token {
        Some(t) => serde_json::json!({"token": t}),
        None => serde_json::json!({}),
    };
    call(&mut ws, 1, "connect", connect).await?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for i in 0..n {
        let started = Instant::now();
        let params = serde_json::json!({"channel": channel, "data": {"n": i}});
        call(&mut ws, i + 2, "publish", params).await?;
        hist.record(started.elapsed().as_micros().max(1) as u64)?;
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "channel {channel}: {} publications, round trip p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        hist.len(),
        ms(0.5),
        ms(0.99),
        hist.max() as f64 / 1000.0
    );
    Ok(())
}
