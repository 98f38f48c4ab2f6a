//! Calls to the application's backend: one shared HTTP client (connections are pooled and
//! reused), at most `proxy.max_connections` calls in flight, a deadline per call, and a bounded
//! answer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use herald_core::config::ProxyConfig;
use herald_core::proxy::{Hook, Proxy, ProxyError};

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
pub struct ClientError(reqwest::Error);

impl HttpProxy {
    /// A client for the configured hooks; nothing is connected until the first call.
    pub fn new(config: &ProxyConfig) -> Result<Self, ClientError> {
        let timeout = Duration::from_millis(config.timeout_ms);
        let client = reqwest::Client::builder()
            // The whole call, connecting and reading the answer included.
            .timeout(timeout)
            .connect_timeout(timeout)
            // A hook answers itself: a redirect is a misconfigured URL, not an answer.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(config.max_connections)
            .build()
            .map_err(ClientError)?;
        Ok(HttpProxy {
            client,
            config: config.clone(),
            in_flight: Arc::new(Semaphore::new(config.max_connections)),
        })
    }

    fn url(&self, hook: Hook) -> &str {
        match hook {
            Hook::Connect => &self.config.connect_url,
            Hook::Refresh => &self.config.refresh_url,
            Hook::Subscribe => &self.config.subscribe_url,
            Hook::SubRefresh => &self.config.sub_refresh_url,
            Hook::Publish => &self.config.publish_url,
            Hook::Rpc => &self.config.rpc_url,
        }
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
    async fn call(&self, hook: Hook, body: Vec<u8>) -> Result<Vec<u8>, ProxyError> {
        // One deadline for the whole call, the wait for a free connection included.
        let deadline = Instant::now() + Duration::from_millis(self.config.timeout_ms);
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
        let mut response = self
            .client
            .post(self.url(hook))
            .timeout(deadline.saturating_duration_since(Instant::now()))
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
        Ok(answer)
    }
}
