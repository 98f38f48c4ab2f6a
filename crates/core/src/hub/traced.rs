//! The `fanout` span of a traced publication: a child of the publishing node's broker span,
//! made on every node that receives the publication.

use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer};
use opentelemetry::{global, Context, KeyValue};

use super::*;
use crate::trace::{parse_traceparent, TRACER_NAME};

impl Hub {
    /// [`deliver`](Hub::deliver) under a `fanout` span whose parent is `traceparent` (the
    /// publishing node's `broker.publish` span), with the channel, this node's name and the
    /// channel's local subscriber count. A `traceparent` that does not parse is ignored.
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
        let mut span = tracer
            .span_builder("fanout")
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("messaging.destination.name", channel.to_owned()),
                KeyValue::new("herald.node", self.node_name().to_owned()),
                KeyValue::new("herald.offset", publication.offset as i64),
            ])
            .start_with_context(&tracer, &parent);
        self.deliver(channel, epoch, publication);
        let subscribers = self
            .shard(channel)
            .lock()
            .expect("hub lock")
            .get(channel)
            .map_or(0, |ch| ch.subscribers.len());
        opentelemetry::trace::Span::set_attribute(
            &mut span,
            KeyValue::new("herald.subscribers", subscribers as i64),
        );
        opentelemetry::trace::Span::end(&mut span);
    }
}
