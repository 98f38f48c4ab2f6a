//! SSE on the raw connection: when a connection's first request is `GET /connection/sse`, it is
//! read and answered here instead of by hyper, and the stream's task writes the body's chunks
//! straight onto the socket.
//!
//! Why: a stream served through hyper keeps hyper's whole HTTP/1 connection for its lifetime (an
//! 8 KiB read buffer, a write buffer, the dispatcher and the body's channel), about 17 KB per
//! idle SSE connection more than a WebSocket, which hyper hands back at the upgrade (measured:
//! docs/benchmarks.md, "SSE beside WebSocket"). HTTP/1 has no upgrade for a plain `GET`, so the
//! request head is read before hyper sees the connection: anything else (and an SSE request
//! this reader does not take: HTTP/1.0, a request body, a head over [`MAX_HEAD`]) goes to
//! hyper with the bytes read so far in front ([`Prefixed`]). An SSE request on a kept-alive
//! connection after another request still goes through hyper ([`super::serve`]).
//!
//! The wire is what hyper would have written: `200` with `Transfer-Encoding: chunked`, the
//! same headers, one chunk per write; a refused request gets its JSON error with
//! `Connection: close`. The connection closes when the stream ends.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::timeout;

use super::format::Format;
use super::run::{self, Socket};
use crate::guard::{IpSlot, PeerAddr};
use crate::state::App;

/// The start of every request this module serves.
const SSE_LINE: &[u8] = b"GET /connection/sse";
/// Largest request head read here; a longer one is hyper's (which allows more).
pub const MAX_HEAD: usize = 16 * 1024;
/// Headers a request may have here; more, and it is hyper's.
const MAX_HEADERS: usize = 64;

/// Read the first request of a connection. `None`: it was an SSE request and is served here
/// (or the client sent nothing within `wait`); `Some`: hyper's, with what was read in front.
pub async fn first_request<S>(
    app: &Arc<App>,
    mut io: S,
    wait: Duration,
    peer: std::net::SocketAddr,
    slot: Option<&Arc<IpSlot>>,
) -> Option<Prefixed<S>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut buf = BytesMut::with_capacity(1024);
    let head = timeout(wait, async {
        loop {
            match sse_head(&buf) {
                Head::NotSse => return Ok::<_, io::Error>(None),
                Head::Complete(req) => return Ok(Some(req)),
                Head::Partial => {}
            }
            if buf.len() >= MAX_HEAD {
                return Ok(None);
            }
            buf.reserve(1024);
            if io.read_buf(&mut buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    })
    .await;
    let mut req = match head {
        Ok(Ok(Some(req))) => req,
        Ok(Ok(None)) => return Some(Prefixed::new(buf.freeze(), io)),
        // EOF, an error or silence before a whole request: as hyper does, close.
        Ok(Err(_)) | Err(_) => return None,
    };
    drop(buf); // a one-way stream's client sends nothing after its request
    req.extensions_mut().insert(PeerAddr(peer));
    if let Some(slot) = slot {
        req.extensions_mut().insert(slot.clone());
    }
    let write_limit = Duration::from_millis(app.ctx.config.limits.write_timeout_ms);
    match Box::pin(super::open_sse(app, &req)).await {
        Ok(opened) => {
            let mut head = Response::new(());
            super::stream_headers(&mut head, Format::Sse.content_type(), opened.origin);
            let mut bytes = response_head(&head, "transfer-encoding: chunked");
            bytes.put(run::chunked(&opened.first));
            let write = async {
                io.write_all(&bytes).await?;
                io.flush().await // TLS: the records may still sit in rustls's buffer
            };
            if matches!(timeout(write_limit, write).await, Ok(Ok(()))) {
                drop(bytes);
                // Its own task: sized to the stream, not to hyper's connection future.
                let sink = Socket::new(io, write_limit);
                tokio::spawn(run::run(app.clone(), opened.stream, sink));
            } else {
                Box::pin(opened.stream.session.end()).await;
            }
        }
        Err(refused) => {
            let (parts, body) = refused.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let head = Response::from_parts(parts, ());
            let length = format!("content-length: {}\r\nconnection: close", body.len());
            let mut bytes = response_head(&head, &length);
            bytes.put(body);
            if let Ok(Ok(())) = timeout(write_limit, io.write_all(&bytes)).await {
                let _ = timeout(write_limit, io.shutdown()).await;
            }
        }
    }
    None
}

/// What the bytes read so far say.
enum Head {
    /// Not an SSE request this module serves.
    NotSse,
    /// Not enough bytes to tell.
    Partial,
    /// An SSE request, parsed.
    Complete(Box<Request<()>>),
}

fn sse_head(buf: &[u8]) -> Head {
    let n = buf.len().min(SSE_LINE.len());
    if buf[..n] != SSE_LINE[..n] {
        return Head::NotSse;
    }
    match buf.get(SSE_LINE.len()) {
        None => return Head::Partial,
        Some(b'?' | b' ') => {}
        Some(_) => return Head::NotSse, // `/connection/sse/…`, `/connection/sse2`: hyper's 404
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::NotSse, // hyper answers what is malformed
    }
    // HTTP/1.0 has no chunked bodies; hyper ends such a body by closing.
    if parsed.version != Some(1) {
        return Head::NotSse;
    }
    let Some(path) = parsed.path else {
        return Head::NotSse;
    };
    let mut builder = Request::builder()
        .method(hyper::Method::GET)
        .uri(path)
        .version(Version::HTTP_11);
    for h in parsed.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Head::NotSse;
        };
        // A request body would have to be read past; hyper does that.
        let empty = name == hyper::header::CONTENT_LENGTH && value.as_bytes() == b"0";
        if (name == hyper::header::CONTENT_LENGTH && !empty)
            || name == hyper::header::TRANSFER_ENCODING
        {
            return Head::NotSse;
        }
        builder = builder.header(name, value);
    }
    builder
        .body(())
        .map_or(Head::NotSse, |req| Head::Complete(Box::new(req)))
}

/// A response's status line and headers, with `framing` (`content-length: …`,
/// `transfer-encoding: chunked`) and a `date`, as hyper writes them.
fn response_head(head: &Response<()>, framing: &str) -> BytesMut {
    let status: StatusCode = head.status();
    let mut bytes = BytesMut::with_capacity(256);
    bytes.put_slice(b"HTTP/1.1 ");
    bytes.put_slice(status.as_str().as_bytes());
    bytes.put_u8(b' ');
    bytes.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    bytes.put_slice(b"\r\n");
    for (name, value) in head.headers() {
        bytes.put_slice(name.as_str().as_bytes());
        bytes.put_slice(b": ");
        bytes.put_slice(value.as_bytes());
        bytes.put_slice(b"\r\n");
    }
    bytes.put_slice(framing.as_bytes());
    bytes.put_slice(b"\r\ndate: ");
    bytes.put_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    bytes.put_slice(b"\r\n\r\n");
    bytes
}

/// A connection with bytes already read from it in front, for hyper. The bytes are released
/// once hyper has read them.
pub struct Prefixed<S> {
    prefix: Bytes,
    io: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Bytes, io: S) -> Self {
        Prefixed { prefix, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        if self.prefix.is_empty() {
            self.prefix = Bytes::new(); // frees the buffer
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(head: &str) -> &'static str {
        match sse_head(head.as_bytes()) {
            Head::NotSse => "hyper",
            Head::Partial => "partial",
            Head::Complete(_) => "sse",
        }
    }

    #[test]
    fn only_whole_http11_sse_heads_are_taken() {
        assert_eq!(
            kind("GET /connection/sse?channel=a HTTP/1.1\r\nHost: x\r\n\r\n"),
            "sse"
        );
        assert_eq!(kind("GET /connection/sse HTTP/1.1\r\n\r\n"), "sse");
        assert_eq!(kind("GET /conn"), "partial");
        assert_eq!(kind("GET /connection/sse"), "partial");
        assert_eq!(
            kind("GET /connection/sse?channel=a HTTP/1.1\r\nHost"),
            "partial"
        );
        assert_eq!(kind("GET /ws HTTP/1.1\r\n\r\n"), "hyper");
        assert_eq!(kind("POST /connection/sse HTTP/1.1\r\n\r\n"), "hyper");
        assert_eq!(kind("GET /connection/sse/x HTTP/1.1\r\n\r\n"), "hyper");
        assert_eq!(kind("GET /connection/sse HTTP/1.0\r\n\r\n"), "hyper");
        assert_eq!(
            kind("GET /connection/sse HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"),
            "hyper"
        );
        assert_eq!(
            kind("GET /connection/sse HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            "sse"
        );
        assert_eq!(
            kind("GET /connection/sse HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "hyper"
        );
        assert_eq!(
            kind("GET /connection/sse HTTP/1.1\r\nbad header\r\n\r\n"),
            "hyper"
        );
    }

    #[tokio::test]
    async fn hyper_reads_the_prefix_then_the_connection() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = Prefixed::new(Bytes::from_static(b"GET /ws"), server);
        client.write_all(b" HTTP/1.1").await.unwrap();
        drop(client);
        let mut all = String::new();
        io.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "GET /ws HTTP/1.1");
    }
}
