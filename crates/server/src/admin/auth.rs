//! Who may use the admin UI: `[admin]` settings, login sessions, CSRF tokens and the `Origin`
//! check.
//!
//! A browser logs in with the admin password (`POST /admin/login`) and gets an HttpOnly,
//! SameSite=Strict session cookie plus a CSRF token in the answer body; every state-changing call
//! must echo that token in `X-Herald-CSRF`, so a page on another site cannot act with the cookie.
//! Scripts send `Authorization: Bearer <password or token>` instead (no cookie, so no CSRF).
//! The client API key is never compared here: it cannot reach the admin API. Any call that
//! carries an `Origin` other than the node's own is refused.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_protocol::ErrorCode;
use hyper::header::{self, HeaderMap};
use hyper::StatusCode;
use serde::Deserialize;

use super::limit::{Locked, LoginLimit};
use crate::api::ApiError;

/// The session cookie's name.
pub const COOKIE: &str = "herald_admin";
/// The header a state-changing call echoes the CSRF token in.
pub const CSRF_HEADER: &str = "x-herald-csrf";
/// Sessions kept at most per node; the oldest is dropped beyond (bounds memory under a flood of
/// logins).
const MAX_SESSIONS: usize = 1000;

/// `[admin]` as written in the config file or `HERALD_ADMIN__*`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Serve the UI under `/admin` (default: on in `--dev`, off otherwise).
    pub enabled: Option<bool>,
    /// The password of `POST /admin/login` (also accepted as a bearer token).
    #[serde(deserialize_with = "lenient_string")]
    pub password: Option<String>,
    /// A bearer token for scripts (`Authorization: Bearer …`), besides the password.
    #[serde(deserialize_with = "lenient_string")]
    pub token: Option<String>,
    /// How long a login lasts, in seconds (default 12 hours).
    pub session_ttl_s: Option<u64>,
    /// Failed logins (or bearer tokens) one source address may make per window before it is
    /// refused until the window ends (default 10).
    pub max_failed_logins_per_ip: Option<u32>,
    /// Failed logins from all sources together per window before every login is refused, a
    /// correct password included, until the window ends (default 30).
    pub max_failed_logins: Option<u32>,
    /// The window of both limits, in seconds, from the first failure counted (default 60); also
    /// how often a summary of failed logins is logged.
    pub login_window_s: Option<u64>,
}

/// Numbers from the environment arrive as numbers; a password is text either way.
fn lenient_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<serde_json::Value>::deserialize(d)?;
    Ok(match v {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    })
}

impl AdminConfig {
    /// Parse `[admin]` (absent: all defaults).
    pub fn parse(raw: Option<&serde_json::Value>) -> anyhow::Result<AdminConfig> {
        match raw {
            None => Ok(AdminConfig::default()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| anyhow::anyhow!("invalid [admin] configuration: {e}")),
        }
    }
}

/// How a call was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A bearer token: a script, no CSRF needed. Which one: `password` or `token`.
    Bearer(&'static str),
    /// A browser session that passed the CSRF check where one was needed: the n-th login on
    /// this node.
    Session(u64),
}

impl Caller {
    /// Who acted, for the audit log: the credential's name or the login's number, never a
    /// secret.
    pub fn who(&self) -> String {
        match self {
            Caller::Bearer(which) => (*which).to_owned(),
            Caller::Session(n) => session_name(*n),
        }
    }
}

/// The audit log's name of the n-th login on this node.
pub fn session_name(n: u64) -> String {
    format!("session-{n}")
}

/// Why a call is refused.
#[derive(Debug)]
pub enum Denied {
    /// Wrong or missing credentials, another origin, a missing CSRF token.
    Error(ApiError),
    /// Too many failed logins: refused without a look at the credentials (429, `Retry-After`).
    Locked(Locked),
}

impl From<ApiError> for Denied {
    fn from(e: ApiError) -> Self {
        Denied::Error(e)
    }
}

struct Session {
    csrf: String,
    expires: Instant,
    /// The n-th login on this node: names the session in the audit log (the id is a secret).
    login: u64,
}

/// Credentials and the sessions logged in on this node.
pub struct AdminAuth {
    password: Option<String>,
    token: Option<String>,
    /// `--dev` without a password: any login succeeds (a dev node only answers loopback hosts).
    open: bool,
    session_ttl: Duration,
    secure_cookie: bool,
    sessions: Mutex<HashMap<String, Session>>,
    /// Logins so far on this node (numbers the sessions for the audit log).
    logins: AtomicU64,
    /// Failed logins and bearer tokens, per source and overall.
    pub limit: Arc<LoginLimit>,
}

impl AdminAuth {
    /// Checks the settings: outside `--dev` a password or token is required, and neither may be
    /// the client API key (which must never open the admin API).
    pub fn new(
        cfg: &AdminConfig,
        dev: bool,
        api_key: Option<&str>,
        tls: bool,
    ) -> anyhow::Result<AdminAuth> {
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        let password = nonempty(&cfg.password);
        let token = nonempty(&cfg.token);
        if password.is_none() && token.is_none() && !dev {
            anyhow::bail!(
                "[admin] is enabled without a password or token (set HERALD_ADMIN__PASSWORD)"
            );
        }
        if let Some(key) = api_key {
            if password.as_deref() == Some(key) || token.as_deref() == Some(key) {
                anyhow::bail!("[admin] password and token must differ from api_key");
            }
        }
        Ok(AdminAuth {
            open: password.is_none() && token.is_none(),
            password,
            token,
            session_ttl: Duration::from_secs(cfg.session_ttl_s.unwrap_or(12 * 3600).max(1)),
            secure_cookie: tls,
            sessions: Mutex::default(),
            logins: AtomicU64::new(0),
            limit: Arc::new(LoginLimit::new(
                cfg.max_failed_logins_per_ip.unwrap_or(10),
                cfg.max_failed_logins.unwrap_or(30),
                Duration::from_secs(cfg.login_window_s.unwrap_or(60)),
            )),
        })
    }

    /// Whether a login needs a password (false only in `--dev` without one).
    pub fn password_required(&self) -> bool {
        !self.open
    }

    /// A new session for a correct password from `source`: (session id, CSRF token, the
    /// login's number); `None` for a wrong one, `Err` while the login limit refuses `source`.
    pub fn login(
        &self,
        source: IpAddr,
        given: &str,
    ) -> Result<Option<(String, String, u64)>, Locked> {
        // The token is for scripts (bearer only); a browser logs in with the password.
        let ok = self.limit.attempt(source, Instant::now(), || {
            self.open || self.password.as_deref().is_some_and(|p| same(p, given))
        })?;
        if !ok {
            return Ok(None);
        }
        let sid = random_token();
        let csrf = random_token();
        let login = self.logins.fetch_add(1, Ordering::Relaxed) + 1;
        let mut sessions = self.sessions.lock().expect("sessions lock");
        let now = Instant::now();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            sid.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + self.session_ttl,
                login,
            },
        );
        Ok(Some((sid, csrf, login)))
    }

    /// Forget the session of this request's cookie.
    pub fn logout(&self, headers: &HeaderMap) {
        if let Some(sid) = session_id(headers) {
            self.sessions.lock().expect("sessions lock").remove(&sid);
        }
    }

    /// The CSRF token of this request's session, if it is logged in.
    pub fn session_csrf(&self, headers: &HeaderMap) -> Option<String> {
        self.session(headers).map(|(csrf, _)| csrf)
    }

    /// The CSRF token and login number of this request's session, if it is logged in.
    fn session(&self, headers: &HeaderMap) -> Option<(String, u64)> {
        let sid = session_id(headers)?;
        let sessions = self.sessions.lock().expect("sessions lock");
        sessions
            .get(&sid)
            .filter(|s| s.expires > Instant::now())
            .map(|s| (s.csrf.clone(), s.login))
    }

    /// `Set-Cookie` for a new session.
    pub fn cookie(&self, sid: &str) -> String {
        format!(
            "{COOKIE}={sid}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={}{}",
            self.session_ttl.as_secs(),
            if self.secure_cookie { "; Secure" } else { "" }
        )
    }

    /// `Set-Cookie` that clears the session cookie.
    pub fn clear_cookie(&self) -> String {
        format!("{COOKIE}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    /// Authenticate an admin API call from `source`; `changes_state` calls from a browser session
    /// must carry the session's CSRF token. A bearer token is a guess like a login's password:
    /// it counts against the same limit.
    pub fn check(
        &self,
        headers: &HeaderMap,
        source: IpAddr,
        changes_state: bool,
    ) -> Result<Caller, Denied> {
        same_origin(headers)?;
        if let Some(given) = bearer(headers) {
            let mut which = None;
            self.limit
                .attempt(source, Instant::now(), || {
                    if self.password.as_deref().is_some_and(|p| same(p, given)) {
                        which = Some("password");
                    } else if self.token.as_deref().is_some_and(|t| same(t, given)) {
                        which = Some("token");
                    }
                    which.is_some()
                })
                .map_err(Denied::Locked)?;
            return if let Some(which) = which {
                Ok(Caller::Bearer(which))
            } else {
                Err(ApiError::code(
                    ErrorCode::Unauthorized,
                    "wrong admin token (the client API key does not open the admin API)",
                )
                .into())
            };
        }
        let Some((csrf, login)) = self.session(headers) else {
            return Err(ApiError::code(
                ErrorCode::Unauthorized,
                "log in first (POST /admin/login) or send Authorization: Bearer <admin token>",
            )
            .into());
        };
        if changes_state {
            let echoed = headers
                .get(CSRF_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !same(&csrf, echoed) {
                return Err(ApiError::code(
                    ErrorCode::PermissionDenied,
                    "missing or wrong X-Herald-CSRF header",
                )
                .into());
            }
        }
        Ok(Caller::Session(login))
    }
}

/// Refuse a call whose `Origin` is not this node's own (`Host`, compared by
/// [`crate::guard::same_origin`]). Calls without `Origin` (scripts, same-origin GETs) pass;
/// browsers always send it on POST.
pub fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    if headers.get(header::ORIGIN).is_none() || crate::guard::same_origin(headers) {
        Ok(())
    } else {
        Err(ApiError::with_status(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            "cross-origin admin calls are refused",
        ))
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty())
}

/// Constant-time comparison: these are secrets.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn auth() -> AdminAuth {
        let cfg = AdminConfig {
            password: Some("pw".into()),
            ..AdminConfig::default()
        };
        AdminAuth::new(&cfg, false, Some("apikey"), false).unwrap()
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn sessions_need_csrf_for_changes_and_api_key_never_works() {
        let a = auth();
        assert!(a.login(IP, "wrong").unwrap().is_none());
        let with_token = AdminConfig {
            token: Some("tk".into()),
            ..AdminConfig::default()
        };
        let t = AdminAuth::new(&with_token, false, None, false).unwrap();
        assert!(
            t.login(IP, "tk").unwrap().is_none(),
            "the token is not a login password"
        );
        assert!(t.login(IP, "").unwrap().is_none());
        let (sid, csrf, n) = a.login(IP, "pw").unwrap().unwrap();
        assert_eq!(n, 1);
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("x=1; {COOKIE}={sid}")).unwrap(),
        );
        assert_eq!(a.check(&h, IP, false).unwrap(), Caller::Session(1));
        assert_eq!(Caller::Session(1).who(), "session-1");
        assert!(a.check(&h, IP, true).is_err(), "no CSRF header");
        h.insert(CSRF_HEADER, HeaderValue::from_str(&csrf).unwrap());
        assert!(a.check(&h, IP, true).is_ok());
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8000"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(a.check(&h, IP, true).is_err(), "other origin");
        let mut k = HeaderMap::new();
        k.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer apikey"),
        );
        assert!(a.check(&k, IP, false).is_err(), "client API key");
        k.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer pw"));
        assert_eq!(a.check(&k, IP, true).unwrap(), Caller::Bearer("password"));
    }

    #[test]
    fn a_password_is_required_outside_dev_and_must_not_be_the_api_key() {
        let none = AdminConfig::default();
        assert!(AdminAuth::new(&none, false, None, false).is_err());
        assert!(AdminAuth::new(&none, true, None, false)
            .unwrap()
            .login(IP, "")
            .unwrap()
            .is_some());
        let same_as_key = AdminConfig {
            password: Some("k".into()),
            ..AdminConfig::default()
        };
        assert!(AdminAuth::new(&same_as_key, false, Some("k"), false).is_err());
    }
}
