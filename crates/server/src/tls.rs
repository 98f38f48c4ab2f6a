//! rustls server config from PEM files, so that `wss://` works without a proxy.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Build an acceptor from a certificate chain and a private key, both PEM.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading certificate {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing certificate {}", cert.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading private key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("TLS certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Stateless session tickets: a client that comes back (a dropped network, a reconnect storm)
    // resumes its session without the certificate and its signature, and the node keeps no state
    // per session. The key lives in memory and rotates every 6 hours (rustls' `Ticketer`; a
    // ticket lives 12 hours), so a ticket resumes only on the node that issued it and until that
    // node restarts; anywhere else the client falls back to a full handshake. One ticket is
    // enough for the one reconnect a client makes at a time (rustls sends two by default).
    config.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS session tickets")?;
    config.send_tls13_tickets = 1;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
