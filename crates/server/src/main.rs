//! `herald`: a real-time messaging server. `main` only parses flags, loads the config, sets up
//! logging, binds, and hands over to [`herald_server::serve::run`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use herald_broker::redact_url;
use herald_server::settings::{self, Overrides};
use herald_server::token::{mint, TokenRequest};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

// jemalloc instead of glibc's malloc: a broadcast allocates frames on the hub's thread that the
// connections' tasks free on others, and glibc's per-arena locks then took ~20% of the node's CPU
// in futex waits. Measured (docs/benchmarks.md, "allocator"): one broadcast to 100,000 personal
// channels reached the last member in 324–488 ms instead of 586–869 ms, idle memory per
// connection 8.2 KB instead of 9.0–10.0 KB; mimalloc was faster too but held 12.6 KB idle.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Herald: WebSocket pub/sub with per-channel history, recovery and presence.
#[derive(Parser)]
#[command(name = "herald", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node. With no configuration: an in-memory node on 127.0.0.1:8000 that logs a
    /// generated API key. Every config key can be set as HERALD_<KEY> (see docs/config.md).
    Serve(ServeArgs),
    /// Print an HS256 token signed with HERALD_TOKEN_HMAC_SECRET (for development and scripts).
    Token(TokenArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1).
    #[arg(long)]
    bind: Option<String>,
    /// Port to listen on (default 8000; 0 picks a free one).
    #[arg(long, short)]
    port: Option<u16>,
    /// Development mode: anonymous clients may connect, subscribe, publish and read history and
    /// presence in the default namespace; serves the demo page; loopback only.
    #[arg(long)]
    dev: bool,
    /// Serve the demo page at / (on by default in --dev).
    #[arg(long)]
    demo: bool,
    /// TLS certificate chain (PEM), for https:// and wss://.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

#[derive(Args)]
struct TokenArgs {
    /// The user id (`sub`).
    #[arg(long, default_value = "")]
    sub: String,
    /// Seconds until the token expires (default: never).
    #[arg(long)]
    expires_in: Option<u64>,
    /// Channels the server subscribes at connect (comma-separated).
    #[arg(long, value_delimiter = ',')]
    channels: Vec<String>,
    /// Make a subscription token for this channel instead.
    #[arg(long)]
    channel: Option<String>,
    /// `info` claim as JSON.
    #[arg(long)]
    info: Option<String>,
    /// HS256 secret.
    #[arg(long, env = "HERALD_TOKEN_HMAC_SECRET", hide_env_values = true)]
    secret: String,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A start-up error may quote a URL from the settings, in Herald's words or in a
            // client library's: its password never reaches the terminal.
            eprintln!("Error: {}", redact_url(&format!("{e:?}")));
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Token(t) => {
            let req = TokenRequest {
                sub: t.sub,
                expires_in: t.expires_in,
                channels: t.channels,
                channel: t.channel,
                info: t.info,
            };
            println!("{}", mint(&t.secret, &req)?);
            Ok(())
        }
        Command::Serve(args) => serve(args),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let flags = Overrides {
        config: args.config,
        bind: args.bind,
        port: args.port,
        dev: args.dev,
        demo: args.demo,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
    };
    let config = settings::load(&flags)?;
    init_logging(&config.log_format, &config.log_level);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // Handlers first: a SIGTERM that arrives once the node says it listens must drain it,
        // not kill it.
        let shutdown = shutdown_signal()?;
        let queues = config.limits.accept_queues;
        let listeners = herald_server::serve::bind(&config.bind, config.port, queues).await?;
        herald_server::serve::run(listeners, config, flags, shutdown).await
    })
}

fn init_logging(format: &str, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colour codes only on a terminal: a log file or collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(RedactedStderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Log lines go to stderr with every URL's password hidden: the one place that also covers the
/// lines of client libraries (the NATS client prints its server's URL at `debug`).
struct RedactedStderr;

impl<'a> MakeWriter<'a> for RedactedStderr {
    type Writer = RedactedLine;

    fn make_writer(&'a self) -> RedactedLine {
        RedactedLine(Vec::new())
    }
}

/// One log event, collected and written out redacted when the formatter is done with it.
struct RedactedLine(Vec<u8>);

impl Write for RedactedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactedLine {
    fn drop(&mut self) {
        let line = redact_url(&String::from_utf8_lossy(&self.0));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// Install the SIGINT/SIGTERM handlers now; the future resolves on the first signal.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let (mut int, mut term) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        )
    };
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received");
    })
}
