//! Connecting to NATS: the client's options (name, timeouts, reconnect pacing, credentials,
//! TLS), the connection to the configured servers, the JetStream context, and the streams Herald
//! needs (created or grown before the broker is used).

use std::sync::Arc;
use std::time::Duration;

use async_nats::{jetstream, Client, ConnectOptions, Event};
use herald_broker::BrokerError;
use tokio::sync::mpsc;
use tracing::info;

use crate::config::{redact_url, NatsConfig};
use crate::metrics::{inc, Metrics};
use crate::streams::Streams;

/// Connect as `node`, then create or update the streams. Connection events go to `events`.
pub(crate) async fn connect(
    config: &NatsConfig,
    node: &str,
    metrics: Arc<Metrics>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<(Client, jetstream::Context, Streams), BrokerError> {
    let options = connect_options(config, node, metrics.clone(), events).await?;
    let urls = if config.urls.is_empty() {
        vec!["nats://127.0.0.1:4222".to_owned()]
    } else {
        config.urls.clone()
    };
    let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
    let addrs = urls
        .iter()
        .map(|u| u.parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            BrokerError::internal(format!("bad NATS url in {shown:?}: {e}")).caused_by(e)
        })?;
    let client = options.connect(addrs).await.map_err(|e| {
        BrokerError::unavailable(format!("connect to NATS {shown:?}: {e}")).caused_by(e)
    })?;
    metrics.connected.set(1);
    let mut js = match &config.jetstream_domain {
        Some(domain) => jetstream::with_domain(client.clone(), domain),
        None => jetstream::new(client.clone()),
    };
    js.set_timeout(config.request_timeout());
    let streams = Streams::new(js.clone(), config)?;
    streams.ensure().await?;
    info!(urls = ?shown, %node, stream = %config.stream, "connected to NATS");
    Ok((client, js, streams))
}

async fn connect_options(
    config: &NatsConfig,
    node: &str,
    metrics: Arc<Metrics>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<ConnectOptions, BrokerError> {
    let max_delay = Duration::from_millis(config.reconnect_max_delay_ms.max(10));
    let mut options = ConnectOptions::new()
        .name(format!("herald-{node}"))
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms.max(100)))
        .request_timeout(Some(config.request_timeout()))
        .max_reconnects(None)
        .ping_interval(Duration::from_secs(config.ping_interval_s.max(1)))
        .reconnect_delay_callback(move |attempts| {
            let exp = Duration::from_millis(50u64 << attempts.min(10));
            exp.min(max_delay)
        })
        .event_callback(move |event| {
            match &event {
                Event::Connected => {
                    metrics.connected.set(1);
                }
                Event::Disconnected => {
                    metrics.connected.set(0);
                    inc(&metrics.disconnects);
                }
                Event::SlowConsumer(_) => inc(&metrics.slow_consumer_events),
                _ => {}
            }
            let _ = events.send(event);
            async {}
        });
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(seed) = &config.nkey_seed {
        options = options.nkey(seed.clone());
    }
    if let Some(path) = &config.creds_file {
        options = options.credentials_file(path).await.map_err(|e| {
            BrokerError::internal(format!("creds_file {}: {e}", path.display())).caused_by(e)
        })?;
    }
    if config.tls_required {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        (None, None) => {}
        _ => {
            return Err(BrokerError::internal(
                "tls_cert_file and tls_key_file go together",
            ))
        }
    }
    Ok(options)
}
