//! What the hooks learn about the client's HTTP request: its IP, the transport, and only the
//! headers and cookies allow-listed in `proxy.headers` and `proxy.cookies` (a session cookie
//! for the backend, never everything the browser sends).

use std::collections::BTreeMap;
use std::net::IpAddr;

use herald_core::config::ProxyConfig;
use herald_core::proxy::ClientMeta;
use hyper::header::{HeaderMap, COOKIE};

/// The meta of a request on `transport` from `ip`.
pub fn client_meta(
    config: &ProxyConfig,
    headers: &HeaderMap,
    ip: Option<IpAddr>,
    transport: &'static str,
) -> ClientMeta {
    let mut forwarded = BTreeMap::new();
    for name in &config.headers {
        let values: Vec<&str> = headers
            .get_all(name.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if !values.is_empty() {
            forwarded.insert(name.to_ascii_lowercase(), values.join(", "));
        }
    }
    let mut cookies = BTreeMap::new();
    if !config.cookies.is_empty() {
        let pairs = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='));
        for (name, value) in pairs {
            if config.cookies.iter().any(|c| c == name) {
                cookies.insert(name.to_owned(), value.to_owned());
            }
        }
    }
    ClientMeta {
        transport,
        ip,
        headers: forwarded,
        cookies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_headers_and_cookies() {
        let config = ProxyConfig {
            headers: vec!["X-App".into(), "Authorization".into()],
            cookies: vec!["sessionid".into()],
            ..ProxyConfig::default()
        };
        let mut h = HeaderMap::new();
        h.insert("x-app", "1".parse().unwrap());
        h.insert("x-other", "2".parse().unwrap());
        h.append(
            COOKIE,
            "csrftoken=a; sessionid=s3; other=b".parse().unwrap(),
        );
        let meta = client_meta(&config, &h, None, "websocket");
        assert_eq!(
            meta.headers.into_iter().collect::<Vec<_>>(),
            [("x-app".to_owned(), "1".to_owned())]
        );
        assert_eq!(
            meta.cookies.into_iter().collect::<Vec<_>>(),
            [("sessionid".to_owned(), "s3".to_owned())]
        );
    }
}
