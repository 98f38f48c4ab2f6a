//! Who may reach the node: the `Origin` of WebSocket upgrades and HTTP API calls, the `Host` of
//! requests to a `--dev` node, open connections per client IP and WebSocket handshakes per
//! second per client IP.
//!
//! Browsers send `Origin` on every WebSocket upgrade and on cross-site API calls; backends and
//! command-line tools send none. So:
//! - a browser's WebSocket upgrade, SSE / stream request or emulation request ([`check_origin`])
//!   is accepted when `allowed_origins` lists its origin; with `allowed_origins` empty it is
//!   accepted from any page, except where a connect hook authenticates connects (by the
//!   browser's cookies, which a page on another site would send too): then only from the node's
//!   own origin (`Origin` equal to `Host`; any loopback origin on a `--dev` node). Without
//!   `Origin` it is accepted;
//! - an HTTP API call that carries `Origin` is refused (403) unless `api_allowed_origins` lists
//!   it (CORS is off by default), so a web page can never drive the API with a user's browser;
//! - a `--dev` node (open API, loopback only) answers only requests addressed to a loopback
//!   `Host`, so a DNS-rebinding page cannot reach it through a name of its own.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use herald_core::rate::TokenBucket;
use herald_core::Config;
use hyper::header::{self, HeaderMap};

/// Which door a browser's connection comes through, for [`check_origin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// Herald's own transports (`/ws`, SSE / stream, emulation): the connect hook may
    /// authenticate them by the browser's cookies.
    Herald,
    /// Pusher's `/app/{key}`: authenticated by signed channel authorizations, never by cookies.
    Pusher,
}

/// Whether a browser's request (a WebSocket upgrade, an SSE / stream request, an emulation
/// request) may open or feed a connection through `door`; `Err` says why not (answered with 403).
/// The one origin rule every door calls:
/// - no `Origin` header (not a browser): allowed;
/// - `allowed_origins` set: allowed if listed (or `*`);
/// - `allowed_origins` empty and a connect hook configured at a Herald door: connects are
///   authenticated by what the browser sends along (its cookies), which it sends for any page
///   that opens the connection, so only the node's own origin is allowed (cross-site WebSocket
///   hijacking otherwise); on a `--dev` node any loopback origin (a front-end dev server on
///   another port);
/// - otherwise (tokens, which a page on another site cannot borrow): allowed.
pub fn check_origin(config: &Config, headers: &HeaderMap, door: Door) -> Result<(), &'static str> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let allowed = &config.allowed_origins;
    if !allowed.is_empty() {
        return match origin_listed(allowed, origin) {
            true => Ok(()),
            false => Err("origin not allowed (allowed_origins)"),
        };
    }
    let cookies_authenticate = door == Door::Herald && !config.proxy.connect_url.is_empty();
    if !cookies_authenticate || same_origin(headers) {
        return Ok(());
    }
    if config.dev && origin_host(origin).is_some_and(|(host, _)| loopback_host(host)) {
        return Ok(());
    }
    Err(
        "cross-origin request refused: the connect hook authenticates by cookies, so only this \
         node's own origin may connect (list others in allowed_origins)",
    )
}

/// Whether the request's `Origin` names the host and port it was sent to (`Host`). A missing
/// `Host`, or an `Origin` that is not `http(s)://host[:port]` (`null`, an extension), is not.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(origin), Some(host)) = (get(header::ORIGIN), get(header::HOST)) else {
        return false;
    };
    let Some((origin_name, origin_port)) = origin_host(origin) else {
        return false;
    };
    let default_port = origin_port_default(origin);
    let Some((host_name, host_port)) = split_port(host) else {
        return false;
    };
    !host_name.is_empty()
        && host_name.eq_ignore_ascii_case(origin_name)
        && host_port.unwrap_or(default_port) == origin_port.unwrap_or(default_port)
}

/// `http(s)://host[:port]` → (host, port); `None` for anything else.
fn origin_host(origin: &str) -> Option<(&str, Option<u16>)> {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))?;
    split_port(rest)
}

fn origin_port_default(origin: &str) -> u16 {
    match origin.starts_with("https://") {
        true => 443,
        false => 80,
    }
}

/// `host[:port]` or `[v6][:port]` → (host, port); `None` when the port is not a number.
fn split_port(s: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = match s.strip_prefix('[') {
        Some(rest) => {
            let (inner, after) = rest.split_once(']')?;
            (inner, after.strip_prefix(':'))
        }
        None => match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        },
    };
    match port {
        Some(p) => Some((host, Some(p.parse().ok()?))),
        None => Some((host, None)),
    }
}

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

    fn headers(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, o.parse().unwrap());
        }
        h
    }

    #[test]
    fn same_origin_compares_host_and_port() {
        let same = |o, h| same_origin(&headers(Some(o), h));
        assert!(same("https://app.example", "app.example"));
        assert!(same("https://app.example", "APP.example:443"));
        assert!(same("http://127.0.0.1:8000", "127.0.0.1:8000"));
        assert!(same("http://[::1]:8000", "[::1]:8000"));
        assert!(!same("http://127.0.0.1:3000", "127.0.0.1:8000"));
        assert!(!same("https://evil.example", "app.example"));
        assert!(!same("https://app.example.evil", "app.example"));
        assert!(!same("null", "app.example"));
        assert!(!same("https://app.example", ""));
        assert!(!same_origin(&headers(None, "app.example")));
    }

    #[test]
    fn cross_origin_is_refused_only_where_cookies_authenticate() {
        let mut config = Config::default();
        let evil = headers(Some("https://evil.example"), "app.example");
        let own = headers(Some("https://app.example"), "app.example");
        let no_origin = headers(None, "app.example");
        // Tokens only: any origin, as before.
        assert!(check_origin(&config, &evil, Door::Herald).is_ok());
        config.proxy.connect_url = "http://127.0.0.1:1/connect".into();
        assert!(check_origin(&config, &evil, Door::Herald).is_err());
        assert!(check_origin(&config, &own, Door::Herald).is_ok());
        assert!(check_origin(&config, &no_origin, Door::Herald).is_ok());
        assert!(
            check_origin(&config, &evil, Door::Pusher).is_ok(),
            "Pusher is not cookie-authenticated"
        );
        // --dev: any loopback origin (a dev server on another port), still not another site.
        config.dev = true;
        let dev_page = headers(Some("http://localhost:3000"), "127.0.0.1:8000");
        assert!(check_origin(&config, &dev_page, Door::Herald).is_ok());
        assert!(check_origin(&config, &evil, Door::Herald).is_err());
        // A list decides alone, for every door.
        config.allowed_origins = vec!["https://evil.example".into()];
        assert!(check_origin(&config, &evil, Door::Herald).is_ok());
        assert!(check_origin(&config, &own, Door::Herald).is_err());
        assert!(check_origin(&config, &own, Door::Pusher).is_err());
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
