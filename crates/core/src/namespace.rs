//! Channel names, namespaces and who may do what on a channel.

use std::collections::HashMap;
use std::sync::Arc;

use herald_protocol::{CommandError, ErrorCode};

use crate::config::{Config, NamespaceConfig, SubscribePolicy};

/// Longest channel name in bytes.
pub const MAX_CHANNEL_LEN: usize = 255;

/// Bytes allowed in channel names: `[A-Za-z0-9_:.@=/#,-]`.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_:.@=/#,-".contains(&b)
}

/// Why a channel name is refused or a subscription is not allowed. Always the client's fault;
/// retrying the same request gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// The name is empty or longer than [`MAX_CHANNEL_LEN`].
    #[error("channel name must be 1 to {MAX_CHANNEL_LEN} bytes")]
    BadLength,
    /// The name has bytes outside the channel alphabet.
    #[error("channel {0:?} has characters outside [A-Za-z0-9_:.@=/#,-]")]
    BadCharacters(String),
    /// The name's `ns:` prefix names no configured namespace.
    #[error("unknown namespace {0:?}")]
    UnknownNamespace(String),
    /// A user-limited channel (`name#alice,bob`) does not list this user.
    #[error("channel is limited to other users")]
    OtherUsersOnly,
    /// The namespace admits only holders of a subscription token.
    #[error("channel needs a subscription token")]
    NeedsSubscriptionToken,
    /// The namespace admits only authenticated users.
    #[error("channel needs an authenticated user")]
    NeedsUser,
}

impl NamespaceError {
    /// The protocol error code this answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            NamespaceError::BadLength | NamespaceError::BadCharacters(_) => ErrorCode::BadRequest,
            NamespaceError::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
            NamespaceError::OtherUsersOnly
            | NamespaceError::NeedsSubscriptionToken
            | NamespaceError::NeedsUser => ErrorCode::PermissionDenied,
        }
    }
}

impl From<NamespaceError> for CommandError {
    fn from(e: NamespaceError) -> Self {
        CommandError::new(e.code(), e.to_string())
    }
}

/// Check a channel name's length and alphabet.
pub fn validate_channel(channel: &str) -> Result<(), NamespaceError> {
    if channel.is_empty() || channel.len() > MAX_CHANNEL_LEN {
        return Err(NamespaceError::BadLength);
    }
    if !channel.bytes().all(is_name_byte) {
        return Err(NamespaceError::BadCharacters(channel.to_owned()));
    }
    Ok(())
}

/// Users allowed by a user-limited channel (`ns:name#alice,bob`), or `None` for an ordinary one.
pub fn allowed_users(channel: &str) -> Option<impl Iterator<Item = &str>> {
    let (_, users) = channel.rsplit_once('#')?;
    Some(users.split(',').filter(|u| !u.is_empty()))
}

/// Namespaces by name, resolved from the config once.
#[derive(Debug, Clone)]
pub struct Namespaces {
    default: Arc<NamespaceConfig>,
    named: HashMap<String, Arc<NamespaceConfig>>,
}

impl Namespaces {
    /// Build from the config.
    pub fn from_config(config: &Config) -> Self {
        Namespaces {
            default: Arc::new(config.default_namespace.clone()),
            named: config
                .namespaces
                .iter()
                .map(|ns| (ns.name.clone(), Arc::new(ns.clone())))
                .collect(),
        }
    }

    /// The namespace that governs `channel`, after validating the name.
    pub fn resolve(&self, channel: &str) -> Result<&Arc<NamespaceConfig>, NamespaceError> {
        validate_channel(channel)?;
        match channel.split_once(':') {
            None => Ok(&self.default),
            Some((ns, _)) => self
                .named
                .get(ns)
                .ok_or_else(|| NamespaceError::UnknownNamespace(ns.to_owned())),
        }
    }
}

/// What the subscribing connection brings.
pub struct Subscriber<'a> {
    /// The connection's user ("" for anonymous).
    pub user: &'a str,
    /// The channel is in the connection token's `channels` claim.
    pub granted_by_connection_token: bool,
    /// A valid subscription token for this channel and user came with the request.
    pub has_subscription_token: bool,
}

/// May this connection subscribe to `channel` in namespace `ns`?
pub fn may_subscribe(
    ns: &NamespaceConfig,
    channel: &str,
    who: &Subscriber<'_>,
) -> Result<(), NamespaceError> {
    if let Some(mut users) = allowed_users(channel) {
        if who.user.is_empty() || !users.any(|u| u == who.user) {
            return Err(NamespaceError::OtherUsersOnly);
        }
    }
    if who.granted_by_connection_token || who.has_subscription_token {
        return Ok(());
    }
    let allowed = match ns.subscribe {
        SubscribePolicy::Anonymous => true,
        SubscribePolicy::Authenticated => !who.user.is_empty(),
        SubscribePolicy::Token => false,
    };
    if allowed {
        Ok(())
    } else if ns.subscribe == SubscribePolicy::Token {
        Err(NamespaceError::NeedsSubscriptionToken)
    } else {
        Err(NamespaceError::NeedsUser)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut c = Config::default();
        c.namespaces.push(NamespaceConfig {
            name: "priv".into(),
            subscribe: SubscribePolicy::Token,
            ..NamespaceConfig::default()
        });
        c
    }

    fn who(user: &str) -> Subscriber<'_> {
        Subscriber {
            user,
            granted_by_connection_token: false,
            has_subscription_token: false,
        }
    }

    #[test]
    fn resolves_default_and_named() {
        let ns = Namespaces::from_config(&config());
        assert_eq!(ns.resolve("news").unwrap().name, "");
        assert_eq!(ns.resolve("priv:x").unwrap().name, "priv");
        assert_eq!(
            ns.resolve("nope:x").unwrap_err().code(),
            ErrorCode::UnknownNamespace
        );
        assert_eq!(
            ns.resolve("bad channel").unwrap_err().code(),
            ErrorCode::BadRequest
        );
        assert_eq!(
            ns.resolve(&"a".repeat(256)).unwrap_err().code(),
            ErrorCode::BadRequest
        );
    }

    #[test]
    fn policies() {
        let c = config();
        let def = &c.default_namespace;
        assert!(
            may_subscribe(def, "news", &who("")).is_err(),
            "authenticated by default"
        );
        assert!(may_subscribe(def, "news", &who("bob")).is_ok());
        let private = &c.namespaces[0];
        assert!(may_subscribe(private, "priv:x", &who("bob")).is_err());
        let with_token = Subscriber {
            has_subscription_token: true,
            ..who("bob")
        };
        assert!(may_subscribe(private, "priv:x", &with_token).is_ok());
    }

    #[test]
    fn user_limited_channels() {
        let c = config();
        let def = &c.default_namespace;
        assert!(may_subscribe(def, "dm#alice,bob", &who("alice")).is_ok());
        assert!(may_subscribe(def, "dm#alice,bob", &who("bob")).is_ok());
        assert_eq!(
            may_subscribe(def, "dm#alice,bob", &who("eve"))
                .unwrap_err()
                .code(),
            ErrorCode::PermissionDenied
        );
        let granted = Subscriber {
            granted_by_connection_token: true,
            ..who("eve")
        };
        assert!(
            may_subscribe(def, "dm#alice,bob", &granted).is_err(),
            "a token cannot widen a user list"
        );
    }
}
