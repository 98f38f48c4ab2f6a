//! Connecting to NATS: the client's options (name, timeouts, reconnect pacing, credentials,
//! TLS), the connection to the configured servers, the JetStream context, and the streams Herald
//! needs (created or grown before the broker is used).

use std::sync::Arc;
use std::time::Duration;

use async_nats::{jetstream, Client, ConnectOptions, Event};
use herald_broker::{Backoff, BrokerError};
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
    let (addrs, in_urls) = split_credentials(&urls, &shown)?;
    let options = match in_urls {
        // Set in the config, they win over the URLs' (as `[redis]` does).
        _ if config.user.is_some() || config.token.is_some() => options,
        Some(UrlAuth::UserPassword(user, password)) => options.user_and_password(user, password),
        Some(UrlAuth::Token(token)) => options.token(token),
        None => options,
    };
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

/// Credentials taken from a server URL's `user:pass@` (or `token@`).
#[derive(Debug, PartialEq, Eq)]
enum UrlAuth {
    UserPassword(String, String),
    Token(String),
}

/// The server addresses *without* their credentials, and the credentials they carried. The
/// client library ignores credentials in URLs (the server then answers "authorization
/// violation") and prints its server addresses in its debug logs, so they are handed over
/// separately and never stay in an address. Every URL that carries credentials must carry the
/// same ones. `shown` are the URLs redacted, for errors.
fn split_credentials(
    urls: &[String],
    shown: &[String],
) -> Result<(Vec<async_nats::ServerAddr>, Option<UrlAuth>), BrokerError> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut auth = None;
    let mut addrs = Vec::with_capacity(urls.len());
    for (url, shown_url) in urls.iter().zip(shown) {
        let bad = |why: String| BrokerError::internal(format!("bad NATS url {shown_url}: {why}"));
        let addr = url
            .parse::<async_nats::ServerAddr>()
            .map_err(|e| bad(e.to_string()))?;
        let mut plain = addr.into_inner();
        let found = match (plain.username(), plain.password()) {
            ("", None) => None,
            (user, Some(password)) => Some(UrlAuth::UserPassword(decode(user), decode(password))),
            (token, None) => Some(UrlAuth::Token(decode(token))),
        };
        if let Some(found) = found {
            if auth.as_ref().is_some_and(|a| *a != found) {
                return Err(bad("the URLs carry different credentials".into()));
            }
            auth = Some(found);
            plain
                .set_username("")
                .and_then(|()| plain.set_password(None))
                .map_err(|()| bad("cannot remove its credentials".into()))?;
        }
        addrs.push(async_nats::ServerAddr::from_url(plain).map_err(|e| bad(e.to_string()))?);
    }
    Ok((addrs, auth))
}

async fn connect_options(
    config: &NatsConfig,
    node: &str,
    metrics: Arc<Metrics>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<ConnectOptions, BrokerError> {
    // 50 ms doubling on each failed attempt up to reconnect_max_delay_ms.
    let max_delay = Duration::from_millis(config.reconnect_max_delay_ms.max(10));
    let backoff = Backoff::new(Duration::from_millis(50).min(max_delay), max_delay).exact();
    let mut options = ConnectOptions::new()
        .name(format!("herald-{node}"))
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms.max(100)))
        .request_timeout(Some(config.request_timeout()))
        .max_reconnects(None)
        .ping_interval(Duration::from_secs(config.ping_interval_s.max(1)))
        .reconnect_delay_callback(move |attempts| {
            backoff.delay_for_attempt(u32::try_from(attempts).unwrap_or(u32::MAX))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn split(urls: &[&str]) -> Result<(Vec<String>, Option<UrlAuth>), BrokerError> {
        let urls: Vec<String> = urls.iter().map(|u| (*u).to_owned()).collect();
        let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
        let (addrs, auth) = split_credentials(&urls, &shown)?;
        Ok((
            addrs.iter().map(|a| a.as_url_str().to_owned()).collect(),
            auth,
        ))
    }

    #[test]
    fn credentials_leave_the_urls() {
        let (addrs, auth) = split(&["nats://bob:p%40ss@h1:4222", "nats://h2:4222"]).unwrap();
        assert_eq!(addrs, ["nats://h1:4222", "nats://h2:4222"]);
        assert_eq!(
            auth,
            Some(UrlAuth::UserPassword("bob".into(), "p@ss".into()))
        );
        let (addrs, auth) = split(&["nats://tok@h1:4222"]).unwrap();
        assert_eq!(addrs, ["nats://h1:4222"]);
        assert_eq!(auth, Some(UrlAuth::Token("tok".into())));
        assert_eq!(split(&["nats://h1"]).unwrap().1, None);
    }

    #[test]
    fn different_credentials_in_two_urls_are_refused_without_showing_them() {
        let err = split(&["nats://a:one@h1:4222", "nats://a:two@h2:4222"]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("different credentials"), "{text}");
        assert!(!text.contains("two") || text.contains("***"), "{text}");
    }
}
