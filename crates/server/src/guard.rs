//! Who may reach the node: the `Origin` of WebSocket upgrades and HTTP API calls, the `Host` of
//! requests to a `--dev` node, and open connections per client IP.
//!
//! Browsers send `Origin` on every WebSocket upgrade and on cross-site API calls; backends and
//! command-line tools send none. So:
//! - a WebSocket upgrade from a browser page is accepted when `allowed_origins` is empty (any
//!   page) or lists its origin; without `Origin` it is accepted;
//! - an HTTP API call that carries `Origin` is refused (403) unless `api_allowed_origins` lists
//!   it (CORS is off by default), so a web page can never drive the API with a user's browser;
//! - a `--dev` node (open API, loopback only) answers only requests addressed to a loopback
//!   `Host`, so a DNS-rebinding page cannot reach it through a name of its own.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Whether `origin` is in `allowed` (exact match, or `*` for any).
pub fn origin_listed(allowed: &[String], origin: &str) -> bool {
    allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
}

/// Whether a `Host` header names this machine's loopback (`localhost`, `127.0.0.1`, `[::1]`,
/// with or without a port).
pub fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name == "::1" || name.starts_with("127.")
}

/// Open connections per client IP, bounded by `limits.max_connections_per_ip` (0: no bound).
pub struct PerIp {
    limit: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// Holds one connection's place; frees it when dropped.
pub struct IpSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerIp {
    /// A counter with this bound.
    pub fn new(limit: usize) -> Self {
        PerIp {
            limit,
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `ip`, or `None` when it has `limit` open already.
    pub fn admit(&self, ip: IpAddr) -> Option<Option<IpSlot>> {
        if self.limit == 0 {
            return Some(None);
        }
        let mut open = self.open.lock().expect("per-ip lock");
        let n = open.entry(ip).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Some(IpSlot {
            ip,
            open: self.open.clone(),
        }))
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("per-ip lock");
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_hosts() {
        let allowed = vec!["https://app.example".to_string()];
        assert!(origin_listed(&allowed, "https://APP.example"));
        assert!(!origin_listed(&allowed, "https://evil.example"));
        assert!(origin_listed(&["*".into()], "https://any.example"));
        for host in [
            "localhost",
            "localhost:8000",
            "127.0.0.1:9",
            "[::1]:80",
            "[::1]",
        ] {
            assert!(loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8000",
            "10.0.0.1:80",
            "localhost.evil",
        ] {
            assert!(!loopback_host(host), "{host}");
        }
    }

    #[test]
    fn per_ip_places_are_bounded_and_freed() {
        let per_ip = PerIp::new(2);
        let ip: IpAddr = [10, 0, 0, 1].into();
        let a = per_ip.admit(ip).expect("first");
        let _b = per_ip.admit(ip).expect("second");
        assert!(per_ip.admit(ip).is_none(), "third refused");
        assert!(
            per_ip.admit([10, 0, 0, 2].into()).is_some(),
            "other IPs unaffected"
        );
        drop(a);
        assert!(per_ip.admit(ip).is_some(), "freed on drop");
        assert!(PerIp::new(0).admit(ip).is_some(), "0 means no bound");
    }
}
