//! [`LiveConfig`]: the node's configuration in force, which a configuration reload replaces.
//!
//! Connections read settings (`ctx.config.limits.max_frame_bytes`, …) through a plain `&Config`
//! on hot paths, without a lock or a reference count. So every generation stays allocated for
//! the life of the process: a reload keeps the previous `Config` (a few kilobytes; reloads are
//! an operator's action, not a loop), and a reference taken before a reload stays valid after
//! it, reading the old settings until the next time it is taken.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::Config;

/// The configuration in force; derefs to it.
pub struct LiveConfig {
    current: ArcSwap<&'static Config>,
}

impl LiveConfig {
    /// The configuration the node starts with.
    pub fn new(config: Config) -> Self {
        LiveConfig {
            current: ArcSwap::from_pointee(Box::leak(Box::new(config))),
        }
    }

    /// Put `config` in force; later reads see it, earlier references keep the old one.
    pub fn replace(&self, config: Config) {
        self.current
            .store(Arc::new(Box::leak(Box::new(config)) as &'static Config));
    }

    /// The configuration in force now.
    pub fn get(&self) -> &'static Config {
        **self.current.load()
    }
}

impl Deref for LiveConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        self.get()
    }
}

impl std::fmt::Debug for LiveConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_is_read_next_time_and_old_references_stay_valid() {
        let live = LiveConfig::new(Config::default());
        let before = live.get();
        let mut next = Config::default();
        next.limits.max_frame_bytes = 123;
        live.replace(next);
        assert_eq!(live.limits.max_frame_bytes, 123);
        assert_ne!(before.limits.max_frame_bytes, 123);
    }
}
