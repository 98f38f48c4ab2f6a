//! What rustls alone keeps per idle server connection (docs/benchmarks.md, round 6): a bare
//! tokio-rustls server with the node's TLS setup (ring, TLS 1.3, ECDSA P-256) whose connection
//! tasks each wait in a one-byte read after the handshake, as an idle connection does; the same
//! with plain TCP as the baseline. The server's RSS growth per connection is printed; no
//! WebSocket, hyper or Herald state is involved.
//!
//! ```sh
//! scripts/bench-tls-cert.sh target/bench-tls
//! cargo run --release -p herald-bench --example tls_idle_rss -- 5000 target/bench-tls
//! ```

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().context("usage: N CERT_DIR [server]")?.parse()?;
    let dir = args.next().context("usage: N CERT_DIR [server]")?;
    if args.next().as_deref() == Some("server") {
        return serve(n, &dir).await;
    }
    // The clients live in this process; each server runs in its own, so that only its RSS counts.
    for tls in [false, true] {
        let exe = std::env::current_exe()?;
        let mut server = tokio::process::Command::new(exe)
            .args([&n.to_string(), &dir, "server"])
            .env("TLS", if tls { "1" } else { "0" })
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut out = tokio::io::BufReader::new(server.stdout.take().context("stdout")?);
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await?;
        let port: u16 = line.trim().parse().context("server port")?;
        let connector = client(&dir)?;
        // Held open until the server has measured.
        let (mut plain, mut secure) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
            if tls {
                let name = ServerName::try_from("127.0.0.1")?;
                secure.push(connector.connect(name, tcp).await?);
            } else {
                plain.push(tcp);
            }
        }
        line.clear();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await?;
        print!("{}: {line}", if tls { "TLS  " } else { "plain" });
        let _ = server.kill().await;
    }
    Ok(())
}

fn client(dir: &str) -> Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(format!("{dir}/ca.pem"))? {
        roots.add(c?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Accepts `n` connections, each task parked in a read, then prints the RSS growth per connection.
async fn serve(n: usize, dir: &str) -> Result<()> {
    let tls = std::env::var("TLS").as_deref() == Ok("1");
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(format!("{dir}/server.pem"))?.collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(format!("{dir}/server.key"))?;
    // As crates/server/src/tls.rs builds it.
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", l.local_addr()?.port());
    let before = rss_kb();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..n {
        let (tcp, _) = l.accept().await?;
        let acceptor = acceptor.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            let mut byte = [0u8; 1];
            if tls {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = done.send(());
                let _ = s.read(&mut byte).await;
            } else {
                let mut tcp = tcp;
                let _ = done.send(());
                let _ = tcp.read(&mut byte).await;
            }
        });
    }
    for _ in 0..n {
        done_rx.recv().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kb();
    println!(
        "{n} idle connections: RSS {before} → {after} KB, {:.2} KB per connection",
        (after - before) as f64 / n as f64
    );
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(())
}
