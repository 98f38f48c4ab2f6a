//! [`NodeContext`]: what every session of a node shares.

use super::*;

/// What every session of a node shares.
pub struct NodeContext {
    /// The hub.
    pub hub: Hub,
    /// Namespaces from the config.
    pub namespaces: Namespaces,
    /// Token keys.
    pub verifier: TokenVerifier,
    /// The node's configuration (a reload replaces it; see [`crate::live`]).
    pub config: crate::live::LiveConfig,
    /// The application's backend, when any proxy hook is configured.
    pub proxy: Option<Arc<dyn Proxy>>,
}
