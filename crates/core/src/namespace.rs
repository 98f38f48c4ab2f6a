//! Channel names and the namespaces that govern them. Who may do what on a channel is decided
//! in [`crate::permission`].

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use herald_protocol::{CommandError, ErrorCode};

use crate::config::{Config, NamespaceConfig};

/// Longest channel name in bytes.
pub const MAX_CHANNEL_LEN: usize = 255;

/// Bytes allowed in channel names: `[A-Za-z0-9_:.@=/#,-]`.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_:.@=/#,-".contains(&b)
}

/// Why a channel name is refused. Always the client's fault; retrying the same request gets the
/// same answer.
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
}

impl NamespaceError {
    /// The protocol error code this answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            NamespaceError::BadLength | NamespaceError::BadCharacters(_) => ErrorCode::BadRequest,
            NamespaceError::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
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

/// Namespaces by name, resolved from the config. Clones share one set, which a configuration
/// reload replaces at once ([`Namespaces::replace`]): every holder sees the new rules on its next
/// [`Namespaces::resolve`].
#[derive(Debug, Clone)]
pub struct Namespaces {
    set: Arc<ArcSwap<NamespaceSet>>,
}

/// One generation of the namespaces.
#[derive(Debug)]
struct NamespaceSet {
    default: Arc<NamespaceConfig>,
    named: HashMap<String, Arc<NamespaceConfig>>,
}

impl NamespaceSet {
    fn from_config(config: &Config) -> Self {
        NamespaceSet {
            default: Arc::new(config.default_namespace.clone()),
            named: config
                .namespaces
                .iter()
                .map(|ns| (ns.name.clone(), Arc::new(ns.clone())))
                .collect(),
        }
    }
}

impl Namespaces {
    /// Build from the config.
    pub fn from_config(config: &Config) -> Self {
        Namespaces {
            set: Arc::new(ArcSwap::from_pointee(NamespaceSet::from_config(config))),
        }
    }

    /// Replace the namespaces with `config`'s, for every clone (a configuration reload).
    pub fn replace(&self, config: &Config) {
        self.set.store(Arc::new(NamespaceSet::from_config(config)));
    }

    /// The namespace that governs `channel`, after validating the name.
    pub fn resolve(&self, channel: &str) -> Result<Arc<NamespaceConfig>, NamespaceError> {
        validate_channel(channel)?;
        let set = self.set.load();
        match channel.split_once(':') {
            None => Ok(set.default.clone()),
            Some((ns, _)) => set
                .named
                .get(ns)
                .cloned()
                .ok_or_else(|| NamespaceError::UnknownNamespace(ns.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut c = Config::default();
        c.namespaces.push(NamespaceConfig {
            name: "priv".into(),
            ..NamespaceConfig::default()
        });
        c
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
    fn a_replacement_reaches_every_clone() {
        let ns = Namespaces::from_config(&config());
        let held = ns.clone();
        let mut next = Config::default();
        next.namespaces.push(NamespaceConfig {
            name: "room".into(),
            publish: true,
            ..NamespaceConfig::default()
        });
        ns.replace(&next);
        assert!(held.resolve("room:x").unwrap().publish);
        assert_eq!(
            held.resolve("priv:x").unwrap_err().code(),
            ErrorCode::UnknownNamespace
        );
    }
}
