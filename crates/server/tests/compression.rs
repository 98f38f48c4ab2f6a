//! WebSocket compression (permessage-deflate, RFC 7692) against the real binary, on the wire:
//! the handshake is written by hand and frames are built and read byte by byte, compressed with
//! flate2 here, so the test does not lean on the server's own (vendored) codec to agree with
//! itself. clients/js/test/integration/compression.test.ts checks the same with Node's `ws`, and
//! clients/js/test/browser/compression.test.ts with Chromium's WebSocket.

mod common;

use std::io::Write;
use std::time::Duration;

use common::Node;
use flate2::write::{DeflateDecoder, DeflateEncoder};
use flate2::Compression;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

/// A WebSocket opened by hand: the `101`'s headers and the socket after them.
struct Raw {
    tcp: TcpStream,
    head: String,
    buf: Vec<u8>,
}

/// One frame as read: FIN, RSV1, opcode, payload.
struct Frame {
    rsv1: bool,
    opcode: u8,
    payload: Vec<u8>,
}

async fn open(node: &Node, path: &str, extensions: Option<&str>) -> Raw {
    let mut tcp = TcpStream::connect(node.addr).await.unwrap();
    let ext = extensions
        .map(|e| format!("Sec-WebSocket-Extensions: {e}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n",
        node.addr
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let end = loop {
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, tcp.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed during the handshake");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8(buf[..end].to_vec()).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    Raw {
        tcp,
        head,
        buf: buf[end..].to_vec(),
    }
}

impl Raw {
    /// The `Sec-WebSocket-Extensions` answer, if any.
    fn extensions(&self) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("sec-websocket-extensions")
                .then(|| v.trim().to_owned())
        })
    }

    /// Send one masked frame (FIN set) with these RSV1 and opcode bits.
    async fn send_frame(&mut self, rsv1: bool, opcode: u8, payload: &[u8]) {
        let mut f = vec![0x80 | if rsv1 { 0x40 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x12, 0x34, 0x56, 0x78];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.tcp.write_all(&f).await.unwrap();
    }

    /// Send a text message, compressed (RSV1) or not.
    async fn send_text(&mut self, text: &str, compressed: bool) {
        let payload = if compressed {
            deflate(text.as_bytes())
        } else {
            text.as_bytes().to_vec()
        };
        self.send_frame(compressed, 1, &payload).await;
    }

    /// The next frame, or None once the socket ends.
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            if let Some((frame, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                return Some(frame);
            }
            let mut chunk = vec![0u8; 64 * 1024];
            let n = tokio::time::timeout(WAIT, self.tcp.read(&mut chunk))
                .await
                .expect("no frame in time")
                .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next text message's JSON lines (inflated when RSV1 is set) and whether it was
    /// compressed; panics on anything but a text frame.
    async fn text(&mut self) -> (Vec<Value>, bool) {
        let f = self.frame().await.expect("a frame");
        assert_eq!(f.opcode, 1, "expected a text frame");
        let data = if f.rsv1 {
            inflate(&f.payload)
        } else {
            f.payload
        };
        let lines = String::from_utf8(data)
            .unwrap()
            .split('\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines, f.rsv1)
    }

    /// Read until the close frame; its code.
    async fn close_code(&mut self) -> Option<u16> {
        while let Some(f) = self.frame().await {
            if f.opcode == 8 {
                return (f.payload.len() >= 2)
                    .then(|| u16::from_be_bytes([f.payload[0], f.payload[1]]));
            }
        }
        None
    }

    /// `connect` (anonymous, dev mode) with these subscriptions; returns once answered.
    async fn connect(&mut self, channels: &[&str], compressed: bool) {
        let subs: serde_json::Map<String, Value> = channels
            .iter()
            .map(|c| (c.to_string(), json!({})))
            .collect();
        self.send_text(
            &json!({"id": 1, "connect": {"subs": subs}}).to_string(),
            compressed,
        )
        .await;
        let (lines, _) = self.text().await;
        assert!(lines[0].get("connect").is_some(), "{lines:?}");
    }
}

/// An unmasked server frame at the start of `buf`, and its length.
fn parse(buf: &[u8]) -> Option<(Frame, usize)> {
    if buf.len() < 2 {
        return None;
    }
    assert_eq!(buf[1] & 0x80, 0, "server frames are not masked");
    let (len, at) = match buf[1] & 0x7f {
        126 => (
            u16::from_be_bytes(buf.get(2..4)?.try_into().unwrap()) as usize,
            4,
        ),
        127 => (
            u64::from_be_bytes(buf.get(2..10)?.try_into().unwrap()) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    let payload = buf.get(at..at + len)?.to_vec();
    assert!(
        buf[0] & 0x80 != 0,
        "the server does not fragment these messages"
    );
    Some((
        Frame {
            rsv1: buf[0] & 0x40 != 0,
            opcode: buf[0] & 0x0f,
            payload,
        },
        at + len,
    ))
}

/// Compress as RFC 7692 §7.2.1 says: raw deflate, sync flush, the 00 00 ff ff tail removed.
fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = DeflateEncoder::new(Vec::new(), Compression::default());
    e.write_all(data).unwrap();
    e.flush().unwrap();
    let mut out = e.get_ref().clone();
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

/// Inflate as RFC 7692 §7.2.2 says: append 00 00 ff ff, raw inflate.
fn inflate(data: &[u8]) -> Vec<u8> {
    let mut d = DeflateDecoder::new(Vec::new());
    d.write_all(data).unwrap();
    d.write_all(&[0, 0, 0xff, 0xff]).unwrap();
    d.flush().unwrap();
    d.get_ref().clone()
}

async fn node(compression: bool) -> Node {
    let on = compression.to_string();
    Node::start(&["--dev"], &[("HERALD_LIMITS__COMPRESSION", &on)]).await
}

const OFFER: &str = "permessage-deflate; client_max_window_bits";

#[tokio::test]
async fn negotiated_when_enabled_and_offered_and_publications_arrive_intact() {
    let node = node(true).await;
    let mut ws = open(&node, "/ws", Some(OFFER)).await;
    assert_eq!(
        ws.extensions().as_deref(),
        Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover")
    );
    // A compressed command is read (inflated) by the server.
    ws.connect(&["news"], true).await;

    // A large, compressible payload arrives compressed and intact; twice, since each message
    // is compressed without the previous one's window.
    let big: String = (0..2000)
        .map(|i| format!("item {i} of the feed; "))
        .collect();
    for n in 0..2 {
        node.publish("news", json!({ "n": n, "text": big })).await;
        let (lines, compressed) = ws.text().await;
        assert!(compressed, "a large publication is sent compressed");
        let publication = &lines[0]["pub"];
        assert_eq!(publication["data"], json!({ "n": n, "text": big }));
    }
    // A tiny one goes out as it is.
    node.publish("news", json!(1)).await;
    let (lines, compressed) = ws.text().await;
    assert!(!compressed);
    assert_eq!(lines[0]["pub"]["data"], json!(1));

    // Pusher's endpoint negotiates it too.
    let pusher = open(&node, "/app/missing?protocol=7", Some(OFFER)).await;
    assert!(pusher.extensions().is_some());
}

#[tokio::test]
async fn not_negotiated_when_disabled_or_not_offered() {
    let node = node(false).await;
    let mut ws = open(&node, "/ws", Some(OFFER)).await;
    assert_eq!(
        ws.extensions(),
        None,
        "disabled: no extension in the answer"
    );
    ws.connect(&["news"], false).await;
    let big = "x".repeat(10_000);
    node.publish("news", json!(big)).await;
    let (lines, compressed) = ws.text().await;
    assert!(!compressed);
    assert_eq!(lines[0]["pub"]["data"], json!(big));

    let node = self::node(true).await;
    let ws = open(&node, "/ws", None).await;
    assert_eq!(ws.extensions(), None, "enabled but not offered");
    // An offer Herald cannot honour (a smaller server window) is declined, not half-accepted.
    let ws = open(
        &node,
        "/ws",
        Some("permessage-deflate; server_max_window_bits=10"),
    )
    .await;
    assert_eq!(ws.extensions(), None);
}

#[tokio::test]
async fn compressed_frame_without_negotiation_is_a_protocol_error() {
    for enabled in [false, true] {
        let node = node(enabled).await;
        // Enabled on the node but not offered by this client: still not negotiated.
        let mut ws = open(&node, "/ws", None).await;
        ws.send_text(&json!({"id": 1, "connect": {}}).to_string(), true)
            .await;
        assert_eq!(ws.close_code().await, Some(1002), "enabled = {enabled}");
    }
}

#[tokio::test]
async fn decompression_bomb_gets_1009() {
    let node = node(true).await;
    let mut ws = open(&node, "/ws", Some(OFFER)).await;
    ws.connect(&[], true).await;
    // 64 MiB of spaces inside a JSON string: about 64 KiB compressed, well under the wire
    // limit (16 × max_frame_bytes = 1 MiB), but far past it once inflated.
    let bomb = format!(
        "{{\"id\":2,\"publish\":{{\"channel\":\"a\",\"data\":\"{}\"}}}}",
        " ".repeat(64 << 20)
    );
    let packed = deflate(bomb.as_bytes());
    assert!(packed.len() < 1 << 20, "{}", packed.len());
    ws.send_frame(true, 1, &packed).await;
    assert_eq!(ws.close_code().await, Some(1009));
    // The node is still serving.
    let mut other = open(&node, "/ws", Some(OFFER)).await;
    other.connect(&[], false).await;
}

#[tokio::test]
async fn corrupt_compressed_data_is_refused() {
    let node = node(true).await;
    let mut ws = open(&node, "/ws", Some(OFFER)).await;
    ws.connect(&[], true).await;
    ws.send_frame(true, 1, &[0xff, 0xff, 0xff, 0xff]).await;
    assert_eq!(ws.close_code().await, Some(1007));
}
