//! `--tls-ca`: clients reach a node serving TLS (`wss://`, `https://` URLs) and trust the CA
//! certificate given (a test CA; the node's certificate must name the URL's host, e.g. the IP
//! SAN 127.0.0.1). rustls with ring, as the server uses (crates/server/src/tls.rs).
//!
//! The trusted CA is set once per process ([`trust`]): the coordinator and every worker set it
//! from the run's [`Params`](crate::params::Params), and every client the process opens (WebSocket,
//! SSE, the HTTP API) reads it from here.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A client's byte stream: plain TCP, or TLS over it.
pub type Stream = tokio_util::either::Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

static CONNECTOR: OnceLock<TlsConnector> = OnceLock::new();

/// Trusts the CA certificate(s) in the PEM file `ca` for every TLS client of this process.
///
/// # Errors
/// Unreadable or empty PEM, or a certificate rustls rejects.
pub fn trust(ca: &Path) -> Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading CA certificate {}", ca.display()))?
    {
        roots
            .add(cert.with_context(|| format!("parsing {}", ca.display()))?)
            .with_context(|| format!("CA certificate in {}", ca.display()))?;
    }
    if roots.is_empty() {
        bail!("no certificate in {}", ca.display());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // The node offers only HTTP/1.1 (the WebSocket upgrade and the API need it).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Setting it twice with the same file is harmless: the first one stays.
    let _ = CONNECTOR.set(TlsConnector::from(Arc::new(config)));
    Ok(())
}

/// Whether a URL asks for TLS (`wss://`, `https://`).
pub fn is_tls_url(url: &str) -> bool {
    url.starts_with("wss://") || url.starts_with("https://")
}

/// Wraps a connected TCP stream in TLS when `tls` is set, verifying the certificate against
/// `host` (the URL's host: an IP literal or a DNS name).
///
/// # Errors
/// No `--tls-ca` in this process, a bad host, or the handshake failed.
pub async fn wrap(tcp: TcpStream, tls: bool, host: &str) -> Result<Stream, String> {
    if !tls {
        return Ok(Stream::Left(tcp));
    }
    let connector = CONNECTOR
        .get()
        .ok_or("a wss:// or https:// URL needs --tls-ca")?;
    let name =
        ServerName::try_from(host.to_owned()).map_err(|e| format!("TLS name {host}: {e}"))?;
    connector
        .connect(name, tcp)
        .await
        .map(Stream::Right)
        .map_err(|e| format!("TLS handshake: {e}"))
}

/// The host part of `scheme://host:port/path` (brackets kept off IPv6 literals).
pub fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_schemes() {
        assert_eq!(url_host("wss://127.0.0.1:8443/ws"), "127.0.0.1");
        assert_eq!(url_host("https://localhost:8443"), "localhost");
        assert_eq!(url_host("wss://[::1]:8443/ws"), "::1");
        assert!(is_tls_url("wss://x/ws") && is_tls_url("https://x"));
        assert!(!is_tls_url("ws://x/ws") && !is_tls_url("http://x"));
    }
}
