//! JWT verification for connection and subscription tokens (HS256, RS256, ES256), with keys from
//! the config or from a [`KeySet`] (the server's JWKS cache), and `aud`/`iss` checks when
//! configured.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::Config;

/// Keys looked up by `kid` (the server fetches them from a JWKS URL): the core knows no HTTP.
#[async_trait::async_trait]
pub trait KeySet: Send + Sync {
    /// The key named `kid`, which must verify `alg`.
    async fn key(&self, kid: &str, alg: Algorithm) -> Result<Arc<DecodingKey>, AuthError>;
}

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

/// Verifies tokens with the keys from the config. Clones share one key set, which a
/// configuration reload replaces at once ([`TokenVerifier::replace`]): a token is checked with
/// the keys in force when it arrives.
#[derive(Clone, Default)]
pub struct TokenVerifier {
    keys: Arc<ArcSwap<TokenKeys>>,
}

/// One generation of the keys and checks.
#[derive(Clone, Default)]
struct TokenKeys {
    hmac: Option<Arc<DecodingKey>>,
    rsa: Option<Arc<DecodingKey>>,
    ecdsa: Option<Arc<DecodingKey>>,
    jwks: Option<Arc<dyn KeySet>>,
    require_exp: bool,
    audience: Option<String>,
    issuer: Option<String>,
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

/// A configured token key that cannot be used (the node does not start).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A key file that cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `token_rsa_public_key(_file)` is not an RSA public key in PEM.
    #[error("RSA public key: {0}")]
    Rsa(jsonwebtoken::errors::Error),
    /// `token_ecdsa_public_key(_file)` is not an ECDSA public key in PEM.
    #[error("ECDSA public key: {0}")]
    Ecdsa(jsonwebtoken::errors::Error),
}

impl TokenVerifier {
    /// Load the keys named in the config.
    pub fn from_config(config: &Config) -> Result<Self, KeyError> {
        let pem = |text: &Option<String>,
                   file: &Option<std::path::PathBuf>|
         -> Result<Option<Vec<u8>>, KeyError> {
            if let Some(t) = text {
                return Ok(Some(t.as_bytes().to_vec()));
            }
            match file {
                Some(path) => std::fs::read(path)
                    .map(Some)
                    .map_err(|source| KeyError::Read {
                        path: path.clone(),
                        source,
                    }),
                None => Ok(None),
            }
        };
        let rsa = pem(
            &config.token_rsa_public_key,
            &config.token_rsa_public_key_file,
        )?
        .map(|p| DecodingKey::from_rsa_pem(&p).map_err(KeyError::Rsa))
        .map(|k| k.map(Arc::new))
        .transpose()?;
        let ecdsa = pem(
            &config.token_ecdsa_public_key,
            &config.token_ecdsa_public_key_file,
        )?
        .map(|p| DecodingKey::from_ec_pem(&p).map_err(KeyError::Ecdsa))
        .map(|k| k.map(Arc::new))
        .transpose()?;
        let keys = TokenKeys {
            hmac: config
                .token_hmac_secret
                .as_ref()
                .filter(|s| !s.is_empty())
                .map(|s| Arc::new(DecodingKey::from_secret(s.as_bytes()))),
            rsa,
            ecdsa,
            jwks: None,
            require_exp: config.token_require_exp,
            audience: config.token_audience.clone().filter(|a| !a.is_empty()),
            issuer: config.token_issuer.clone().filter(|i| !i.is_empty()),
        };
        Ok(TokenVerifier {
            keys: Arc::new(ArcSwap::from_pointee(keys)),
        })
    }

    /// Also look keys up by `kid` in `keys` (RS256 and ES256 tokens that name one).
    pub fn with_key_set(self, keys: Arc<dyn KeySet>) -> Self {
        let mut next = TokenKeys::clone(&self.keys.load());
        next.jwks = Some(keys);
        self.keys.store(Arc::new(next));
        self
    }

    /// Whether any key (or a key set) is configured.
    pub fn has_keys(&self) -> bool {
        let k = self.keys.load();
        k.hmac.is_some() || k.rsa.is_some() || k.ecdsa.is_some() || k.jwks.is_some()
    }

    /// Take `other`'s keys and checks, for every clone of this verifier (a configuration
    /// reload); tokens being checked finish with the keys they started with.
    pub fn replace(&self, other: &TokenVerifier) {
        self.keys.store(other.keys.load_full());
    }

    async fn decode<T: serde::de::DeserializeOwned>(&self, token: &str) -> Result<T, AuthError> {
        // An owned generation: a reload during the JWKS lookup does not pull keys from under it.
        let keys = self.keys.load_full();
        keys.decode(token).await
    }
}

impl TokenKeys {
    /// The key for a token: from the JWKS when the token names a `kid` and a JWKS URL is set,
    /// otherwise the configured key for its algorithm.
    async fn key_for(&self, header: &jsonwebtoken::Header) -> Result<Arc<DecodingKey>, AuthError> {
        let accepted = matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::RS256 | Algorithm::ES256
        );
        if !accepted {
            return Err(AuthError::Invalid(format!(
                "algorithm {:?} is not accepted",
                header.alg
            )));
        }
        if let (Some(jwks), Some(kid)) = (&self.jwks, &header.kid) {
            if header.alg != Algorithm::HS256 {
                return jwks.key(kid, header.alg).await;
            }
        }
        let key = match header.alg {
            Algorithm::HS256 => self.hmac.as_ref(),
            Algorithm::RS256 => self.rsa.as_ref(),
            _ => self.ecdsa.as_ref(),
        };
        key.cloned()
            .ok_or_else(|| AuthError::Invalid(format!("no key configured for {:?}", header.alg)))
    }

    async fn decode<T: serde::de::DeserializeOwned>(&self, token: &str) -> Result<T, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::Invalid("malformed token".into()))?;
        let key = self.key_for(&header).await?;
        let mut validation = Validation::new(header.alg);
        let mut required = HashSet::new();
        if self.require_exp {
            required.insert("exp".to_owned());
        }
        validation.validate_aud = self.audience.is_some();
        if let Some(aud) = &self.audience {
            validation.set_audience(&[aud]);
            required.insert("aud".to_owned());
        }
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
            required.insert("iss".to_owned());
        }
        validation.required_spec_claims = required;
        validation.validate_exp = true;
        validation.leeway = 0;
        jsonwebtoken::decode::<T>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| refusal(&e))
    }
}

impl TokenVerifier {
    /// Verify a connection token.
    pub async fn connection(&self, token: &str) -> Result<ConnectionClaims, AuthError> {
        let claims: ConnectionClaims = self.decode(token).await?;
        if claims.channel.is_some() {
            return Err(AuthError::Invalid(
                "a subscription token cannot connect".into(),
            ));
        }
        Ok(claims)
    }

    /// Verify a subscription token for `channel` held by `user`.
    pub async fn subscription(
        &self,
        token: &str,
        user: &str,
        channel: &str,
    ) -> Result<SubscriptionClaims, AuthError> {
        let claims: SubscriptionClaims = self.decode(token).await?;
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

    #[tokio::test]
    async fn accepts_valid_hs256() {
        let t = hs(
            serde_json::json!({"sub": "alice", "exp": now() + 60, "channels": ["a"], "info": {"n": 1}}),
            "s3cret",
        );
        let c = verifier().connection(&t).await.unwrap();
        assert_eq!(c.sub, "alice");
        assert_eq!(c.channels, vec!["a"]);
        assert_eq!(c.info.unwrap().get(), r#"{"n":1}"#);
    }

    #[tokio::test]
    async fn expired_and_forged_tokens() {
        let expired = hs(serde_json::json!({"sub": "a", "exp": now() - 5}), "s3cret");
        assert_eq!(
            verifier().connection(&expired).await.unwrap_err(),
            AuthError::Expired
        );
        let forged = hs(serde_json::json!({"sub": "a"}), "wrong");
        assert!(matches!(
            verifier().connection(&forged).await,
            Err(AuthError::Invalid(_))
        ));
        assert!(matches!(
            verifier().connection("garbage").await,
            Err(AuthError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn refusals_never_echo_parser_text() {
        let bad_alg = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.";
        let e = verifier().connection(bad_alg).await.unwrap_err();
        assert_eq!(e, AuthError::Invalid("malformed token".into()));
        let wrong_claims = hs(serde_json::json!({"sub": 5}), "s3cret");
        let e = verifier().connection(&wrong_claims).await.unwrap_err();
        assert_eq!(e, AuthError::Invalid("malformed claims".into()));
    }

    #[tokio::test]
    async fn the_two_kinds_of_token_do_not_stand_in_for_each_other() {
        let sub_token = hs(
            serde_json::json!({"sub": "bob", "channel": "priv:x", "exp": now() + 60}),
            "s3cret",
        );
        assert!(verifier().connection(&sub_token).await.is_err());
        let conn_token = hs(
            serde_json::json!({"sub": "bob", "exp": now() + 60}),
            "s3cret",
        );
        assert!(verifier()
            .subscription(&conn_token, "bob", "priv:x")
            .await
            .is_err());
    }

    #[tokio::test]
    async fn exp_can_be_required() {
        let config = Config {
            token_hmac_secret: Some("s3cret".into()),
            token_require_exp: true,
            ..Config::default()
        };
        let strict = TokenVerifier::from_config(&config).unwrap();
        let forever = hs(serde_json::json!({"sub": "a"}), "s3cret");
        assert!(verifier().connection(&forever).await.is_ok());
        assert_eq!(
            strict.connection(&forever).await.unwrap_err(),
            AuthError::Invalid("a required claim is missing".into())
        );
    }

    #[tokio::test]
    async fn audience_and_issuer_are_checked_when_configured() {
        let config = Config {
            token_hmac_secret: Some("s3cret".into()),
            token_audience: Some("herald".into()),
            token_issuer: Some("https://id.example".into()),
            ..Config::default()
        };
        let strict = TokenVerifier::from_config(&config).unwrap();
        let good = hs(
            serde_json::json!({"sub": "a", "aud": "herald", "iss": "https://id.example"}),
            "s3cret",
        );
        assert!(strict.connection(&good).await.is_ok());
        let in_list = hs(
            serde_json::json!({"sub": "a", "aud": ["other", "herald"], "iss": "https://id.example"}),
            "s3cret",
        );
        assert!(strict.connection(&in_list).await.is_ok());
        for (claims, why) in [
            (
                serde_json::json!({"sub": "a", "aud": "other", "iss": "https://id.example"}),
                "wrong audience",
            ),
            (
                serde_json::json!({"sub": "a", "aud": "herald", "iss": "https://evil.example"}),
                "wrong issuer",
            ),
            (
                serde_json::json!({"sub": "a", "iss": "https://id.example"}),
                "a required claim is missing",
            ),
            (
                serde_json::json!({"sub": "a", "aud": "herald"}),
                "a required claim is missing",
            ),
        ] {
            let t = hs(claims.clone(), "s3cret");
            assert_eq!(
                strict.connection(&t).await.unwrap_err(),
                AuthError::Invalid(why.into()),
                "{claims}"
            );
        }
        // Without the options, aud and iss are not looked at.
        let other = hs(
            serde_json::json!({"sub": "a", "aud": "other", "iss": "x"}),
            "s3cret",
        );
        assert!(verifier().connection(&other).await.is_ok());
    }

    #[tokio::test]
    async fn subscription_token_binds_user_and_channel() {
        let t = hs(
            serde_json::json!({"sub": "bob", "channel": "priv:x"}),
            "s3cret",
        );
        assert!(verifier().subscription(&t, "bob", "priv:x").await.is_ok());
        assert!(verifier().subscription(&t, "eve", "priv:x").await.is_err());
        assert!(verifier().subscription(&t, "bob", "priv:y").await.is_err());
    }

    // Fuzz harness (`scripts/fuzz.sh` runs it longer): any string offered as a token is verified
    // or refused, never a panic; an edited token never passes as someone else.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn check(token: &str) -> Option<String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let v = verifier();
            let sub = rt.block_on(v.subscription(token, "c", "alice"));
            if let Err(e) = &sub {
                let text = e.to_string();
                assert!(text.len() < 200 && !text.contains("JSON error"), "{text}");
            }
            let conn = rt.block_on(v.connection(token));
            conn.ok().map(|c| c.sub)
        }

        const ALPHABET: &[u8] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ ";

        proptest! {
            #[test]
            fn any_string_is_verified_or_refused(token in any::<String>()) {
                prop_assert_eq!(check(&token), None);
            }

            #[test]
            fn token_shaped_strings_are_refused(a in "[A-Za-z0-9_-]{0,60}", b in "[A-Za-z0-9_-]{0,200}", c in "[A-Za-z0-9_-]{0,60}") {
                prop_assert_eq!(check(&format!("{a}.{b}.{c}")), None);
            }

            #[test]
            fn edited_tokens_never_pass_as_someone_else(
                edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..4),
                claims in prop_oneof![
                    Just(serde_json::json!({"sub": "alice"})),
                    Just(serde_json::json!({"sub": "alice", "exp": 4_000_000_000u64, "channels": ["a", "b"], "info": {"n": 1}})),
                    Just(serde_json::json!({"sub": "alice", "channel": "c", "exp": 4_000_000_000u64})),
                ],
            ) {
                let token = hs(claims, "s3cret");
                let mut bytes = token.clone().into_bytes();
                for (at, with) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = ALPHABET[with.index(ALPHABET.len())];
                }
                let edited = String::from_utf8(bytes).unwrap();
                if let Some(sub) = check(&edited) {
                    prop_assert_eq!(sub, "alice");
                }
            }

            #[test]
            fn signed_claims_of_any_shape_are_verified_or_refused(
                claims in proptest::collection::btree_map(
                    prop_oneof![Just("sub".to_string()), Just("exp".to_string()), Just("channels".to_string()), Just("info".to_string()), Just("aud".to_string()), Just("channel".to_string()), "[a-z]{1,5}"],
                    prop_oneof![
                        Just(serde_json::json!(null)),
                        any::<i64>().prop_map(|n| serde_json::json!(n)),
                        any::<f64>().prop_map(|n| serde_json::json!(n)),
                        ".{0,20}".prop_map(|s| serde_json::json!(s)),
                        proptest::collection::vec(".{0,5}", 0..4).prop_map(|v| serde_json::json!(v)),
                    ],
                    0..6,
                ),
            ) {
                let claims = serde_json::Value::Object(claims.into_iter().collect());
                let _ = check(&hs(claims, "s3cret"));
            }
        }
    }
}
