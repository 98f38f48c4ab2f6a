//! The accept loop (plain or TLS), and graceful drain on shutdown.

use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_core::live::LiveConfig;
use herald_core::namespace::Namespaces;
use herald_core::{Config, Hub, Metrics, NodeContext};
use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::HandshakeKind;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::guard::{HandshakeRate, IpSlot, PeerAddr, PerIp};
use crate::http::{route, Node};
use crate::reload::{self, ProxySlot, ReloadMetrics, Reloader};
use crate::settings::Overrides;
use crate::state::App;

/// Pending connections the kernel may queue. A reconnect storm after a deploy arrives all at
/// once: with the default of 128, the kernel dropped SYNs and clients came back only on their
/// 1, 3, 7 and 15 s retransmits (measured with herald-bench storm; see docs/benchmarks.md).
const LISTEN_BACKLOG: u32 = 4096;

/// The node's listening sockets: one, or several sharing the port (`limits.accept_queues`).
pub struct Listeners(Vec<TcpListener>);

impl Listeners {
    /// The address they listen on.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.0[0].local_addr()
    }
}

/// Bind `queues` listeners with deep accept backlogs, and lift this process's open-file limit
/// to its hard limit (each connection is a descriptor).
///
/// Several listeners share the port through `SO_REUSEPORT`; the kernel caps each accept queue
/// at `net.core.somaxconn` (4096 on common distributions), and a storm of 19,000 reconnects
/// overflowed one queue: the dropped handshakes came back a second later on the client's
/// retransmit (docs/benchmarks.md, round 10). A plain socket is bound first, so a port already
/// in use is refused as before (a `SO_REUSEPORT` bind alone would join another process's
/// group), and port 0 resolves to one free port for all of them.
pub async fn bind(host: &str, port: u16, queues: usize) -> anyhow::Result<Listeners> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(cause = %e, "could not raise the open-file limit"),
    }
    let addr = tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} resolves to no address"))?;
    let new_socket = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        Ok::<_, std::io::Error>(socket)
    };
    let probe = new_socket()?;
    probe
        .bind(addr)
        .with_context(|| format!("binding {addr}"))?;
    if queues <= 1 {
        let listener = probe
            .listen(LISTEN_BACKLOG)
            .with_context(|| format!("listening on {addr}"))?;
        return Ok(Listeners(vec![listener]));
    }
    let addr = probe.local_addr()?;
    drop(probe);
    let mut listeners = Vec::with_capacity(queues);
    for _ in 0..queues {
        let socket = new_socket()?;
        socket.set_reuseport(true)?;
        socket
            .bind(addr)
            .with_context(|| format!("binding {addr}"))?;
        listeners.push(
            socket
                .listen(LISTEN_BACKLOG)
                .with_context(|| format!("listening on {addr}"))?,
        );
    }
    Ok(Listeners(listeners))
}

/// Serve until `shutdown` resolves, then drain: every client is told to reconnect (4000 with a
/// jittered `after_ms`), and the function returns once they are gone or the window has passed.
///
/// `flags` are those the configuration was loaded with: a reload (`SIGHUP`, the admin call)
/// loads it again with them (crate::reload).
pub async fn run(
    listeners: Listeners,
    mut config: Config,
    flags: Overrides,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let addr = listeners.local_addr()?;
    let api_key = match (&config.api_key, config.dev) {
        (Some(k), _) if !k.is_empty() => Some(k.clone()),
        (_, true) => {
            tracing::warn!("dev mode without api_key: the HTTP API is open to anyone on loopback");
            None
        }
        (_, false) => {
            let key = format!("{:032x}", rand::random::<u128>());
            // The key is a secret: never in the logs. A person at a terminal sees it once on
            // stdout; anywhere else the API stays closed until HERALD_API_KEY is set.
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                println!("generated API key for this run: {key} (set HERALD_API_KEY to keep one)");
            }
            tracing::warn!("no api_key configured: generated one for this run, shown only on a terminal (set HERALD_API_KEY)");
            Some(key)
        }
    };
    let api_key_generated = api_key.is_some() && config.api_key.as_deref().unwrap_or("").is_empty();
    config.api_key = api_key.clone();
    let jwks = reload::jwks_for(&config).map_err(anyhow::Error::msg)?;
    let verifier = reload::verifier_for(&config, jwks.as_ref()).map_err(anyhow::Error::msg)?;
    if !verifier.has_keys() && !config.allow_anonymous && config.proxy.connect_url.is_empty() {
        tracing::warn!("no token keys and no anonymous access: clients cannot connect (set HERALD_TOKEN_HMAC_SECRET or use --dev)");
    }
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::acceptor(cert, key)?),
        _ => None,
    };

    // Checked before anything connects: a bad section stops the node at once.
    let consumers = crate::consumers::ConsumersConfig::load(config.consumers.as_ref())?;
    let lifecycle = crate::lifecycle::LifecycleConfig::load(config.lifecycle.as_ref())?;
    ensure_pusher_supported(config.pusher.as_ref(), |k| std::env::var(k).ok(), PUSHER)?;
    let tracer = crate::otel::Tracing::start(config.tracing.as_ref(), &config.node_name)?;
    let check_sections: reload::Check = Box::new(check_sections);
    let broker = crate::brokers::connect(&config).await?;
    let mut metrics = Metrics::new();
    broker.register_metrics(metrics.registry_mut());
    let reload_metrics = ReloadMetrics::register(metrics.registry_mut());
    #[cfg(feature = "pusher")]
    let apps_db_metrics = config
        .pusher
        .as_ref()
        .and_then(|p| p.get("postgres"))
        .map(|_| crate::pusher::apps_db::DbMetrics::register(metrics.registry_mut()));
    let metrics = Arc::new(metrics);
    let hub = Hub::new(config.node_name.clone(), broker, metrics);
    hub.start().await.context("starting the broker")?;
    let lifecycle = match lifecycle {
        Some(lc) => {
            let lc = crate::lifecycle::Lifecycle::start(lc, &config.node_name)
                .await
                .context("starting the lifecycle stream")?;
            hub.set_lifecycle(lc.recorder());
            Some(lc)
        }
        None => None,
    };
    // Behind a slot that a reload refills with a client for the new `[proxy]`.
    let proxy_slot = match config.proxy.enabled() {
        true => Some(Arc::new(ProxySlot::new(
            crate::proxy::HttpProxy::new(&config.proxy).map_err(anyhow::Error::msg)?,
        ))),
        false => None,
    };
    let proxy = proxy_slot
        .clone()
        .map(|p| p as Arc<dyn herald_core::proxy::Proxy>);
    let config = Arc::new(config);
    let namespaces = Namespaces::from_config(&config);
    batch_join_leave(&hub, &config, &namespaces);
    #[cfg(feature = "pusher")]
    let pusher = {
        let mut apps = crate::pusher::Apps::load(config.pusher.as_ref(), &namespaces, |k| {
            std::env::var(k).ok()
        })?;
        if let (Some(db), Some(metrics)) = (&apps.settings.postgres, apps_db_metrics) {
            // One read before serving, so the table's apps are there from the first
            // connection when the database is up; if it is not, the node starts without them.
            let mut poller = crate::pusher::apps_db::Poller::new(
                apps.registry.clone(),
                db,
                metrics,
                &config.node_name,
            )?;
            poller.refresh().await;
            poller.spawn();
        }
        apps.start(&hub);
        if !apps.is_empty() {
            tracing::info!(apps = ?apps.ids(), "Pusher protocol on /app/{{key}} and /apps/{{id}}/");
        }
        apps
    };
    let ctx = Arc::new(NodeContext {
        hub: hub.clone(),
        namespaces,
        verifier,
        config: LiveConfig::new(Config::clone(&config)),
        proxy,
    });
    #[cfg(feature = "pusher")]
    let pusher_apps: Option<reload::ApplyPusherApps> = {
        let registry = pusher.registry.clone();
        Some(Box::new(move |config: &Config| {
            let settings = crate::pusher::apps::PusherConfig::read(config.pusher.as_ref(), |k| {
                std::env::var(k).ok()
            })?;
            registry.replace_configured(settings.apps)
        }))
    };
    #[cfg(not(feature = "pusher"))]
    let pusher_apps = None;
    let reloader = Arc::new(Reloader::new(
        ctx.clone(),
        reload::Options {
            flags,
            proxy: proxy_slot,
            jwks,
            check: check_sections,
            pusher_apps,
            metrics: reload_metrics,
            api_key_generated,
        },
    ));
    let admin = crate::admin::Admin::from_config(&config, api_key.as_deref())?.map(Arc::new);
    if let Some(admin) = &admin {
        admin.start(&hub);
    }
    let (drain_tx, drain_rx) = watch::channel(false);
    // Consumers stop taking records when the node starts to drain.
    let consumers = crate::consumers::Consumers::start(&consumers, &ctx, &drain_rx)?;
    let app = Arc::new(App {
        ctx,
        api_key,
        ws_connections: AtomicUsize::new(0),
        draining: drain_rx,
        per_ip: PerIp::new(config.limits.max_connections_per_ip),
        handshakes: HandshakeRate::new(
            config.limits.handshakes_per_ip_per_s,
            config.limits.handshake_burst_per_ip,
        ),
        sse_connections: AtomicUsize::new(0),
        ndjson_connections: AtomicUsize::new(0),
        emulated_connections: AtomicUsize::new(0),
        reloader: reloader.clone(),
    });
    let node = Arc::new(Node {
        app: app.clone(),
        #[cfg(feature = "pusher")]
        pusher: Arc::new(crate::pusher::Node {
            state: app.clone(),
            apps: pusher,
        }),
        admin: admin.clone(),
        emulated: Arc::default(),
    });

    let scheme = if tls.is_some() { "https" } else { "http" };
    let ws_scheme = if tls.is_some() { "wss" } else { "ws" };
    println!("herald listening on {scheme}://{addr} (WebSocket {ws_scheme}://{addr}/ws)");
    tracing::info!(node = %config.node_name, broker = %herald_broker::redact_url(&config.broker_url), dev = config.dev, %addr, "herald started");
    if admin.is_some() {
        tracing::info!("admin UI: {scheme}://{addr}/admin/");
    }
    if config.dev {
        tracing::info!(
            "try: curl -X POST {scheme}://{addr}/api/publish -d '{{\"channel\":\"chat\",\"data\":{{\"text\":\"hi\"}}}}'{}",
            if config.demo { format!(" · demo page: {scheme}://{addr}/") } else { String::new() }
        );
    }

    let reloads = tokio::spawn(reload_on_sighup(reloader)?);
    let handshake_timeout = Duration::from_millis(config.limits.handshake_timeout_ms);
    // One accept loop per listener; they end (and the listeners close) when the node drains.
    let failures = Arc::new(AcceptFailures::default());
    let accepting: Vec<_> = listeners
        .0
        .into_iter()
        .map(|listener| {
            tokio::spawn(accept_loop(
                listener,
                node.clone(),
                tls.clone(),
                handshake_timeout,
                failures.clone(),
            ))
        })
        .collect();
    shutdown.await;
    reloads.abort();
    for task in &accepting {
        task.abort();
    }
    for task in accepting {
        let _ = task.await;
    }

    let open = app.open_connections();
    tracing::info!(
        connections = open,
        drain_ms = config.drain_ms,
        "draining: clients are told to reconnect elsewhere"
    );
    let _ = drain_tx.send(true);
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(config.drain_ms)
        + Duration::from_secs(2);
    while app.open_connections() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    #[cfg(feature = "pusher")]
    node.pusher.apps.stop().await;
    consumers.stopped(Duration::from_secs(10)).await;
    if let Some(lifecycle) = lifecycle {
        lifecycle.stop(Duration::from_secs(5)).await;
    }
    if let Some(tracer) = tracer {
        tracer.shutdown();
    }
    tracing::info!(left = app.open_connections(), "stopped");
    Ok(())
}

/// Tell the hub which channels batch their joins and leaves: those of namespaces with
/// `join_leave_batch_ms`. Never a Pusher channel (`pusher:<app>:<name>`): pusher-js expects one
/// `member_added` / `member_removed` per member, which the Pusher connection makes from single
/// `join` / `leave` pushes.
///
/// The namespaces are the node's own (a reload that changes `join_leave_batch_ms` reaches the
/// hub through them); whether any batches at all is decided at start-up.
fn batch_join_leave(hub: &Hub, config: &Config, namespaces: &Namespaces) {
    let namespaces = namespaces.clone();
    let any = std::iter::once(&config.default_namespace)
        .chain(&config.namespaces)
        .any(|ns| ns.join_leave_batch_ms > 0);
    if !any {
        return;
    }
    hub.batch_join_leave(move |channel| {
        if channel.starts_with("pusher:") {
            return None;
        }
        let ns = namespaces.resolve(channel).ok()?;
        Some(herald_core::hub::JoinLeaveBatch {
            interval: Duration::from_millis(ns.join_leave_batch_ms),
            counts: ns.join_leave_counts,
        })
    });
}

/// Start-up's checks of the sections other modules load (consumers, Pusher apps), for a reload:
/// a section that would stop the node at start-up refuses the reload.
fn check_sections(config: &Config) -> anyhow::Result<()> {
    crate::consumers::ConsumersConfig::load(config.consumers.as_ref())?;
    ensure_pusher_supported(config.pusher.as_ref(), |k| std::env::var(k).ok(), PUSHER)?;
    #[cfg(feature = "pusher")]
    crate::pusher::Apps::load(
        config.pusher.as_ref(),
        &Namespaces::from_config(config),
        |k| std::env::var(k).ok(),
    )?;
    Ok(())
}

/// Install the `SIGHUP` handler now (before the node says it listens: a `SIGHUP` after that
/// reloads rather than kills it); the future reloads on each one.
fn reload_on_sighup(
    reloader: Arc<Reloader>,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    Ok(async move {
        #[cfg(unix)]
        while hup.recv().await.is_some() {
            // The outcome is logged by the reload itself; reading the file blocks briefly.
            let r = reloader.clone();
            let _ = tokio::task::spawn_blocking(move || r.reload("SIGHUP")).await;
        }
        #[cfg(not(unix))]
        drop(reloader);
    })
}

/// Whether this build has the Pusher protocol (the `pusher` cargo feature).
const PUSHER: bool = cfg!(feature = "pusher");

/// Refuse the Pusher apps that `[pusher]` (`raw`) or `HERALD_PUSHER_APP_ID` (read through `env`)
/// name, in a build without the Pusher protocol (`supported` false): an app the config asks for
/// is never silently left out.
fn ensure_pusher_supported(
    raw: Option<&serde_json::Value>,
    env: impl Fn(&str) -> Option<String>,
    supported: bool,
) -> anyhow::Result<()> {
    let in_file = raw
        .and_then(|v| v.get("apps"))
        .is_some_and(|apps| !matches!(apps, serde_json::Value::Array(a) if a.is_empty()))
        || raw.and_then(|v| v.get("postgres")).is_some();
    if (in_file || env("HERALD_PUSHER_APP_ID").is_some()) && !supported {
        anyhow::bail!(
            "pusher.apps: this build has no Pusher support: rebuild with --features pusher"
        );
    }
    Ok(())
}

/// The accept loops' failures (EMFILE and friends), logged at most once a second across all
/// loops, with how many went unlogged since the last line: each of `limits.accept_queues` loops
/// retries every 50 ms, so a descriptor shortage would otherwise log 160 lines a second.
#[derive(Default)]
struct AcceptFailures(Mutex<FailureLog>);

#[derive(Default)]
struct FailureLog {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl AcceptFailures {
    /// A failure at `now`: `Some(unlogged since the last line)` when it is to be logged.
    fn note(&self, now: Instant) -> Option<u64> {
        let mut log = self.0.lock().expect("accept failures lock");
        match log.last_logged {
            Some(t) if now.duration_since(t) < Duration::from_secs(1) => {
                log.unlogged += 1;
                None
            }
            _ => {
                log.last_logged = Some(now);
                Some(std::mem::take(&mut log.unlogged))
            }
        }
    }
}

/// Accept connections on one listener and serve each in its own task, until aborted.
async fn accept_loop(
    listener: TcpListener,
    node: Arc<Node>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
    failures: Arc<AcceptFailures>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: the connection waits in the kernel's queue; back off
                // briefly instead of spinning, and take it once a descriptor is free.
                if let Some(unlogged) = failures.note(Instant::now()) {
                    tracing::warn!(cause = %e, unlogged, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = node.app.per_ip.admit(peer.ip()) else {
            tracing::debug!(ip = %peer.ip(), "connection refused: limits.max_connections_per_ip");
            continue; // dropping the stream closes it
        };
        let _ = stream.set_nodelay(true);
        let node = node.clone();
        let tls = tls.clone();
        let slot = slot.map(Arc::new);
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let metrics = node.app.ctx.hub.metrics();
                            metrics.tls_handshakes.inc();
                            if s.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed) {
                                metrics.tls_resumed.inc();
                            }
                            serve_connection(node, s, handshake_timeout, peer, slot).await
                        }
                        Ok(Err(e)) => tracing::debug!(cause = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
                None => serve_connection(node, stream, handshake_timeout, peer, slot).await,
            }
        });
    }
}

/// Serve HTTP on one connection. Its per-IP slot travels with each request, so that a WebSocket
/// upgraded out of it keeps the slot for its own lifetime.
async fn serve_connection<S>(
    node: Arc<Node>,
    stream: S,
    handshake_timeout: Duration,
    peer: std::net::SocketAddr,
    slot: Option<Arc<IpSlot>>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // An SSE request that opens the connection is served without hyper, which would keep its
    // HTTP connection state for the stream's whole life (uni/direct.rs).
    let Some(stream) = crate::uni::direct::first_request(
        &node.app,
        stream,
        handshake_timeout,
        peer,
        slot.as_ref(),
    )
    .await
    else {
        return;
    };
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(PeerAddr(peer));
        if let Some(slot) = &slot {
            req.extensions_mut().insert(slot.clone());
        }
        let node = node.clone();
        async move {
            // One-way streams have a body of their own kind; everything else is a full body.
            if crate::uni::is_stream_path(req.uri().path()) {
                let app = node.app.clone();
                return Ok::<_, std::convert::Infallible>(crate::uni::serve(app, req).await);
            }
            if req.uri().path() == crate::emulation::PATH {
                let app = node.app.clone();
                return Ok(crate::emulation::serve(app, &node.emulated, req).await);
            }
            let response = route(node, req).await?;
            Ok(response.map(|body| body.boxed()))
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(handshake_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(cause = %e, "HTTP connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{ensure_pusher_supported, AcceptFailures};

    #[test]
    fn pusher_apps_are_refused_by_a_build_without_pusher() {
        let none = |_: &str| None;
        let app = serde_json::json!({"apps": [{"id": "1", "key": "k", "secret": "s"}]});
        let e = ensure_pusher_supported(Some(&app), none, false).unwrap_err();
        assert!(
            e.to_string().contains("rebuild with --features pusher"),
            "{e}"
        );
        let from_env = |k: &str| (k == "HERALD_PUSHER_APP_ID").then(|| "1".to_owned());
        assert!(ensure_pusher_supported(None, from_env, false).is_err());
        // Nothing named: nothing to refuse. With the protocol: nothing refused here.
        let settings = serde_json::json!({"apps": [], "activity_timeout_s": 30});
        assert!(ensure_pusher_supported(Some(&settings), none, false).is_ok());
        assert!(ensure_pusher_supported(None, none, false).is_ok());
        assert!(ensure_pusher_supported(Some(&app), from_env, true).is_ok());
    }

    #[test]
    fn accept_failures_log_once_a_second_with_the_count_between() {
        let failures = AcceptFailures::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(failures.note(at(0)), Some(0), "the first one is logged");
        assert_eq!(failures.note(at(50)), None);
        assert_eq!(failures.note(at(999)), None);
        assert_eq!(
            failures.note(at(1000)),
            Some(2),
            "a second later, with the two between"
        );
        assert_eq!(failures.note(at(5000)), Some(0));
    }
}
