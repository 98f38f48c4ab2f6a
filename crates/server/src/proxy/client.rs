//! Calls to the application's backend: one shared HTTP client (connections are pooled and
//! reused), at most `proxy.max_connections` calls in flight, a deadline per call, and a bounded
//! answer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use herald_core::config::ProxyConfig;
use herald_core::proxy::{Proxy, ProxyError, Target};

/// The backend of one node, as configured in `[proxy]`.
pub struct HttpProxy {
    client: reqwest::Client,
    config: ProxyConfig,
    /// One permit per call in flight. An HTTP/1.1 connection carries one call at a time, so
    /// this also bounds the connections open to the backend (the pool keeps no more idle).
    in_flight: Arc<Semaphore>,
}

/// The HTTP client for the hooks cannot be built: the node does not start.
#[derive(Debug, thiserror::Error)]
#[error("proxy client: {0}")]
pub struct ClientError(String);

/// Read a PEM file named by `key`; the error names the key and the path, never the contents.
fn read_pem(key: &str, path: &str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|e| ClientError(format!("{key} {path:?}: {e}")))
}

/// `proxy.tls_*`: extra trusted CAs and the client certificate for `https://` hook URLs.
fn with_tls(
    mut builder: reqwest::ClientBuilder,
    config: &ProxyConfig,
) -> Result<reqwest::ClientBuilder, ClientError> {
    if !config.tls_ca_file.is_empty() {
        let pem = read_pem("proxy.tls_ca_file", &config.tls_ca_file)?;
        let cas = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| ClientError(format!("proxy.tls_ca_file: {e}")))?;
        if cas.is_empty() {
            return Err(ClientError(
                "proxy.tls_ca_file: no PEM certificate in it".into(),
            ));
        }
        for ca in cas {
            builder = builder.add_root_certificate(ca);
        }
    }
    if !config.tls_cert_file.is_empty() {
        let mut pem = read_pem("proxy.tls_cert_file", &config.tls_cert_file)?;
        pem.push(b'\n');
        pem.extend(read_pem("proxy.tls_key_file", &config.tls_key_file)?);
        let identity = reqwest::Identity::from_pem(&pem)
            .map_err(|e| ClientError(format!("proxy.tls_cert_file / proxy.tls_key_file: {e}")))?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

impl HttpProxy {
    /// A client for the configured hooks; nothing is connected until the first call.
    pub fn new(config: &ProxyConfig) -> Result<Self, ClientError> {
        // Each call sets its own timeout (a namespace may have its own); this is the longest.
        let longest = config
            .namespaces
            .iter()
            .filter_map(|n| n.timeout_ms)
            .fold(config.timeout_ms, u64::max);
        let timeout = Duration::from_millis(longest);
        let builder = reqwest::Client::builder()
            // The whole call, connecting and reading the answer included.
            .timeout(timeout)
            .connect_timeout(timeout)
            // A hook answers itself: a redirect is a misconfigured URL, not an answer.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(config.max_connections);
        let client = with_tls(builder, config)?
            .build()
            .map_err(|e| ClientError(e.to_string()))?;
        Ok(HttpProxy {
            client,
            config: config.clone(),
            in_flight: Arc::new(Semaphore::new(config.max_connections)),
        })
    }

    /// The client's headers as HTTP headers of the hook request, with `proxy.http_headers`.
    /// Those that describe Herald's own request (its length, type, host, connection) are left
    /// out: they would break it; the body still has them.
    fn forwarded_headers(&self, target: &Target<'_>) -> reqwest::header::HeaderMap {
        use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
        const OWN: &[&str] = &[
            "host",
            "content-length",
            "content-type",
            "content-encoding",
            "transfer-encoding",
            "connection",
            "keep-alive",
            "upgrade",
            "te",
            "trailer",
            "expect",
            "proxy-connection",
        ];
        let mut map = HeaderMap::new();
        if !self.config.http_headers {
            return map;
        }
        for (name, value) in target.headers {
            if OWN.contains(&name.as_str()) {
                continue;
            }
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                map.insert(n, v);
            }
        }
        map
    }
}

/// Refused or timed out: the backend may be back soon. Anything else that breaks the exchange
/// (a reset mid-answer) is treated the same way: retrying is what helps.
fn transport_error(e: reqwest::Error) -> ProxyError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    ProxyError::Unavailable(format!("{what}: {e}"))
}

#[async_trait::async_trait]
impl Proxy for HttpProxy {
    async fn call(&self, target: &Target<'_>, body: Vec<u8>) -> Result<Vec<u8>, ProxyError> {
        // One deadline for the whole call, the wait for a free connection included.
        let timeout_ms = self.config.hook_timeout_ms(target.namespace);
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let _permit = tokio::time::timeout_at(deadline, self.in_flight.acquire())
            .await
            .map_err(|_| {
                ProxyError::Unavailable(format!(
                    "timed out: all {} backend connections busy (proxy.max_connections)",
                    self.config.max_connections
                ))
            })?
            .expect("the semaphore is never closed");
        let max = self.config.max_response_bytes;
        let binary = self.config.hook_binary(target.namespace);
        let body = match binary {
            true => super::binary::encode_request(body),
            false => body,
        };
        let mut response = self
            .client
            .post(self.config.hook_url(target.hook, target.namespace))
            .timeout(deadline.saturating_duration_since(Instant::now()))
            .headers(self.forwarded_headers(target))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(transport_error)?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(ProxyError::BadAnswer(format!(
                "status {}",
                response.status()
            )));
        }
        let too_big = || ProxyError::BadAnswer(format!("answer over {max} bytes"));
        if response.content_length().is_some_and(|n| n > max as u64) {
            return Err(too_big());
        }
        let mut answer = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
            if answer.len() + chunk.len() > max {
                return Err(too_big());
            }
            answer.extend_from_slice(&chunk);
        }
        match binary {
            true => super::binary::decode_answer(answer),
            false => Ok(answer),
        }
    }
}
