//! WebSocket compression (permessage-deflate, RFC 7692) for both WebSocket endpoints: reading the
//! client's offer, the answer, and the compressed text messages the connection loops send.
//!
//! Herald always answers `server_no_context_takeover; client_no_context_takeover`: each message
//! is compressed on its own, so a connection keeps no deflate window (the compressor and
//! decompressor are per thread, in the vendored tokio-websockets' `deflate` module) and an idle
//! connection costs what it costs without compression. Inflating a client's message, the RSV1
//! checks and the decompressed-size limit (close 1009) are the vendored codec's.
//!
//! A fan-out hands the same frame (one shared `Bytes`) to every subscriber's queue. A small
//! per-thread cache keyed by that allocation compresses it once per worker thread rather than
//! once per connection.

use std::cell::RefCell;

use bytes::Bytes;
use hyper::header::{HeaderMap, SEC_WEBSOCKET_EXTENSIONS};
use tokio_websockets::{Message, Payload};

/// The answer to an accepted offer.
pub(crate) const ACCEPTED: &str =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// Messages shorter than this go out uncompressed: a deflate block's overhead eats what a few
/// dozen bytes would save, and inflating costs the client more than reading them.
pub(crate) const MIN_BYTES: usize = 128;

/// Frames remembered per thread. A fan-out writes one frame to many connections in a row, so a
/// handful covers publications to a few channels interleaved. Each slot keeps its frame (and the
/// compressed copy) alive until four later frames push it out: a bounded few per thread.
const CACHE_SLOTS: usize = 4;

/// Whether the request offers permessage-deflate with parameters Herald can honour; the answer
/// to send then is [`ACCEPTED`] (with `server_max_window_bits=15` echoed when asked).
/// Offers are tried in the client's order (RFC 7692 §5); one that asks for a smaller server
/// window than 15 bits (the compressor's), or has unknown or repeated parameters, is skipped.
pub(crate) fn negotiate(headers: &HeaderMap) -> Option<&'static str> {
    let offers = headers
        .get_all(SEC_WEBSOCKET_EXTENSIONS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for offer in offers {
        let mut parts = offer.split(';').map(str::trim);
        if !parts
            .next()
            .is_some_and(|name| name.eq_ignore_ascii_case("permessage-deflate"))
        {
            continue;
        }
        if let Some(answer) = accept_params(parts) {
            return Some(answer);
        }
    }
    None
}

/// The answer to one permessage-deflate offer's parameters, or `None` to decline it.
fn accept_params<'a>(params: impl Iterator<Item = &'a str>) -> Option<&'static str> {
    let mut seen: Vec<String> = Vec::new();
    let mut server_bits_15 = false;
    for param in params {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        let name = name.to_ascii_lowercase();
        if seen.contains(&name) {
            return None;
        }
        let bits_ok = |v: Option<&str>| {
            v.and_then(|v| v.parse::<u8>().ok())
                .is_some_and(|b| (8..=15).contains(&b))
        };
        match name.as_str() {
            "server_no_context_takeover" | "client_no_context_takeover" if value.is_none() => {}
            // The client's window: Herald inflates with a 15-bit window, which reads any.
            "client_max_window_bits" if value.is_none() || bits_ok(value) => {}
            // The server's window: only 15 bits, the compressor's.
            "server_max_window_bits" if value == Some("15") => server_bits_15 = true,
            "server_max_window_bits" if bits_ok(value) => return None,
            _ => return None,
        }
        seen.push(name);
    }
    Some(match server_bits_15 {
        true => "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15",
        false => ACCEPTED,
    })
}

/// Recently compressed shared frames: (the frame, its deflated bytes), and the slot to fill next.
/// Holding the frame keeps its allocation alive, so an equal pointer and length mean the same
/// bytes.
type Cache = (usize, [Option<(Bytes, Bytes)>; CACHE_SLOTS]);

thread_local! {
    static CACHE: RefCell<Cache> = const { RefCell::new((0, [const { None }; CACHE_SLOTS])) };
}

/// A text message for `frame`: compressed when `compress` (the connection negotiated it) and the
/// frame is long enough. `shared` says the frame's bytes were handed to other connections too
/// (a publication's frame): its compressed form is then cached for them.
pub(crate) fn text(frame: Bytes, compress: bool, shared: bool) -> Message {
    if !compress || frame.len() < MIN_BYTES {
        return Message::text(Payload::from(frame));
    }
    if !shared {
        return Message::deflated_text(tokio_websockets::deflate(&frame));
    }
    let same = |cached: &Bytes| cached.as_ptr() == frame.as_ptr() && cached.len() == frame.len();
    let hit = CACHE.with_borrow(|(_, slots)| {
        slots
            .iter()
            .flatten()
            .find(|(f, _)| same(f))
            .map(|(_, d)| d.clone())
    });
    let deflated = match hit {
        Some(d) => d,
        None => {
            let d = tokio_websockets::deflate(&frame);
            CACHE.with_borrow_mut(|(next, slots)| {
                slots[*next] = Some((frame, d.clone()));
                *next = (*next + 1) % CACHE_SLOTS;
            });
            d
        }
    };
    Message::deflated_text(deflated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn offer(values: &[&str]) -> Option<&'static str> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(SEC_WEBSOCKET_EXTENSIONS, HeaderValue::from_str(v).unwrap());
        }
        negotiate(&h)
    }

    #[test]
    fn offers() {
        assert_eq!(offer(&[]), None);
        assert_eq!(offer(&["x-webkit-deflate-frame"]), None);
        // What browsers and Node's `ws` send.
        assert_eq!(
            offer(&["permessage-deflate; client_max_window_bits"]),
            Some(ACCEPTED)
        );
        assert_eq!(offer(&["permessage-deflate"]), Some(ACCEPTED));
        assert_eq!(
            offer(&["permessage-deflate; server_max_window_bits=10, permessage-deflate"]),
            Some(ACCEPTED)
        );
        assert_eq!(
            offer(&["permessage-deflate; server_max_window_bits=10"]),
            None
        );
        assert!(offer(&["permessage-deflate; server_max_window_bits=15"])
            .is_some_and(|a| a.ends_with("server_max_window_bits=15")));
        assert_eq!(
            offer(&["permessage-deflate; client_max_window_bits=16"]),
            None
        );
        assert_eq!(offer(&["permessage-deflate; mystery"]), None);
        assert_eq!(
            offer(&["permessage-deflate; client_no_context_takeover; client_no_context_takeover"]),
            None
        );
        assert_eq!(offer(&["foo", "permessage-deflate"]), Some(ACCEPTED));
    }

    #[test]
    fn shared_frames_are_compressed_once() {
        let frame = Bytes::from("{\"push\":\"pub\",\"data\":\"x\"}".repeat(20));
        let a = text(frame.clone(), true, true);
        let b = text(frame.clone(), true, true);
        assert!(a.as_payload().as_ptr() == b.as_payload().as_ptr());
        // Equal bytes in another allocation are another frame.
        let other = Bytes::from(frame.to_vec());
        let c = text(other, true, true);
        assert!(c.as_payload().as_ptr() != a.as_payload().as_ptr());
        assert_eq!(&c.as_payload()[..], &a.as_payload()[..]);
        // Short or not negotiated: sent as they are.
        assert_eq!(
            text(Bytes::from_static(b"{}"), true, true)
                .as_payload()
                .len(),
            2
        );
        assert_eq!(
            text(frame.clone(), false, true).as_payload().len(),
            frame.len()
        );
    }

    #[test]
    fn deflate_round_trips_and_bounds() {
        use tokio_websockets::deflate::{inflate, InflateError};
        let json = "{\"channel\":\"news\",\"data\":\"hello hello hello\"}".repeat(500);
        let packed = tokio_websockets::deflate(json.as_bytes());
        assert!(packed.len() < json.len() / 10);
        assert_eq!(inflate(&packed, usize::MAX).unwrap(), json.as_bytes());
        assert_eq!(inflate(&tokio_websockets::deflate(b""), 10).unwrap(), b"");
        // Incompressible data (xorshift), far larger than the first output buffer.
        let mut x: u32 = 1;
        let noise: Vec<u8> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect();
        assert_eq!(
            inflate(&tokio_websockets::deflate(&noise), noise.len()).unwrap(),
            noise
        );
        // A bomb stops at the limit.
        let bomb = tokio_websockets::deflate(&vec![b'a'; 10 * 1024 * 1024]);
        assert!(bomb.len() < 64 * 1024);
        assert_eq!(inflate(&bomb, 1024 * 1024), Err(InflateError::TooLong));
        let exact = tokio_websockets::deflate(&[b'a'; 1000]);
        assert_eq!(inflate(&exact, 1000).unwrap().len(), 1000);
        assert_eq!(inflate(&exact, 999), Err(InflateError::TooLong));
        assert_eq!(
            inflate(&[0xff, 0xff, 0xff], 1000),
            Err(InflateError::Corrupt)
        );
    }
}
