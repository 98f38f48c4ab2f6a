//! `herald-ws-echo --port 18634 [--max-frame-bytes 65536]`: an echo server on the WebSocket codec
//! as a Herald node builds it for a client that did not negotiate compression (the vendored
//! tokio-websockets, a payload limit of 16 × `limits.max_frame_bytes`), for the Autobahn|Testsuite
//! cases that need an echo, which a Herald node cannot give: its text messages are protocol
//! commands, the first must be `connect` (docs/conformance.md). It tests the codec, not Herald's
//! connection loop or its handshake (which is where permessage-deflate is negotiated);
//! scripts/autobahn.sh runs both.

use anyhow::Result;
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(name = "herald-ws-echo")]
struct Cli {
    /// Port on 127.0.0.1.
    #[arg(long, default_value_t = 18634)]
    port: u16,
    /// Herald's `limits.max_frame_bytes`; the codec's limit is 16 × this, as on a node.
    #[arg(long, default_value_t = 65536)]
    max_frame_bytes: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let listener = TcpListener::bind(("127.0.0.1", cli.port)).await?;
    println!("herald-ws-echo on ws://127.0.0.1:{}", cli.port);
    let limits = tokio_websockets::Limits::default()
        .max_payload_len(Some(cli.max_frame_bytes.saturating_mul(16)));
    loop {
        let (tcp, _) = listener.accept().await?;
        tokio::spawn(async move {
            let builder = tokio_websockets::ServerBuilder::new().limits(limits);
            let Ok((_, mut ws)) = builder.accept(tcp).await else {
                return;
            };
            // Echo data messages; the codec answers pings and closes itself, and keeps being
            // polled until the peer has gone so that its close frame goes out.
            while let Some(r) = ws.next().await {
                match r {
                    Ok(msg) if msg.is_text() || msg.is_binary() => {
                        if ws.send(msg).await.is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    // A protocol error or a message over the limit: send the close frame the
                    // codec queued (1002, 1007, 1009), as a node's connection loop does.
                    Err(_) => {
                        let _ = ws.flush().await;
                        break;
                    }
                }
            }
        });
    }
}
