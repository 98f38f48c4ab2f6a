//! `--tls-ca`: clients reach a node serving TLS (`wss://`, `https://` URLs) and trust the CA
//! certificate given (a test CA; the node's certificate must name the URL's host, e.g. the IP
//! SAN 127.0.0.1). rustls with ring, as the server uses (crates/server/src/tls.rs).
//!
//! The trusted CA is set once per process ([`trust`]): the coordinator and every worker set it
//! from the run's [`Params`](crate::params::Params), and every client the process opens (WebSocket,
//! SSE, the HTTP API) reads it from here.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::client::{Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::NamedGroup;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A client's byte stream: plain TCP, or TLS over it.
pub type Stream = tokio_util::either::Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

static CONNECTOR: OnceLock<TlsConnector> = OnceLock::new();

/// Trusts the CA certificate(s) in the PEM file `ca` for every TLS client of this process;
/// `resume`: each client keeps its session tickets and resumes with one on reconnecting
/// ([`TicketStore`]).
///
/// # Errors
/// Unreadable or empty PEM, or a certificate rustls rejects.
pub fn trust(ca: &Path, resume: bool) -> Result<()> {
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
    if resume {
        config.resumption = Resumption::store(Arc::new(TicketStore::default()));
    }
    // Setting it twice with the same file is harmless: the first one stays.
    let _ = CONNECTOR.set(TlsConnector::from(Arc::new(config)));
    Ok(())
}

tokio::task_local! {
    /// Which of the worker's clients the running task is: its TLS tickets are its own.
    static CLIENT: usize;
}

/// Runs `client` as client `index`: with `--tls-resume`, it resumes with the tickets its own
/// earlier connections received, as one browser does on reconnecting.
///
/// Not an `async fn`: its future would hold `client` twice (rust-lang/rust#62958), 8.7 KB more
/// per client.
pub fn as_client<F: std::future::Future>(
    index: usize,
    client: F,
) -> impl std::future::Future<Output = F::Output> {
    CLIENT.scope(index, client)
}

/// A session store that keeps each client's TLS 1.3 tickets for that client alone (the task's
/// [`CLIENT`]; tasks outside [`as_client`], such as the API client, share one place), up to
/// [`TicketStore::PER_CLIENT`] each, handed out once, newest first. rustls' own store keeps 8
/// per server name for the whole process: thousands of clients of one node would take each
/// other's, and a reconnect after a storm would find none left. The rest (key-exchange hint,
/// TLS 1.2 sessions) is rustls' own store.
#[derive(Debug)]
struct TicketStore {
    tickets: Mutex<HashMap<Option<usize>, Vec<Tls13ClientSessionValue>>>,
    rest: ClientSessionMemoryCache,
}

impl TicketStore {
    /// The node sends one or two per handshake; a client needs one per reconnect.
    const PER_CLIENT: usize = 2;
}

impl Default for TicketStore {
    fn default() -> Self {
        TicketStore {
            tickets: Mutex::default(),
            rest: ClientSessionMemoryCache::new(16),
        }
    }
}

impl ClientSessionStore for TicketStore {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.rest.set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.rest.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.rest.set_tls12_session(server_name, value);
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.rest.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.rest.remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(&self, _: ServerName<'static>, value: Tls13ClientSessionValue) {
        let client = CLIENT.try_with(|i| *i).ok();
        let mut tickets = self.tickets.lock().expect("ticket store lock");
        let mine = tickets.entry(client).or_default();
        if mine.len() == Self::PER_CLIENT {
            mine.remove(0);
        }
        mine.push(value);
    }

    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        let client = CLIENT.try_with(|i| *i).ok();
        self.tickets
            .lock()
            .expect("ticket store lock")
            .get_mut(&client)?
            .pop()
    }
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
