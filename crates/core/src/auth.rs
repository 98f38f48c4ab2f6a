//! JWT verification for connection and subscription tokens (HS256, RS256, ES256).

use std::collections::HashSet;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::Config;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The token's `exp` has passed: refresh it.
    #[error("token expired")]
    Expired,
    /// Bad signature, unknown algorithm, malformed claims…
    #[error("invalid token: {0}")]
    Invalid(String),
}

/// Claims of a connection token. A token with a `channel` claim is a subscription token and is
/// refused here, so one kind can never stand in for the other.
#[derive(Debug, Clone, Deserialize)]
pub struct ConnectionClaims {
    /// User id ("" anonymous).
    #[serde(default)]
    pub sub: String,
    /// Expiry, seconds since the UNIX epoch.
    pub exp: Option<u64>,
    /// Channels the server subscribes at connect.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Shown in presence and publications.
    pub info: Option<Box<RawValue>>,
    /// Only subscription tokens carry it.
    #[serde(default)]
    channel: Option<serde::de::IgnoredAny>,
}

/// Claims of a subscription token.
#[derive(Debug, Clone, Deserialize)]
pub struct SubscriptionClaims {
    /// Must equal the connection's user.
    #[serde(default)]
    pub sub: String,
    /// The channel it grants.
    pub channel: String,
    /// Expiry, seconds since the UNIX epoch.
    pub exp: Option<u64>,
}

/// Verifies tokens with the keys from the config.
#[derive(Clone, Default)]
pub struct TokenVerifier {
    hmac: Option<DecodingKey>,
    rsa: Option<DecodingKey>,
    ecdsa: Option<DecodingKey>,
    require_exp: bool,
}

/// A fixed, client-safe reason for a refused token: never the parser's own text.
fn refusal(e: &jsonwebtoken::errors::Error) -> AuthError {
    use jsonwebtoken::errors::ErrorKind;
    let why = match e.kind() {
        ErrorKind::ExpiredSignature => return AuthError::Expired,
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::ImmatureSignature => "token not valid yet (nbf)",
        ErrorKind::MissingRequiredClaim(_) => "a required claim is missing",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAlgorithm => "algorithm does not match the key",
        ErrorKind::Json(_) | ErrorKind::Utf8(_) => "malformed claims",
        _ => "malformed token",
    };
    AuthError::Invalid(why.into())
}

impl TokenVerifier {
    /// Load the keys named in the config.
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let pem = |text: &Option<String>,
                   file: &Option<std::path::PathBuf>|
         -> Result<Option<Vec<u8>>, String> {
            if let Some(t) = text {
                return Ok(Some(t.as_bytes().to_vec()));
            }
            match file {
                Some(path) => std::fs::read(path)
                    .map(Some)
                    .map_err(|e| format!("reading {}: {e}", path.display())),
                None => Ok(None),
            }
        };
        let rsa = pem(
            &config.token_rsa_public_key,
            &config.token_rsa_public_key_file,
        )?
        .map(|p| DecodingKey::from_rsa_pem(&p).map_err(|e| format!("RSA public key: {e}")))
        .transpose()?;
        let ecdsa = pem(
            &config.token_ecdsa_public_key,
            &config.token_ecdsa_public_key_file,
        )?
        .map(|p| DecodingKey::from_ec_pem(&p).map_err(|e| format!("ECDSA public key: {e}")))
        .transpose()?;
        Ok(TokenVerifier {
            hmac: config
                .token_hmac_secret
                .as_ref()
                .filter(|s| !s.is_empty())
                .map(|s| DecodingKey::from_secret(s.as_bytes())),
            rsa,
            ecdsa,
            require_exp: config.token_require_exp,
        })
    }

    /// Whether any key is configured.
    pub fn has_keys(&self) -> bool {
        self.hmac.is_some() || self.rsa.is_some() || self.ecdsa.is_some()
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, token: &str) -> Result<T, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::Invalid("malformed token".into()))?;
        let key = match header.alg {
            Algorithm::HS256 => self.hmac.as_ref(),
            Algorithm::RS256 => self.rsa.as_ref(),
            Algorithm::ES256 => self.ecdsa.as_ref(),
            other => {
                return Err(AuthError::Invalid(format!(
                    "algorithm {other:?} is not accepted"
                )))
            }
        }
        .ok_or_else(|| AuthError::Invalid(format!("no key configured for {:?}", header.alg)))?;
        let mut validation = Validation::new(header.alg);
        validation.required_spec_claims = if self.require_exp {
            HashSet::from(["exp".to_owned()])
        } else {
            HashSet::new()
        };
        validation.validate_exp = true;
        validation.validate_aud = false;
        validation.leeway = 0;
        jsonwebtoken::decode::<T>(token, key, &validation)
            .map(|data| data.claims)
            .map_err(|e| refusal(&e))
    }

    /// Verify a connection token.
    pub fn connection(&self, token: &str) -> Result<ConnectionClaims, AuthError> {
        let claims: ConnectionClaims = self.decode(token)?;
        if claims.channel.is_some() {
            return Err(AuthError::Invalid(
                "a subscription token cannot connect".into(),
            ));
        }
        Ok(claims)
    }

    /// Verify a subscription token for `channel` held by `user`.
    pub fn subscription(
        &self,
        token: &str,
        user: &str,
        channel: &str,
    ) -> Result<SubscriptionClaims, AuthError> {
        let claims: SubscriptionClaims = self.decode(token)?;
        if claims.channel != channel {
            return Err(AuthError::Invalid("token is for another channel".into()));
        }
        if claims.sub != user {
            return Err(AuthError::Invalid("token is for another user".into()));
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    fn verifier() -> TokenVerifier {
        let config = Config {
            token_hmac_secret: Some("s3cret".into()),
            ..Config::default()
        };
        TokenVerifier::from_config(&config).unwrap()
    }

    fn hs(claims: serde_json::Value, secret: &str) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn accepts_valid_hs256() {
        let t = hs(
            serde_json::json!({"sub": "alice", "exp": now() + 60, "channels": ["a"], "info": {"n": 1}}),
            "s3cret",
        );
        let c = verifier().connection(&t).unwrap();
        assert_eq!(c.sub, "alice");
        assert_eq!(c.channels, vec!["a"]);
        assert_eq!(c.info.unwrap().get(), r#"{"n":1}"#);
    }

    #[test]
    fn expired_and_forged_tokens() {
        let expired = hs(serde_json::json!({"sub": "a", "exp": now() - 5}), "s3cret");
        assert_eq!(
            verifier().connection(&expired).unwrap_err(),
            AuthError::Expired
        );
        let forged = hs(serde_json::json!({"sub": "a"}), "wrong");
        assert!(matches!(
            verifier().connection(&forged),
            Err(AuthError::Invalid(_))
        ));
        assert!(matches!(
            verifier().connection("garbage"),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn refusals_never_echo_parser_text() {
        let bad_alg = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.";
        let e = verifier().connection(bad_alg).unwrap_err();
        assert_eq!(e, AuthError::Invalid("malformed token".into()));
        let wrong_claims = hs(serde_json::json!({"sub": 5}), "s3cret");
        let e = verifier().connection(&wrong_claims).unwrap_err();
        assert_eq!(e, AuthError::Invalid("malformed claims".into()));
    }

    #[test]
    fn the_two_kinds_of_token_do_not_stand_in_for_each_other() {
        let sub_token = hs(
            serde_json::json!({"sub": "bob", "channel": "priv:x", "exp": now() + 60}),
            "s3cret",
        );
        assert!(verifier().connection(&sub_token).is_err());
        let conn_token = hs(
            serde_json::json!({"sub": "bob", "exp": now() + 60}),
            "s3cret",
        );
        assert!(verifier()
            .subscription(&conn_token, "bob", "priv:x")
            .is_err());
    }

    #[test]
    fn exp_can_be_required() {
        let config = Config {
            token_hmac_secret: Some("s3cret".into()),
            token_require_exp: true,
            ..Config::default()
        };
        let strict = TokenVerifier::from_config(&config).unwrap();
        let forever = hs(serde_json::json!({"sub": "a"}), "s3cret");
        assert!(verifier().connection(&forever).is_ok());
        assert_eq!(
            strict.connection(&forever).unwrap_err(),
            AuthError::Invalid("a required claim is missing".into())
        );
    }

    #[test]
    fn subscription_token_binds_user_and_channel() {
        let t = hs(
            serde_json::json!({"sub": "bob", "channel": "priv:x"}),
            "s3cret",
        );
        assert!(verifier().subscription(&t, "bob", "priv:x").is_ok());
        assert!(verifier().subscription(&t, "eve", "priv:x").is_err());
        assert!(verifier().subscription(&t, "bob", "priv:y").is_err());
    }
}
