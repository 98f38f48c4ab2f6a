//! Turning the Herald frames a session queues into the bytes of an SSE or NDJSON stream.
//!
//! NDJSON carries the frames as they are, one per line (the WebSocket protocol's server side).
//! SSE turns them into events: publications are unnamed events (`EventSource.onmessage`) whose
//! data is the publication (`{"channel", "offset", "data", "info"?}`) and whose id holds every
//! requested channel's position (see [`super::event_id`]); the rest are named events.

use bytes::{BufMut, Bytes, BytesMut};
use herald_core::outbound::CloseRequest;
use herald_protocol::{CloseCode, StreamPosition};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::event_id;

/// The two unidirectional wire formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson`.
    Ndjson,
}

impl Format {
    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Sse => "text/event-stream",
            Format::Ndjson => "application/x-ndjson",
        }
    }
}

/// The reconnect delay every SSE stream asks for when it opens. A browser's `EventSource` keeps
/// the last `retry:` it read for every later reconnect, successful or not, so each stream that
/// opens resets it to this after a drain's shorter hint.
pub const RETRY_MS: u64 = 2000;

/// The shortest `retry:` a stream's last words ask for. A drain's `after_ms` may be 0; as the
/// browser keeps it for every later attempt, a node that is down (restarting, not only
/// draining) would otherwise see each of its clients come back every few milliseconds.
pub const RETRY_FLOOR_MS: u64 = 1000;

/// The delay a drain tells a one-way stream to come back after: the floor, plus a random part
/// of the drain window so that the clients of a node do not all return at once.
pub fn drain_after_ms(drain_ms: u64) -> u64 {
    RETRY_FLOOR_MS + rand::random_range(0..drain_ms.max(1))
}

/// Per-connection encoder: knows the requested channels and, for SSE, their positions.
pub struct Encoder {
    format: Format,
    channels: Vec<String>,
    positions: Vec<Option<StreamPosition>>,
}

#[derive(Deserialize)]
struct Push<'a> {
    #[serde(rename = "pub", borrow)]
    publication: Option<&'a RawValue>,
    #[serde(borrow)]
    join: Option<&'a RawValue>,
    #[serde(borrow)]
    leave: Option<&'a RawValue>,
    #[serde(borrow)]
    unsub: Option<&'a RawValue>,
    #[serde(borrow)]
    subscribe: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Located<'a> {
    channel: &'a str,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    code: u16,
}

#[derive(Deserialize)]
struct Offset {
    offset: u64,
}

#[derive(Deserialize)]
struct ConnectReply<'a> {
    #[serde(borrow)]
    connect: Option<Connected<'a>>,
}

#[derive(Deserialize)]
struct Connected<'a> {
    client: &'a str,
    node: &'a str,
    #[serde(default, borrow)]
    subs: std::collections::HashMap<String, &'a RawValue>,
    /// The connect proxy's data for the client.
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SubResult<'a> {
    epoch: Option<String>,
    #[serde(default)]
    offset: u64,
    recovered: Option<bool>,
    #[serde(default, borrow)]
    publications: Vec<&'a RawValue>,
    error: Option<serde_json::Value>,
}

fn event(out: &mut BytesMut, name: &str, data: &str) {
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
    out.put_slice(data.as_bytes());
    out.put_slice(b"\n\n");
}

impl Encoder {
    /// An encoder for the channels a request named, resumed from `since` (same order).
    pub fn new(format: Format, channels: Vec<String>, since: Vec<Option<StreamPosition>>) -> Self {
        Encoder {
            format,
            channels,
            positions: since,
        }
    }

    /// What opens the stream: for SSE the reconnect delay the browser should use.
    pub fn preamble(&self) -> Bytes {
        match self.format {
            Format::Sse => Bytes::from(format!("retry: {RETRY_MS}\n\n")),
            Format::Ndjson => Bytes::new(),
        }
    }

    /// The `connect` reply. NDJSON passes it on; SSE emits `connected`, then per channel its
    /// recovered publications, `recovery_failed` or `sub_error`.
    pub fn connect_reply(&mut self, frame: &[u8], out: &mut BytesMut) {
        if self.format == Format::Ndjson {
            out.put_slice(frame);
            out.put_u8(b'\n');
            return;
        }
        let Ok(ConnectReply {
            connect: Some(reply),
        }) = serde_json::from_slice::<ConnectReply>(frame)
        else {
            return;
        };
        let mut info = serde_json::json!({"client": reply.client, "node": reply.node});
        if let Some(data) = reply.data {
            info["data"] = serde_json::from_str(data.get()).unwrap_or_default();
        }
        event(out, "connected", &info.to_string());
        for i in 0..self.channels.len() {
            let channel = self.channels[i].clone();
            let Some(raw) = reply.subs.get(&channel) else {
                continue;
            };
            let Ok(result) = serde_json::from_str::<SubResult>(raw.get()) else {
                continue;
            };
            if let Some(error) = result.error {
                let body = serde_json::json!({"channel": channel, "error": error});
                event(out, "sub_error", &body.to_string());
                continue;
            }
            let Some(epoch) = result.epoch else { continue };
            let asked = self.positions[i].clone();
            if result.recovered == Some(false) {
                let body = serde_json::json!({
                    "channel": channel,
                    "since": asked,
                    "epoch": epoch,
                    "offset": result.offset,
                });
                event(out, "recovery_failed", &body.to_string());
            }
            if result.recovered == Some(true) {
                for p in &result.publications {
                    if let Ok(at) = serde_json::from_str::<Offset>(p.get()) {
                        self.positions[i] = Some(StreamPosition {
                            epoch: epoch.clone(),
                            offset: at.offset,
                        });
                        // The publication object with its channel, as live ones are sent.
                        let mut merged = String::with_capacity(p.get().len() + channel.len() + 16);
                        merged.push_str("{\"channel\":");
                        merged.push_str(&serde_json::to_string(&channel).expect("string"));
                        merged.push(',');
                        merged.push_str(&p.get()[1..]);
                        self.message(out, &merged);
                    }
                }
            }
            self.positions[i] = Some(StreamPosition {
                epoch,
                offset: result.offset,
            });
        }
        // Tell the browser where every channel stands, even before the first publication: an
        // event without data sets the last event id and is not dispatched.
        out.put_slice(b"id: ");
        out.put_slice(event_id::encode(&self.positions).as_bytes());
        out.put_slice(b"\n\n");
    }

    fn message(&self, out: &mut BytesMut, data: &str) {
        out.put_slice(b"id: ");
        out.put_slice(event_id::encode(&self.positions).as_bytes());
        out.put_slice(b"\ndata: ");
        out.put_slice(data.as_bytes());
        out.put_slice(b"\n\n");
    }

    /// A push. Returns a close request when the stream must end so that the client reconnects
    /// and recovers (an `unsub` with a resubscribe code: a one-way stream cannot resubscribe).
    pub fn push(&mut self, frame: &[u8], out: &mut BytesMut) -> Option<CloseRequest> {
        let Ok(push) = serde_json::from_slice::<Push>(frame) else {
            return None; // a reply: nothing for a one-way stream
        };
        let resubscribe = push
            .unsub
            .and_then(|u| serde_json::from_str::<Located>(u.get()).ok())
            .filter(|u| CloseCode(u.code).reconnect())
            .map(|u| CloseRequest {
                code: CloseCode::INSUFFICIENT_STATE,
                reason: format!("subscription to {} must be recovered", u.channel),
                after_ms: None,
            });
        if self.format == Format::Ndjson {
            out.put_slice(frame);
            out.put_u8(b'\n');
            return resubscribe;
        }
        if let Some(p) = push.publication {
            if let Ok(at) = serde_json::from_str::<Located>(p.get()) {
                if let Some(i) = self.channels.iter().position(|c| c == at.channel) {
                    // No offset: kept out of history (`skip_history`); the position stays.
                    if let (Some(pos), true) = (&mut self.positions[i], at.offset > 0) {
                        pos.offset = at.offset;
                    }
                }
            }
            self.message(out, p.get());
            return None;
        }
        let named = [
            ("join", push.join),
            ("leave", push.leave),
            ("unsub", push.unsub),
            ("subscribe", push.subscribe),
        ];
        for (name, raw) in named {
            if let Some(raw) = raw {
                event(out, name, raw.get());
            }
        }
        resubscribe
    }

    /// A keep-alive.
    pub fn ping(&self, out: &mut BytesMut) {
        match self.format {
            Format::Sse => out.put_slice(b": ping\n\n"),
            Format::Ndjson => out.put_slice(b"{}\n"),
        }
    }

    /// The last words: a `disconnect` (and for SSE a `retry` with the delay to come back after,
    /// never under [`RETRY_FLOOR_MS`]).
    pub fn disconnect(&self, req: &CloseRequest, out: &mut BytesMut) {
        let frame = herald_protocol::encode::push_disconnect(req.code, &req.reason, req.after_ms);
        match self.format {
            Format::Ndjson => {
                out.put_slice(&frame);
                out.put_u8(b'\n');
            }
            Format::Sse => {
                if let Some(after) = req.after_ms {
                    out.put_slice(format!("retry: {}\n\n", after.max(RETRY_FLOOR_MS)).as_bytes());
                }
                #[derive(Deserialize)]
                struct Disconnect<'a> {
                    #[serde(borrow)]
                    disconnect: &'a RawValue,
                }
                if let Ok(d) = serde_json::from_slice::<Disconnect>(&frame) {
                    event(out, "disconnect", d.disconnect.get());
                }
            }
        }
    }
}
