//! Signing keys fetched from a JWKS URL (`token_jwks_url`), so an identity provider can rotate
//! its keys without a Herald restart.
//!
//! Keys are cached. A token naming a `kid` the cache lacks triggers one refresh (single-flight:
//! concurrent tokens wait for the same fetch), at most once per `token_jwks_min_refresh_ms`, so a
//! flood of tokens with made-up `kid`s costs the provider one request per interval. The whole set
//! is also refetched when older than `token_jwks_max_age_s`, which is how a removed (revoked) key
//! stops being accepted. When the provider is unreachable the last good set stays in use.
//!
//! Bounds: the answer is read up to [`MAX_BODY_BYTES`] within [`FETCH_TIMEOUT`]; at most
//! [`MAX_KEYS`] usable keys are kept. Only RSA (RS256) and P-256 (ES256) keys with a `kid` are
//! used; others are skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};

use herald_core::auth::{AuthError, KeySet};

/// Largest JWKS document read.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Longest wait for the JWKS document.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Most keys kept from one document.
pub const MAX_KEYS: usize = 64;

/// One usable key: the algorithm it verifies and the key itself.
#[derive(Clone)]
struct Key {
    alg: Algorithm,
    key: Arc<DecodingKey>,
}

#[derive(Default)]
struct Cached {
    keys: HashMap<String, Key>,
    fetched_at: Option<Instant>,
}

/// The JWKS cache of one node.
pub struct Jwks {
    url: String,
    client: reqwest::Client,
    max_age: Duration,
    min_refresh: Duration,
    cached: RwLock<Cached>,
    /// Held while fetching; holds when the last fetch was tried.
    fetching: Mutex<Option<Instant>>,
}

/// The HTTP client for the key set cannot be built (no TLS roots, say): the node does not start.
#[derive(Debug, thiserror::Error)]
#[error("JWKS client: {0}")]
pub struct ClientError(reqwest::Error);

impl Jwks {
    /// A cache for `url`, empty until the first token asks for a key.
    pub fn new(url: String, max_age: Duration, min_refresh: Duration) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(ClientError)?;
        Ok(Jwks {
            url,
            client,
            max_age,
            min_refresh,
            cached: RwLock::default(),
            fetching: Mutex::default(),
        })
    }

    /// Fetch the set unless another task did since `seen`, or the last try is too recent.
    async fn refresh(&self, seen: Option<Instant>) {
        let mut last_try = self.fetching.lock().await;
        if self.cached.read().await.fetched_at != seen {
            return; // refreshed while this task waited
        }
        if last_try.is_some_and(|t| t.elapsed() < self.min_refresh) {
            return;
        }
        *last_try = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => {
                tracing::debug!(url = %self.url, keys = keys.len(), "JWKS loaded");
                *self.cached.write().await = Cached {
                    keys,
                    fetched_at: Some(Instant::now()),
                };
            }
            // Keep the last good set: a provider outage must not log everyone out.
            Err(cause) => tracing::warn!(url = %self.url, %cause, "JWKS refresh failed"),
        }
    }

    async fn fetch(&self) -> Result<HashMap<String, Key>, String> {
        let mut response = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| format!("request: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(format!("document over {MAX_BODY_BYTES} bytes"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("body: {e}"))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(format!("document over {MAX_BODY_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let set: JwkSet =
            serde_json::from_slice(&body).map_err(|e| format!("not a JWK set: {e}"))?;
        Ok(usable_keys(&set))
    }
}

#[async_trait::async_trait]
impl KeySet for Jwks {
    async fn key(&self, kid: &str, alg: Algorithm) -> Result<Arc<DecodingKey>, AuthError> {
        let seen = {
            let cached = self.cached.read().await;
            let fresh = cached
                .fetched_at
                .is_some_and(|at| at.elapsed() < self.max_age);
            if fresh {
                if let Some(k) = cached.keys.get(kid) {
                    return matching(k, alg);
                }
            }
            cached.fetched_at
        };
        self.refresh(seen).await;
        let cached = self.cached.read().await;
        match cached.keys.get(kid) {
            Some(k) => matching(k, alg),
            None => Err(AuthError::Invalid("unknown signing key (kid)".into())),
        }
    }
}

fn matching(k: &Key, alg: Algorithm) -> Result<Arc<DecodingKey>, AuthError> {
    if k.alg == alg {
        Ok(k.key.clone())
    } else {
        Err(AuthError::Invalid(
            "algorithm does not match the key".into(),
        ))
    }
}

/// The keys of `set` Herald can verify with, by `kid`.
fn usable_keys(set: &JwkSet) -> HashMap<String, Key> {
    let mut keys = HashMap::new();
    for jwk in &set.keys {
        if keys.len() >= MAX_KEYS {
            break;
        }
        let Some(kid) = &jwk.common.key_id else {
            continue;
        };
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            _ => continue,
        };
        let declared_ok = match jwk.common.key_algorithm {
            None => true,
            Some(KeyAlgorithm::RS256) => alg == Algorithm::RS256,
            Some(KeyAlgorithm::ES256) => alg == Algorithm::ES256,
            Some(_) => false,
        };
        if !declared_ok {
            continue;
        }
        if let Ok(key) = DecodingKey::from_jwk(jwk) {
            keys.insert(
                kid.clone(),
                Key {
                    alg,
                    key: Arc::new(key),
                },
            );
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_herald_can_use_are_kept() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r1", "n": "sXch", "e": "AQAB", "alg": "RS256"},
            {"kty": "RSA", "n": "sXch", "e": "AQAB"},
            {"kty": "RSA", "kid": "r2", "n": "sXch", "e": "AQAB", "alg": "RS512"},
            {"kty": "EC", "kid": "e1", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "oct", "kid": "o1", "k": "c2VjcmV0"},
        ]}))
        .unwrap();
        let keys = usable_keys(&set);
        let mut kids: Vec<_> = keys.keys().cloned().collect();
        kids.sort();
        assert_eq!(kids, ["e1", "r1"]);
        assert_eq!(keys["r1"].alg, Algorithm::RS256);
        assert_eq!(keys["e1"].alg, Algorithm::ES256);
        assert!(matching(&keys["r1"], Algorithm::ES256).is_err());
    }
}
