//! A TCP proxy in front of the broker for one node, which a test can cut: existing connections
//! are closed and new ones refused until it is restored. A blip for one node only, while the
//! other nodes keep publishing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; stops accepting when dropped.
pub struct Proxy {
    /// Where clients of the proxy connect.
    pub addr: SocketAddr,
    blocked: Arc<AtomicBool>,
    cut_tx: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let blocked = Arc::new(AtomicBool::new(false));
        let (cut_tx, cut_rx) = watch::channel(0u64);
        let task = {
            let blocked = blocked.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    if blocked.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let mut cut = cut_rx.clone();
                    cut.borrow_and_update();
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let (mut client, mut server) = (client, server);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            })
        };
        Proxy {
            addr,
            blocked,
            cut_tx,
            task,
        }
    }

    /// Close every proxied connection and refuse new ones.
    pub fn cut(&self) {
        self.blocked.store(true, Ordering::SeqCst);
        self.cut_tx.send_modify(|n| *n += 1);
    }

    /// Accept connections again.
    pub fn restore(&self) {
        self.blocked.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
