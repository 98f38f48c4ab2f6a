//! Loading the configuration: defaults ← TOML file ← `HERALD_*` environment ← flags.
//!
//! Every key of [`Config`] can be set from the environment: `HERALD_<KEY>` for top-level keys and
//! `HERALD_<SECTION>__<KEY>` for nested ones (`HERALD_LIMITS__MAX_FRAME_BYTES=1024`).

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use herald_core::Config;

/// Flags that override the file and the environment.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--config`
    pub config: Option<PathBuf>,
    /// `--bind`
    pub bind: Option<String>,
    /// `--port`
    pub port: Option<u16>,
    /// `--dev`
    pub dev: bool,
    /// `--demo`
    pub demo: bool,
    /// `--tls-cert`
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`
    pub tls_key: Option<PathBuf>,
}

/// Top-level keys read from `HERALD_*` (other `HERALD_*` variables, such as those test harnesses
/// set, are ignored rather than rejected).
const ENV_KEYS: &[&str] = &[
    "bind",
    "port",
    "node_name",
    "dev",
    "demo",
    "api_key",
    "broker_url",
    "tls_cert",
    "tls_key",
    "allow_anonymous",
    "token_hmac_secret",
    "token_rsa_public_key",
    "token_rsa_public_key_file",
    "token_ecdsa_public_key",
    "token_ecdsa_public_key_file",
    "token_require_exp",
    "token_audience",
    "token_issuer",
    "token_jwks_url",
    "token_jwks_max_age_s",
    "token_jwks_min_refresh_ms",
    "personal_channel",
    "allowed_origins",
    "api_allowed_origins",
    "ping_interval_s",
    "pong_timeout_s",
    "drain_ms",
    "log_format",
    "log_level",
    "limits",
    "default_namespace",
    "redis",
    "nats",
    "proxy",
    "consumers",
    "admin",
    "tracing",
    "lifecycle",
];

/// Load and validate the configuration.
pub fn load(flags: &Overrides) -> anyhow::Result<Config> {
    load_with_name(flags, None)
}

/// Load and validate the configuration again (a reload): a node whose name was generated keeps
/// it, rather than getting another.
pub fn load_keeping_name(flags: &Overrides, running_name: &str) -> anyhow::Result<Config> {
    load_with_name(flags, Some(running_name))
}

fn load_with_name(flags: &Overrides, running_name: Option<&str>) -> anyhow::Result<Config> {
    if let Some(path) = &flags.config {
        if !path.exists() {
            bail!("config file {} does not exist", path.display());
        }
    }
    let file = || flags.config.as_ref().map(Toml::file);
    // `dev` may come from a flag, the file or the environment; it only changes defaults, so the
    // file and the environment still win over what it opens up.
    let mut probe = Figment::new();
    if let Some(f) = file() {
        probe = probe.merge(f);
    }
    let dev = flags.dev
        || probe
            .merge(env_provider())
            .extract_inner::<bool>("dev")
            .unwrap_or(false);
    let mut figment = Figment::from(Serialized::defaults(DefaultsShim::default()));
    if dev {
        figment = figment.merge(Serialized::defaults(Config::dev_defaults()));
    }
    if let Some(f) = file() {
        figment = figment.merge(f);
    }
    figment = figment.merge(env_provider());
    let mut config: Config = figment.extract().context("invalid configuration")?;
    if let Some(bind) = &flags.bind {
        config.bind = bind.clone();
    }
    if let Some(port) = flags.port {
        config.port = port;
    }
    config.dev |= flags.dev;
    config.demo |= flags.demo;
    if flags.tls_cert.is_some() {
        config.tls_cert = flags.tls_cert.clone();
    }
    if flags.tls_key.is_some() {
        config.tls_key = flags.tls_key.clone();
    }
    if config.dev {
        let ip: IpAddr = config
            .bind
            .parse()
            .with_context(|| format!("--dev needs an IP address to bind, got {:?}", config.bind))?;
        if !ip.is_loopback() {
            bail!(
                "--dev opens everything to anonymous clients and only binds to loopback, not {ip}"
            );
        }
    }
    if let (true, Some(name)) = (config.node_name.is_empty(), running_name) {
        config.node_name = name.to_owned();
    }
    if config.node_name.is_empty() {
        config.node_name = format!("herald-{:06x}", rand::random::<u32>() & 0xff_ffff);
    }
    config.validate().map_err(anyhow::Error::msg)?;
    Ok(config)
}

/// `HERALD_*` variables that name config keys (`HERALD_PING_INTERVAL` is a short alias).
fn env_provider() -> Env {
    Env::prefixed("HERALD_")
        .split("__")
        .map(|k| {
            if k.as_str().eq_ignore_ascii_case("ping_interval") {
                "ping_interval_s".into()
            } else {
                k.into()
            }
        })
        .filter(|k| {
            // Figment hands keys over as written (upper case); it lowercases them later.
            let top = k
                .as_str()
                .split('.')
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            ENV_KEYS.contains(&top.as_str())
        })
}

/// An empty provider: defaults come from `Config::default()` through serde's `#[serde(default)]`.
#[derive(Default, serde::Serialize)]
struct DefaultsShim {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_env_and_flags_layer() {
        #[allow(clippy::result_large_err)]
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "herald.toml",
                r#"
                port = 9100
                api_key = "from-file"
                [limits]
                max_frame_bytes = 4096
                [[namespaces]]
                name = "chat"
                publish = true
                "#,
            )?;
            jail.set_env("HERALD_API_KEY", "12345");
            jail.set_env("HERALD_LIMITS__MAX_CHANNELS_PER_CONNECTION", "7");
            jail.set_env("HERALD_BIN", "/not/a/config/key");
            let flags = Overrides {
                config: Some("herald.toml".into()),
                bind: Some("127.0.0.1".into()),
                ..Overrides::default()
            };
            let c = load(&flags).expect("loads");
            assert_eq!(c.port, 9100);
            assert_eq!(
                c.api_key.as_deref(),
                Some("12345"),
                "env wins over file, numbers stay strings"
            );
            assert_eq!(c.limits.max_frame_bytes, 4096);
            assert_eq!(c.limits.max_channels_per_connection, 7);
            assert!(c.namespaces[0].publish);
            Ok(())
        });
    }

    #[test]
    // figment's Jail closures return figment::Error, which is large by design.
    #[allow(clippy::result_large_err)]
    fn dev_opens_defaults_that_the_file_can_close() {
        figment::Jail::expect_with(|jail| {
            let dev = load(&Overrides {
                dev: true,
                ..Overrides::default()
            })
            .expect("dev loads");
            assert!(dev.allow_anonymous && dev.demo);
            assert!(dev.default_namespace.publish && dev.default_namespace.join_leave);
            assert_eq!(dev.default_namespace.history_size, 1000);

            jail.create_file(
                "quiet.toml",
                "dev = true\n[default_namespace]\njoin_leave = false\nhistory_size = 10\n",
            )?;
            let quiet = load(&Overrides {
                config: Some("quiet.toml".into()),
                ..Overrides::default()
            })
            .expect("loads");
            assert!(
                quiet.dev && quiet.allow_anonymous,
                "dev from the file counts"
            );
            assert!(
                !quiet.default_namespace.join_leave,
                "the file wins over dev defaults"
            );
            assert_eq!(quiet.default_namespace.history_size, 10);
            assert!(quiet.default_namespace.publish);
            Ok(())
        });
    }

    #[test]
    fn proxy_keys_come_from_the_file_and_the_environment() {
        #[allow(clippy::result_large_err)]
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "herald.toml",
                "[proxy]\nrpc_url = \"http://app/rpc\"\ncookies = [\"sessionid\"]\n\
                 [[namespaces]]\nname = \"room\"\nsubscribe_proxy = true\n",
            )?;
            jail.set_env("HERALD_PROXY__SUBSCRIBE_URL", "http://app/subscribe");
            jail.set_env("HERALD_PROXY__TIMEOUT_MS", "250");
            let c = load(&Overrides {
                config: Some("herald.toml".into()),
                ..Overrides::default()
            })
            .expect("loads");
            assert_eq!(c.proxy.rpc_url, "http://app/rpc");
            assert_eq!(c.proxy.subscribe_url, "http://app/subscribe");
            assert_eq!(c.proxy.timeout_ms, 250);
            assert_eq!(c.proxy.cookies, ["sessionid"]);
            assert!(c.namespaces[0].subscribe_proxy);
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_public_dev_are_refused() {
        #[allow(clippy::result_large_err)]
        figment::Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "prot = 1")?;
            let flags = Overrides {
                config: Some("bad.toml".into()),
                ..Overrides::default()
            };
            assert!(load(&flags).is_err());
            let dev = Overrides {
                dev: true,
                bind: Some("0.0.0.0".into()),
                ..Overrides::default()
            };
            assert!(load(&dev).is_err());
            Ok(())
        });
    }
}
