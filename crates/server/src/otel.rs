//! OpenTelemetry tracing of publications (`[tracing]`, off by default): spans exported over
//! OTLP/HTTP (protobuf) by a batch processor on its own thread.
//!
//! An API publish makes a `publish` span (a child of the request's `traceparent` when it has one)
//! and under it a `broker.publish` span around the broker round trip; a sampled publication
//! carries that span's `traceparent` through the broker, and every node that receives it makes a
//! `fanout` span under it (`herald_core::hub`), and `write` spans under that for the first
//! `write_spans` connections the frame is queued for. Off, a request costs one relaxed atomic load
//! ([`enabled`]) and publications carry nothing extra.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context as _};
use herald_core::trace::{format_traceparent, parse_traceparent, TRACER_NAME};
use hyper::HeaderMap;
use opentelemetry::trace::{Span, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{global, Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use serde::Deserialize;

/// Whether this process exports spans: set once at start by [`Tracing::start`].
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether `[tracing]` is on in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// `[tracing]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TracingConfig {
    /// The collector's OTLP/HTTP endpoint, e.g. `http://localhost:4318` (`/v1/traces` is
    /// appended unless the URL already ends with it).
    otlp_endpoint: String,
    /// Only `http` (OTLP/HTTP with protobuf bodies).
    #[serde(default = "default_protocol")]
    protocol: String,
    /// The share of publications traced that arrive without a sampled `traceparent`, 0 to 1.
    /// A publish whose `traceparent` is sampled is always traced, one whose is not never is.
    #[serde(default = "default_sample_ratio")]
    sample_ratio: f64,
    /// `service.name` of the spans.
    #[serde(default = "default_service_name")]
    service_name: String,
    /// How many connections of each traced fan-out get a `write` span, 0 to [`MAX_WRITE_SPANS`].
    #[serde(default = "default_write_spans")]
    write_spans: usize,
}

/// The most `write` spans one fan-out makes: a trace stays readable, and a broadcast to many
/// connections never makes a span per connection.
const MAX_WRITE_SPANS: usize = 1000;

fn default_write_spans() -> usize {
    herald_core::trace::DEFAULT_WRITE_SPANS
}

fn default_protocol() -> String {
    "http".into()
}

fn default_sample_ratio() -> f64 {
    1.0
}

fn default_service_name() -> String {
    "herald".into()
}

impl TracingConfig {
    fn parse(raw: &serde_json::Value) -> anyhow::Result<TracingConfig> {
        let cfg: TracingConfig = serde_json::from_value(raw.clone())
            .map_err(|e| anyhow::anyhow!("invalid [tracing] configuration: {e}"))?;
        if cfg.protocol != "http" {
            bail!(
                "tracing.protocol {:?} is not supported: Herald exports OTLP over HTTP (protocol = \"http\", the collector's port 4318)",
                cfg.protocol
            );
        }
        if !(0.0..=1.0).contains(&cfg.sample_ratio) {
            bail!(
                "tracing.sample_ratio must be from 0 to 1, not {}",
                cfg.sample_ratio
            );
        }
        if !(cfg.otlp_endpoint.starts_with("http://") || cfg.otlp_endpoint.starts_with("https://"))
        {
            bail!("tracing.otlp_endpoint must be an http:// or https:// URL");
        }
        if cfg.service_name.is_empty() {
            bail!("tracing.service_name must not be empty");
        }
        if cfg.write_spans > MAX_WRITE_SPANS {
            bail!(
                "tracing.write_spans must be from 0 to {MAX_WRITE_SPANS}, not {}",
                cfg.write_spans
            );
        }
        Ok(cfg)
    }

    /// The URL spans are posted to.
    fn traces_url(&self) -> String {
        let base = self.otlp_endpoint.trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        }
    }
}

/// The installed tracer provider; [`shutdown`](Tracing::shutdown) exports what is left.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Install the exporter if `[tracing]` is configured (`None`: tracing stays off). Fails on
    /// a bad section.
    pub fn start(raw: Option<&serde_json::Value>, node_name: &str) -> anyhow::Result<Option<Self>> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        let cfg = TracingConfig::parse(raw)?;
        let url = cfg.traces_url();
        // The blocking HTTP client owns a runtime of its own, which must not be made or dropped
        // on a Tokio worker: build it on a plain thread.
        let exporter = std::thread::spawn(move || {
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url)
                .build()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("building the OTLP exporter panicked"))?
        .context("tracing.otlp_endpoint")?;
        let resource = Resource::builder()
            .with_service_name(cfg.service_name.clone())
            .with_attribute(KeyValue::new("service.instance.id", node_name.to_owned()))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        global::set_tracer_provider(provider.clone());
        herald_core::trace::set_write_spans(cfg.write_spans);
        ENABLED.store(true, Ordering::Relaxed);
        tracing::info!(
            endpoint = %herald_broker::redact_url(&cfg.otlp_endpoint),
            sample_ratio = cfg.sample_ratio,
            write_spans = cfg.write_spans,
            "tracing publications over OTLP/HTTP"
        );
        Ok(Some(Tracing { provider }))
    }

    /// Export the spans still queued and stop (on a plain thread, like the client's start).
    pub fn shutdown(self) {
        let provider = self.provider;
        let _ = std::thread::spawn(move || {
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "tracing shutdown");
            }
        })
        .join();
    }
}

/// Why a request's `traceparent` header was refused (error 107 in the API).
pub const BAD_TRACEPARENT: &str =
    "the traceparent header is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)";

/// The parent an API request names in its `traceparent` header: the empty context when it has
/// none, [`BAD_TRACEPARENT`] when it has one that is not a W3C traceparent.
pub fn request_parent(headers: &HeaderMap) -> Result<Context, &'static str> {
    let Some(value) = headers.get("traceparent") else {
        return Ok(Context::new());
    };
    match value.to_str().ok().and_then(parse_traceparent) {
        Some(remote) => Ok(Context::new().with_remote_span_context(remote)),
        None => Err(BAD_TRACEPARENT),
    }
}

/// The spans of one API publish or broadcast: `publish`, and `broker.publish` under it.
pub struct PublishSpans {
    publish: Context,
    broker: global::BoxedSpan,
}

impl PublishSpans {
    /// Start both spans under `parent`, for `channels`, on this node.
    pub fn start(
        parent: &Context,
        endpoint: &'static str,
        channels: &[String],
        node: &str,
    ) -> Self {
        let tracer = global::tracer(TRACER_NAME);
        // One channel is named; a broadcast (up to 100,000 channels) is only counted.
        let target = match channels {
            [one] => KeyValue::new("messaging.destination.name", one.clone()),
            many => KeyValue::new("herald.channels", many.len() as i64),
        };
        let publish = tracer
            .span_builder("publish")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.route", endpoint),
                target.clone(),
                KeyValue::new("herald.node", node.to_owned()),
            ])
            .start_with_context(&tracer, parent);
        let publish = parent.with_span(publish);
        let broker = tracer
            .span_builder("broker.publish")
            .with_kind(SpanKind::Producer)
            .with_attributes([target, KeyValue::new("herald.node", node.to_owned())])
            .start_with_context(&tracer, &publish);
        PublishSpans { publish, broker }
    }

    /// What the publication carries through the broker: the `broker.publish` span's context, if
    /// it is sampled (an unsampled publication carries nothing).
    pub fn traceparent(&self) -> Option<String> {
        let context = self.broker.span_context();
        context.is_sampled().then(|| format_traceparent(context))
    }

    /// End both spans, marking an error with its message.
    pub fn end(mut self, error: Option<&str>) {
        if let Some(message) = error {
            let status = opentelemetry::trace::Status::error(message.to_owned());
            self.broker.set_status(status.clone());
            self.publish.span().set_status(status);
        }
        self.broker.end();
        self.publish.span().end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_section_and_refuses_bad_values() {
        let cfg =
            TracingConfig::parse(&serde_json::json!({"otlp_endpoint": "http://c:4318"})).unwrap();
        assert_eq!(cfg.traces_url(), "http://c:4318/v1/traces");
        assert_eq!((cfg.protocol.as_str(), cfg.sample_ratio), ("http", 1.0));
        assert_eq!(cfg.write_spans, 1);
        let full = TracingConfig::parse(
            &serde_json::json!({"otlp_endpoint": "https://c/v1/traces/", "sample_ratio": 0.25}),
        )
        .unwrap();
        assert_eq!(full.traces_url(), "https://c/v1/traces");
        for (bad, says) in [
            (serde_json::json!({}), "otlp_endpoint"),
            (
                serde_json::json!({"otlp_endpoint": "http://c", "protocol": "grpc"}),
                "grpc",
            ),
            (
                serde_json::json!({"otlp_endpoint": "http://c", "sample_ratio": 2}),
                "sample_ratio",
            ),
            (serde_json::json!({"otlp_endpoint": "c:4318"}), "http://"),
            (
                serde_json::json!({"otlp_endpoint": "http://c", "extra": 1}),
                "extra",
            ),
            (
                serde_json::json!({"otlp_endpoint": "http://c", "service_name": ""}),
                "service_name",
            ),
            (
                serde_json::json!({"otlp_endpoint": "http://c", "write_spans": 1001}),
                "write_spans",
            ),
        ] {
            let e = TracingConfig::parse(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
