//! Who may reach the node: the `Origin` of WebSocket upgrades and HTTP API calls, the `Host` of
//! requests to a `--dev` node, open connections per client IP and WebSocket handshakes per
//! second per client IP.
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
use std::time::Instant;

use herald_core::rate::TokenBucket;

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

/// The peer address of the TCP connection a request came on (set for every request).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// WebSocket handshakes per second per client IP (`limits.handshakes_per_ip_per_s`, 0: no
/// bound), a token bucket per IP. Buckets that have refilled are forgotten once there are many,
/// so a scan from many addresses cannot grow the table without bound.
pub struct HandshakeRate {
    rate: u32,
    burst: u32,
    buckets: Mutex<HashMap<IpAddr, TokenBucket>>,
}

/// Buckets kept before full ones are swept.
const SWEEP_ABOVE: usize = 10_000;

impl HandshakeRate {
    /// `rate` handshakes per second per IP with bursts of `burst`.
    pub fn new(rate: u32, burst: u32) -> Self {
        HandshakeRate {
            rate,
            burst: burst.max(1),
            buckets: Mutex::default(),
        }
    }

    /// Whether `ip` may start one more handshake now.
    pub fn admit(&self, ip: IpAddr) -> bool {
        if self.rate == 0 {
            return true;
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("handshake lock");
        if buckets.len() >= SWEEP_ABOVE && !buckets.contains_key(&ip) {
            buckets.retain(|_, b| !b.is_full(now));
        }
        buckets
            .entry(ip)
            .or_insert_with(|| TokenBucket::new(self.rate, self.burst))
            .try_take(now)
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

    #[test]
    fn handshakes_per_ip_are_rate_limited() {
        let rate = HandshakeRate::new(1, 3);
        let ip: IpAddr = [10, 0, 0, 1].into();
        assert!((0..3).all(|_| rate.admit(ip)), "the burst");
        assert!(!rate.admit(ip), "past the burst");
        assert!(rate.admit([10, 0, 0, 2].into()), "other IPs unaffected");
        assert!(
            (0..100).all(|_| HandshakeRate::new(0, 1).admit(ip)),
            "0 means no bound"
        );
    }

    #[test]
    fn handshake_table_is_swept() {
        let rate = HandshakeRate::new(1000, 1);
        for i in 0..(SWEEP_ABOVE as u32 + 10) {
            rate.admit(IpAddr::from(i.to_be_bytes()));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        rate.admit([255, 0, 0, 1].into());
        assert!(rate.buckets.lock().unwrap().len() < SWEEP_ABOVE);
    }
}
