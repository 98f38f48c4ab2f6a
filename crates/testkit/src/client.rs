//! A protocol client over a real WebSocket that follows docs/protocol.md literally: it splits
//! newline-batched frames, answers the server's pings (unless told not to) and keeps pushes that
//! arrive while it waits for a reply, in order.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_websockets::{ClientBuilder, Message, WebSocketStream};

use crate::node::WAIT;

/// Any byte stream a client can speak over (TCP, TLS, a proxy).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How a connection ended.
#[derive(Debug)]
pub struct Closed {
    /// The `disconnect` push, if one came.
    pub disconnect: Option<Value>,
    /// The close frame's code, if one came.
    pub code: Option<u16>,
}

/// What reading one frame gave.
enum Read {
    /// A frame (its messages are queued).
    Frame,
    /// The connection ended.
    Closed,
    /// Nothing within the wait.
    Quiet,
}

/// A protocol client.
pub struct Client {
    /// The WebSocket, for tests that send frames of their own.
    pub ws: WebSocketStream<Box<dyn Io>>,
    pending: VecDeque<Value>,
    next_id: u64,
    /// Answer the server's `{}` pings (default); off to test the pong timeout.
    pub auto_pong: bool,
    /// The close code, once the connection ended (1006 when it ended without a close frame).
    pub close_code: Option<u16>,
    /// Whether the connection ended (closed, reset or failed).
    pub closed: bool,
    /// The `connect` result (`client`, `subs`, …) when made by `Node::subscriber`.
    pub connect_reply: Value,
}

impl Client {
    /// A client on `ws://addr/ws` with extra handshake headers; panics if it cannot open.
    pub async fn open(addr: SocketAddr, headers: &[(&str, &str)]) -> Client {
        let tcp = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .unwrap_or_else(|_| panic!("no TCP connection to {addr} within {WAIT:?}"))
            .expect("tcp connect");
        Client::open_on(Box::new(tcp), &format!("ws://{addr}/ws"), headers)
            .await
            .expect("ws handshake")
    }

    /// A client over `io` (e.g. TLS) to `url`; panics when the handshake gets no answer within
    /// the harness's wait.
    pub async fn open_on(
        io: Box<dyn Io>,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Client, tokio_websockets::Error> {
        tokio::time::timeout(WAIT, Client::handshake(io, url, headers))
            .await
            .unwrap_or_else(|_| panic!("no WebSocket handshake answer from {url} within {WAIT:?}"))
    }

    /// The WebSocket handshake, unbounded: callers put the bound on it.
    pub(crate) async fn handshake(
        io: Box<dyn Io>,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Client, tokio_websockets::Error> {
        let mut builder = ClientBuilder::from_uri(url.parse().expect("a ws:// URL"));
        for (k, v) in headers {
            builder = builder.add_header(
                http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
                http::HeaderValue::from_str(v).expect("header value"),
            )?;
        }
        let (ws, _) = builder.connect_on(io).await?;
        Ok(Client::open_ws(ws))
    }

    /// A client on a WebSocket the test opened itself (e.g. with its own codec settings).
    pub fn open_ws(ws: WebSocketStream<Box<dyn Io>>) -> Client {
        Client {
            ws,
            pending: VecDeque::new(),
            next_id: 1,
            auto_pong: true,
            close_code: None,
            closed: false,
            connect_reply: Value::Null,
        }
    }

    /// Send a text frame as is; panics if the connection is gone.
    pub async fn send_raw(&mut self, text: &str) {
        self.send_frame(Message::text(text.to_owned()))
            .await
            .expect("send");
    }

    /// Send a text frame; false when the connection is already gone (fuzzing sends into
    /// connections the server may have closed).
    pub async fn try_send_raw(&mut self, text: &str) -> bool {
        self.send_frame(Message::text(text.to_owned()))
            .await
            .is_ok()
    }

    /// Every frame the client sends goes through here: a send that cannot finish within the
    /// harness's wait (the node stopped reading and the socket's buffers are full) fails the test
    /// instead of hanging it.
    async fn send_frame(&mut self, m: Message) -> Result<(), tokio_websockets::Error> {
        tokio::time::timeout(WAIT, self.ws.send(m))
            .await
            .unwrap_or_else(|_| {
                panic!("a send did not finish within {WAIT:?}: the node stopped reading")
            })
    }

    /// Send a command; returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_raw(&json!({ "id": id, method: params }).to_string())
            .await;
        id
    }

    /// Send a command and wait for its reply; pushes that arrive meanwhile are kept in order.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.reply(id).await
    }

    /// Like [`call`](Self::call), `None` when the connection ends (or stays quiet) first.
    pub async fn try_call(&mut self, method: &str, params: Value) -> Option<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({ "id": id, method: params }).to_string();
        if !self.try_send_raw(&text).await {
            self.closed = true;
            return None;
        }
        self.reply_within(id, WAIT).await
    }

    /// Wait for the reply to `id`; other messages stay queued in order.
    pub async fn reply(&mut self, id: u64) -> Value {
        match self.reply_within(id, WAIT).await {
            Some(reply) => reply,
            None if self.closed => panic!(
                "closed while waiting for reply {id} (code {:?})",
                self.close_code
            ),
            None => panic!("no reply {id} within {WAIT:?}"),
        }
    }

    async fn reply_within(&mut self, id: u64, wait: Duration) -> Option<Value> {
        loop {
            if let Some(pos) = self.pending.iter().position(|m| m["id"] == id) {
                return self.pending.remove(pos);
            }
            // Frames from the socket only: `pending` holds the pushes that came meanwhile.
            match self.read_frame(wait).await {
                Read::Frame => {}
                Read::Closed | Read::Quiet => return None,
            }
        }
    }

    /// The next message (reply or push), panicking after the harness's wait.
    pub async fn next(&mut self) -> Value {
        match self.next_within(WAIT).await {
            Some(m) => m,
            None if self.closed => panic!("connection closed (code {:?})", self.close_code),
            None => panic!("no message within {WAIT:?}"),
        }
    }

    /// The next message, or `None` when the connection closed.
    pub async fn next_or_closed(&mut self) -> Option<Value> {
        let m = self.next_within(WAIT).await;
        assert!(m.is_some() || self.closed, "no message within {WAIT:?}");
        m
    }

    /// The next message within `wait`; `None` on timeout or close.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(m) = self.pending.pop_front() {
                return Some(m);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.read_frame(left).await {
                Read::Frame => {}
                Read::Closed | Read::Quiet => return None,
            }
        }
    }

    /// Next push with this key (skipping nothing: panics if another message comes first).
    pub async fn push(&mut self, key: &str) -> Value {
        let m = self.next().await;
        assert!(m.get(key).is_some(), "expected a {key} push, got {m}");
        m[key].clone()
    }

    /// Collect `pub` pushes of `channel` until `count` arrived (or `wait` passes with nothing).
    pub async fn offsets(&mut self, channel: &str, count: usize, wait: Duration) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < count {
            let Some(m) = self.next_within(wait).await else {
                break;
            };
            if m["pub"]["channel"] == channel {
                out.push(m["pub"]["offset"].as_u64().expect("offset"));
            }
        }
        out
    }

    /// Read one frame into `pending` (split on newlines, pings answered when `auto_pong`).
    async fn read_frame(&mut self, wait: Duration) -> Read {
        if self.closed {
            return Read::Closed;
        }
        let msg = match tokio::time::timeout(wait, self.ws.next()).await {
            Err(_) => return Read::Quiet,
            Ok(Some(Ok(m))) => m,
            Ok(_) => return self.ended(1006),
        };
        if let Some((code, _)) = msg.as_close() {
            return self.ended(u16::from(code));
        }
        let Some(text) = msg.as_text() else {
            return Read::Frame;
        };
        let mut batch = Vec::new();
        for line in text.split('\n').filter(|l| !l.is_empty()) {
            batch.push(
                serde_json::from_str::<Value>(line)
                    .unwrap_or_else(|e| panic!("bad JSON from server {line:?}: {e}")),
            );
        }
        for m in batch {
            if m == json!({}) && self.auto_pong {
                if !self.try_send_raw("{}").await {
                    return self.ended(1006);
                }
                continue;
            }
            self.pending.push_back(m);
        }
        Read::Frame
    }

    fn ended(&mut self, code: u16) -> Read {
        self.close_code.get_or_insert(code);
        self.closed = true;
        Read::Closed
    }

    /// Send a WebSocket-level ping frame (not the protocol's `{}`).
    pub async fn ws_ping(&mut self) {
        let _ = self.send_frame(Message::ping(bytes::Bytes::new())).await;
    }

    /// Read until the connection closes; returns the disconnect push and close code.
    pub async fn closed(&mut self) -> Closed {
        let mut disconnect = None;
        while let Some(m) = self.next_or_closed().await {
            if let Some(d) = m.get("disconnect") {
                disconnect = Some(d.clone());
            }
        }
        Closed {
            disconnect,
            code: self.close_code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Runs `f` (which must panic within the harness's wait) and returns its panic message.
    async fn panic_message(f: impl std::future::Future<Output = ()> + Send + 'static) -> String {
        let limit = WAIT + Duration::from_secs(10);
        let err = tokio::time::timeout(limit, tokio::spawn(f))
            .await
            .unwrap_or_else(|_| panic!("still waiting after {limit:?}: the wait is unbounded"))
            .expect_err("it should have failed");
        let p = err.into_panic();
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn a_handshake_nobody_answers_fails_within_the_wait() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        // Accepts and holds the connection, and never answers the upgrade request.
        tokio::spawn(async move {
            let held = l.accept().await;
            tokio::time::sleep(WAIT * 4).await;
            drop(held);
        });
        let msg = panic_message(async move {
            Client::open(addr, &[]).await;
        })
        .await;
        assert!(msg.contains("no WebSocket handshake answer"), "{msg}");
    }

    #[tokio::test]
    async fn a_send_the_peer_never_reads_fails_within_the_wait() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        // Completes the upgrade, then never reads: the socket's buffers fill up.
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let held = tokio_websockets::ServerBuilder::new().accept(s).await;
            tokio::time::sleep(WAIT * 4).await;
            drop(held);
        });
        let msg = panic_message(async move {
            let mut c = Client::open(addr, &[]).await;
            let big = "x".repeat(1 << 20);
            loop {
                c.send_raw(&big).await;
            }
        })
        .await;
        assert!(msg.contains("a send did not finish"), "{msg}");
    }
}
