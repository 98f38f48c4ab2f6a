//! `herald-fanout-floor --port 18690 [--writers 2]`: the least a server can do for
//! `herald-bench broadcast`, to learn what the machine itself allows before blaming a server's
//! code for a latency (docs/benchmarks.md, round 12).
//!
//! It speaks just enough of the protocol for the rig: `GET /health`, an empty `GET /metrics`,
//! `POST /api/publish` (answered with an offset), and a WebSocket `connect` with `subs`, answered
//! once. After that answer a connection's socket goes to one of `--writers` plain threads. A
//! publication becomes one WebSocket frame built once, and each writer thread writes it to each
//! of its sockets with one `write(2)`, in a loop: no task per connection, no queue, no wake-up, no
//! timer, no lock on the way. Nothing is read from a client after its `connect` (pings, closes), a
//! socket that cannot take a whole frame at once is dropped and counted: this is a measuring
//! stick, not a server.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream as StdStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::{bail, Context, Result};
use base64::Engine;
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
#[command(name = "herald-fanout-floor")]
struct Cli {
    /// Port on 127.0.0.1 (WebSocket on any path, the API beside it).
    #[arg(long, default_value_t = 18690)]
    port: u16,
    /// Threads that write the fan-out, each to its share of the sockets.
    #[arg(long, default_value_t = 2)]
    writers: usize,
}

/// Work for a writer thread.
enum Job {
    /// A subscriber whose `connect` was answered.
    Add(StdStream),
    /// A WebSocket frame for every subscriber.
    Frame(Arc<Vec<u8>>),
}

/// What the accept side shares: the writer threads' inboxes and each channel's last offset.
struct Node {
    writers: Vec<mpsc::Sender<Job>>,
    next_writer: AtomicU64,
    offsets: Mutex<HashMap<String, u64>>,
}

/// Sockets dropped because a write took less than the whole frame (or failed).
static DROPPED: AtomicU64 = AtomicU64::new(0);

fn writer(inbox: mpsc::Receiver<Job>) {
    let mut sockets: Vec<StdStream> = Vec::new();
    for job in inbox {
        match job {
            Job::Add(s) => sockets.push(s),
            Job::Frame(frame) => sockets.retain_mut(|s| match s.write(&frame) {
                Ok(n) if n == frame.len() => true,
                _ => {
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                    false
                }
            }),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let writers = (0..cli.writers.max(1))
        .map(|_| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || writer(rx));
            tx
        })
        .collect();
    let node = Arc::new(Node {
        writers,
        next_writer: AtomicU64::new(0),
        offsets: Mutex::default(),
    });
    let listener = TcpListener::bind(("127.0.0.1", cli.port)).await?;
    println!("herald-fanout-floor on 127.0.0.1:{}", cli.port);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, _) = accepted?;
                let node = node.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(node, tcp).await {
                        eprintln!("connection: {e:#}");
                    }
                });
            }
            _ = term.recv() => break,
        }
    }
    println!("dropped sockets: {}", DROPPED.load(Ordering::Relaxed));
    Ok(())
}

/// One request head: method, path, lower-cased headers; and what was read past it.
struct Head {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    rest: Vec<u8>,
}

async fn read_head(tcp: &mut TcpStream, mut buf: Vec<u8>) -> Result<Option<Head>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = std::str::from_utf8(&buf[..end]).context("head is not UTF-8")?;
            let mut lines = text.split("\r\n");
            let mut first = lines.next().unwrap_or("").split(' ');
            let method = first.next().unwrap_or("").to_string();
            let path = first.next().unwrap_or("").to_string();
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            let rest = buf[end + 4..].to_vec();
            return Ok(Some(Head {
                method,
                path,
                headers,
                rest,
            }));
        }
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn serve(node: Arc<Node>, mut tcp: TcpStream) -> Result<()> {
    tcp.set_nodelay(true)?;
    let mut carry = Vec::new();
    while let Some(head) = read_head(&mut tcp, std::mem::take(&mut carry)).await? {
        if head.headers.get("upgrade").map(|u| u.to_ascii_lowercase()) == Some("websocket".into()) {
            return subscriber(node, tcp, head).await;
        }
        let len: usize = head
            .headers
            .get("content-length")
            .map(|v| v.parse())
            .transpose()?
            .unwrap_or(0);
        let mut body = head.rest;
        while body.len() < len {
            let mut chunk = vec![0u8; len - body.len()];
            let n = tcp.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            body.extend_from_slice(&chunk[..n]);
        }
        carry = body.split_off(len);
        let (status, answer) = match (head.method.as_str(), head.path.as_str()) {
            ("POST", "/api/publish") => publish(&node, &body)?,
            ("GET", "/health") => ("200 OK", "{}".to_string()),
            ("GET", "/metrics") => ("200 OK", String::new()),
            _ => ("404 Not Found", "{}".to_string()),
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        tcp.write_all(reply.as_bytes()).await?;
    }
    Ok(())
}

/// Build the publication's frame once, hand it to every writer, answer with its offset.
fn publish(node: &Node, body: &[u8]) -> Result<(&'static str, String)> {
    #[derive(serde::Deserialize)]
    struct Publish<'a> {
        channel: String,
        #[serde(borrow)]
        data: &'a serde_json::value::RawValue,
    }
    let p: Publish = serde_json::from_slice(body).context("publish body")?;
    let offset = {
        let mut offsets = node.offsets.lock().expect("offsets lock");
        let o = offsets.entry(p.channel.clone()).or_default();
        *o += 1;
        *o
    };
    let push = format!(
        r#"{{"pub":{{"channel":"{}","offset":{offset},"data":{}}}}}"#,
        p.channel,
        p.data.get()
    );
    let frame = Arc::new(text_frame(push.as_bytes()));
    for w in &node.writers {
        let _ = w.send(Job::Frame(frame.clone()));
    }
    Ok((
        "200 OK",
        format!(r#"{{"epoch":"floor","offset":{offset}}}"#),
    ))
}

/// An unmasked server text frame.
fn text_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 10);
    f.push(0x81);
    match payload.len() {
        n if n < 126 => f.push(n as u8),
        n if n <= u16::MAX as usize => {
            f.push(126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(payload);
    f
}

/// Upgrade, read the `connect` command, answer it, and hand the socket to a writer.
async fn subscriber(node: Arc<Node>, mut tcp: TcpStream, head: Head) -> Result<()> {
    let key = head
        .headers
        .get("sec-websocket-key")
        .context("no Sec-WebSocket-Key")?;
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes());
    let reply = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    tcp.write_all(reply.as_bytes()).await?;
    let command = read_client_text(&mut tcp, head.rest).await?;
    #[derive(serde::Deserialize)]
    struct Connect {
        connect: ConnectBody,
    }
    #[derive(serde::Deserialize)]
    struct ConnectBody {
        #[serde(default)]
        subs: HashMap<String, serde_json::Value>,
    }
    let c: Connect = serde_json::from_slice(&command).context("connect command")?;
    let subs: serde_json::Map<String, serde_json::Value> = {
        let offsets = node.offsets.lock().expect("offsets lock");
        c.connect
            .subs
            .keys()
            .map(|ch| {
                let offset = offsets.get(ch).copied().unwrap_or(0);
                (
                    ch.clone(),
                    serde_json::json!({"epoch": "floor", "offset": offset}),
                )
            })
            .collect()
    };
    let answer = serde_json::json!({"id": 1, "connect": {"client": "floor", "subs": subs}});
    tcp.write_all(&text_frame(answer.to_string().as_bytes()))
        .await?;
    let std = tcp.into_std()?;
    let i = node.next_writer.fetch_add(1, Ordering::Relaxed) as usize % node.writers.len();
    let _ = node.writers[i].send(Job::Add(std));
    Ok(())
}

/// Read one masked client text frame (unfragmented, as the rig sends its `connect`).
async fn read_client_text(tcp: &mut TcpStream, mut buf: Vec<u8>) -> Result<Vec<u8>> {
    loop {
        if buf.len() >= 2 {
            let (len, at) = match buf[1] & 0x7f {
                126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
                127 if buf.len() >= 10 => (
                    u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes")) as usize,
                    10,
                ),
                n if n < 126 => (n as usize, 2),
                _ => (usize::MAX, 0),
            };
            if buf[1] & 0x80 == 0 {
                bail!("client frame not masked");
            }
            if len != usize::MAX && buf.len() >= at + 4 + len {
                let mask = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
                let payload = buf[at + 4..at + 4 + len]
                    .iter()
                    .enumerate()
                    .map(|(i, b)| b ^ mask[i % 4])
                    .collect();
                return Ok(payload);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed before connect");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
