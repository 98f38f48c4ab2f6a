//! `--transport sse`: a client of Herald's Server-Sent Events endpoint (`GET /connection/sse`,
//! docs/transports.md) for the worker, so idle memory and broadcast latency of SSE can be set
//! beside WebSocket's in one run pair.
//!
//! The stream's events are turned back into the WebSocket protocol's lines (a publication event
//! into `{"pub": …}`, `: ping` into `{}`, `disconnect`/`unsub`/`join`/`leave` into their pushes,
//! `sub_error` into an error reply), so the worker's accounting (offsets, duplicates, gaps,
//! latency from the embedded send time) is the very code WebSocket clients go through.
//!
//! A minimal HTTP/1.1 reader (chunked or close-delimited body): the bench holds thousands of
//! these, so each keeps only its socket and a small buffer.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tls::Stream;
use crate::wire::Since;

/// Where the SSE endpoint of a node is, from its `--ws` URL (`ws://host:port/…`).
pub fn endpoint(ws_url: &str) -> String {
    let rest = ws_url
        .strip_prefix("ws://")
        .or_else(|| ws_url.strip_prefix("wss://"))
        .or_else(|| ws_url.strip_prefix("http://"))
        .or_else(|| ws_url.strip_prefix("https://"))
        .unwrap_or(ws_url);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// One open SSE stream.
pub struct SseConn {
    tcp: Stream,
    /// Bytes read and not yet decoded (chunk framing included).
    raw: BytesMut,
    /// Decoded body bytes not yet parsed into events.
    body: BytesMut,
    /// Chunked body: bytes left in the current chunk, and whether its CRLF is still owed.
    chunked: Option<(usize, bool)>,
    /// The body ended (last chunk, or EOF).
    ended: bool,
}

/// An event block as read: its `event`, `data` (joined lines) and `id`.
#[derive(Debug, Default, PartialEq)]
pub struct Event {
    /// The event name (`None`: an unnamed event, a publication).
    pub event: Option<String>,
    /// Its data, lines joined with `\n`.
    pub data: Option<String>,
    /// Its id.
    pub id: Option<String>,
    /// It was only a comment (`: ping`).
    pub comment: bool,
}

impl SseConn {
    /// Send the request on `tcp` (already connected) and read the response head.
    ///
    /// # Errors
    /// I/O errors and a status other than 200, as the worker's error kinds.
    pub async fn open(
        mut tcp: Stream,
        host: &str,
        channel: &str,
        since: Option<&Since>,
    ) -> Result<SseConn, String> {
        let last_id = since
            .map(|s| format!("Last-Event-ID: {}:{}\r\n", s.epoch, s.offset))
            .unwrap_or_default();
        let req = format!(
            "GET /connection/sse?channel={channel} HTTP/1.1\r\nHost: {host}\r\n\
             Accept: text/event-stream\r\n{last_id}\r\n"
        );
        tcp.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("send sse request: {e}"))?;
        let mut raw = BytesMut::with_capacity(1024);
        let head_end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if raw.len() > 16 * 1024 {
                return Err("sse response head too long".into());
            }
            match tcp.read_buf(&mut raw).await {
                Ok(0) => return Err("closed before the sse response".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("read sse response: {e}")),
            }
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status != "200" {
            return Err(format!("sse status {status}"));
        }
        let chunked = head
            .lines()
            .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
        raw.advance(head_end);
        Ok(SseConn {
            tcp,
            raw,
            body: BytesMut::new(),
            chunked: chunked.then_some((0, false)),
            ended: false,
        })
    }

    /// The next event block; `None` once the stream ends. Cancel-safe: what was read stays in
    /// the buffers.
    pub async fn next_event(&mut self) -> Option<Event> {
        loop {
            self.decode();
            if let Some(ev) = take_event(&mut self.body) {
                return Some(ev);
            }
            if self.ended {
                return None;
            }
            match self.tcp.read_buf(&mut self.raw).await {
                Ok(0) | Err(_) => self.ended = true,
                Ok(_) => {}
            }
        }
    }

    /// Move what `raw` holds of the body into `body`, undoing chunked framing.
    fn decode(&mut self) {
        let Some((left, crlf)) = self.chunked.as_mut() else {
            self.body.extend_from_slice(&self.raw);
            self.raw.clear();
            return;
        };
        loop {
            if *left > 0 {
                let n = (*left).min(self.raw.len());
                if n == 0 {
                    return;
                }
                self.body.extend_from_slice(&self.raw[..n]);
                self.raw.advance(n);
                *left -= n;
                *crlf = *left == 0;
            } else if *crlf {
                if self.raw.len() < 2 {
                    return;
                }
                self.raw.advance(2);
                *crlf = false;
            } else {
                let Some(i) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                    return;
                };
                let line = String::from_utf8_lossy(&self.raw[..i]).into_owned();
                self.raw.advance(i + 2);
                let size = line.split(';').next().unwrap_or("").trim();
                match usize::from_str_radix(size, 16) {
                    Ok(0) | Err(_) => {
                        self.ended = true;
                        return;
                    }
                    Ok(n) => *left = n,
                }
            }
        }
    }
}

/// One complete event block from the front of `body`, if there is one.
fn take_event(body: &mut BytesMut) -> Option<Event> {
    let end = body.windows(2).position(|w| w == b"\n\n")?;
    let block = body.split_to(end + 2);
    let text = String::from_utf8_lossy(&block[..end]);
    let mut ev = Event::default();
    let mut any_field = false;
    for line in text.split('\n') {
        if line.starts_with(':') {
            continue;
        }
        any_field = true;
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => ev.event = Some(value.to_owned()),
            "id" => ev.id = Some(value.to_owned()),
            "data" => match &mut ev.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => ev.data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    ev.comment = !any_field;
    Some(ev)
}

impl Event {
    /// The WebSocket protocol line this event stands for, if the worker counts it.
    pub fn as_line(&self) -> Option<String> {
        if self.comment {
            // `: ping`: counted as the WebSocket protocol's `{}`; nothing to answer.
            return Some("{}".into());
        }
        let data = self.data.as_deref()?;
        let key = match self.event.as_deref() {
            None => "pub",
            Some(k @ ("disconnect" | "unsub" | "join" | "leave")) => k,
            Some("sub_error") => "error",
            _ => return None,
        };
        Some(format!("{{\"{key}\":{data}}}"))
    }
}

/// The position an event id gives for the only requested channel: `epoch:offset`.
pub fn position(id: &str) -> Option<(String, u64)> {
    let first = id.split(',').next()?;
    let (epoch, offset) = first.rsplit_once(':')?;
    Some((epoch.to_owned(), offset.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_become_protocol_lines() {
        let mut body = BytesMut::from(
            &b"retry: 2000\n\nevent: connected\ndata: {\"client\":\"a\"}\n\nid: e1:3\n\n: ping\n\nid: e1:4\ndata: {\"channel\":\"c\",\"offset\":4,\"data\":{\"t\":1}}\n\nevent: disconnect\ndata: {\"code\":4000}\n\npartial"[..],
        );
        let mut lines = Vec::new();
        let mut ids = Vec::new();
        while let Some(ev) = take_event(&mut body) {
            if let Some(id) = &ev.id {
                ids.push(position(id).unwrap());
            }
            lines.extend(ev.as_line());
        }
        assert_eq!(
            lines,
            [
                "{}",
                "{\"pub\":{\"channel\":\"c\",\"offset\":4,\"data\":{\"t\":1}}}",
                "{\"disconnect\":{\"code\":4000}}"
            ]
        );
        assert_eq!(ids, [("e1".to_string(), 3), ("e1".to_string(), 4)]);
        assert_eq!(&body[..], b"partial");
        assert_eq!(endpoint("ws://127.0.0.1:8000/ws"), "127.0.0.1:8000");
    }
}
