//! Distributed tracing of a publication (OpenTelemetry): the W3C `traceparent` text that carries
//! a span's context from the API request through the broker to every node, and the names the
//! spans share.
//!
//! Spans are made through the process's global tracer provider, which the server installs only
//! when `[tracing]` is configured: without it they are no-ops, and publications carry no
//! `traceparent`, so receiving nodes never reach this code.

use std::sync::atomic::{AtomicUsize, Ordering};

use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::KeyValue;

/// The instrumentation scope every Herald span is made under.
pub const TRACER_NAME: &str = "herald";

/// How many connections of each traced fan-out get a `write` span (`tracing.write_spans`).
static WRITE_SPANS: AtomicUsize = AtomicUsize::new(DEFAULT_WRITE_SPANS);

/// `tracing.write_spans` when not set.
pub const DEFAULT_WRITE_SPANS: usize = 1;

/// Set how many connections of each traced fan-out get a `write` span (the server does, from
/// `[tracing]`, before it serves).
pub fn set_write_spans(n: usize) {
    WRITE_SPANS.store(n, Ordering::Relaxed);
}

/// How many connections of each traced fan-out get a `write` span.
pub fn write_spans() -> usize {
    WRITE_SPANS.load(Ordering::Relaxed)
}

/// The `write` span of one traced publication's frame in a connection's outbound queue, from
/// the moment it is queued until the write that carries it reaches the socket. Held by the queue
/// (boxed: an untraced connection pays one empty pointer), one at a time per connection.
pub struct TracedWrite {
    span: BoxedSpan,
    /// A writer took the frame from the queue (it is in the write under way).
    taken: bool,
}

impl TracedWrite {
    /// Watch the write of a frame just queued.
    pub fn new(span: BoxedSpan) -> Box<Self> {
        Box::new(TracedWrite { span, taken: false })
    }

    /// A writer took the queued frames, this one among them.
    pub(crate) fn take(&mut self) {
        self.taken = true;
    }

    /// The write failed to take them (they are back in the queue).
    pub(crate) fn put_back(&mut self) {
        self.taken = false;
    }

    /// Whether the frame is in the write under way.
    pub(crate) fn taken(&self) -> bool {
        self.taken
    }

    /// The frame reached the socket, written by the fan-out itself (`"direct"`) or by the
    /// connection's task (`"task"`).
    pub(crate) fn written(mut self, by: &'static str) {
        self.span
            .set_attribute(KeyValue::new("herald.write.by", by));
        self.span.end();
    }

    /// The frame never will: the queue was closed and freed (`why`).
    pub(crate) fn dropped(mut self, why: &'static str) {
        self.span.set_status(Status::error(why));
        self.span.end();
    }
}

/// A W3C `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`) as a remote span
/// context, or `None` if it is not one (wrong version, length, characters, or all-zero ids).
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    // Version 00 has exactly four fields; a later version may add fields after the flags.
    if !lower_hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if !lower_hex(trace_id, 32) || !lower_hex(span_id, 16) || !lower_hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// The `traceparent` of a span context (version 00).
pub fn format_traceparent(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_roundtrip() {
        let context = parse_traceparent(EXAMPLE).expect("valid");
        assert!(context.is_remote() && context.is_sampled());
        assert_eq!(
            context.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(format_traceparent(&context), EXAMPLE);
        let unsampled = parse_traceparent(&EXAMPLE.replace("-01", "-00")).unwrap();
        assert!(!unsampled.is_sampled());
    }

    #[test]
    fn refuses_what_is_not_a_traceparent() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
        // A later version may append fields.
        assert!(parse_traceparent(&format!("01{}-what", &EXAMPLE[2..])).is_some());
    }
}
