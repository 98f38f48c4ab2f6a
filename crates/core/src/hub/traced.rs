//! The spans of a traced publication on a receiving node: `fanout`, a child of the publishing
//! node's broker span, made on every node that receives the publication, and under it a `write`
//! span for each of the first few connections the frame is queued for (`tracing.write_spans`),
//! from queuing to the write that reaches the socket.
//!
//! The fan-out loop finds the `write` spans' sampler in a thread-local that only
//! [`deliver_traced`](Hub::deliver_traced) fills, around its synchronous delivery: untraced
//! deliveries keep their signatures and pay one thread-local read per publication.

use std::cell::RefCell;

use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer};
use opentelemetry::{global, Context, KeyValue};

use super::*;
use crate::trace::{parse_traceparent, write_spans, TracedWrite, TRACER_NAME};

thread_local! {
    /// The `write` span sampler of the traced delivery under way on this thread, if any.
    static WRITE_SAMPLER: RefCell<Option<WriteSampler>> = const { RefCell::new(None) };
}

/// Makes the `write` spans of one traced fan-out, up to its budget.
pub(super) struct WriteSampler {
    /// The context of the node's `fanout` span.
    parent: Context,
    channel: Arc<str>,
    node: Arc<str>,
    /// Spans still to make.
    left: usize,
    /// Spans made.
    made: usize,
}

impl WriteSampler {
    /// Whether the next connection gets a span.
    pub(super) fn wants_more(&self) -> bool {
        self.left > 0
    }

    /// The next connection's `write` span (called by its queue only if it makes one).
    pub(super) fn span(&mut self) -> Box<TracedWrite> {
        self.left -= 1;
        self.made += 1;
        let tracer = global::tracer(TRACER_NAME);
        let span = tracer
            .span_builder("write")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("messaging.destination.name", self.channel.to_string()),
                KeyValue::new("herald.node", self.node.to_string()),
            ])
            .start_with_context(&tracer, &self.parent);
        TracedWrite::new(span)
    }
}

/// The sampler of the traced delivery under way on this thread (`None` for any other delivery).
pub(super) fn take_write_sampler() -> Option<WriteSampler> {
    WRITE_SAMPLER.with(|s| s.borrow_mut().take())
}

/// Give the sampler back after the fan-out loop, for the count of spans it made.
pub(super) fn return_write_sampler(sampler: WriteSampler) {
    WRITE_SAMPLER.with(|s| *s.borrow_mut() = Some(sampler));
}

impl Hub {
    /// [`deliver`](Hub::deliver) under a `fanout` span whose parent is `traceparent` (the
    /// publishing node's `broker.publish` span), with the channel, this node's name, the
    /// channel's local subscriber count and the number of `write` spans made under it. A
    /// `traceparent` that does not parse is ignored.
    pub fn deliver_traced(
        &self,
        channel: &str,
        epoch: &str,
        publication: Publication,
        traceparent: &str,
    ) {
        let Some(parent) = parse_traceparent(traceparent) else {
            return self.deliver(channel, epoch, publication);
        };
        let tracer = global::tracer(TRACER_NAME);
        let parent = Context::new().with_remote_span_context(parent);
        let span = tracer
            .span_builder("fanout")
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("messaging.destination.name", channel.to_owned()),
                KeyValue::new("herald.node", self.node_name().to_owned()),
                KeyValue::new("herald.offset", publication.offset as i64),
            ])
            .start_with_context(&tracer, &parent);
        let fanout = parent.with_span(span);
        let budget = write_spans();
        if budget > 0 && fanout.span().span_context().is_sampled() {
            WRITE_SAMPLER.with(|s| {
                *s.borrow_mut() = Some(WriteSampler {
                    parent: fanout.clone(),
                    channel: Arc::from(channel),
                    node: Arc::from(self.node_name()),
                    left: budget,
                    made: 0,
                })
            });
        }
        self.deliver(channel, epoch, publication);
        let writes = take_write_sampler().map_or(0, |s| s.made);
        let subscribers = self
            .shard(channel)
            .lock()
            .expect("hub lock")
            .get(channel)
            .map_or(0, |ch| ch.subscribers.len());
        let span = fanout.span();
        span.set_attribute(KeyValue::new("herald.subscribers", subscribers as i64));
        span.set_attribute(KeyValue::new("herald.write_spans", writes as i64));
        span.end();
    }
}
