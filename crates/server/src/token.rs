//! `herald token`: mint an HS256 connection or subscription token, for development and scripts.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Map, Value};

/// What to put in the token.
#[derive(Debug, Clone, Default)]
pub struct TokenRequest {
    /// `sub`
    pub sub: String,
    /// Seconds until `exp` (none: no expiry).
    pub expires_in: Option<u64>,
    /// Connection token `channels`.
    pub channels: Vec<String>,
    /// Subscription token `channel`.
    pub channel: Option<String>,
    /// `info` as JSON text.
    pub info: Option<String>,
}

/// Sign the claims with the HS256 secret.
pub fn mint(secret: &str, req: &TokenRequest) -> anyhow::Result<String> {
    let mut claims = Map::new();
    claims.insert("sub".into(), json!(req.sub));
    if let Some(secs) = req.expires_in {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        claims.insert("exp".into(), json!(now + secs));
    }
    if !req.channels.is_empty() {
        claims.insert("channels".into(), json!(req.channels));
    }
    if let Some(channel) = &req.channel {
        claims.insert("channel".into(), json!(channel));
    }
    if let Some(info) = &req.info {
        let value: Value =
            serde_json::from_str(info).map_err(|e| anyhow::anyhow!("--info is not JSON: {e}"))?;
        claims.insert("info".into(), value);
    }
    Ok(encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )?)
}
