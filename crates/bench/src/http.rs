//! A tiny HTTP/1.1 keep-alive client over TCP (or TLS for `https://`, see [`crate::tls`]): enough
//! for `POST /api/*`, `GET /metrics` and `GET /health`, with nothing between the publisher's
//! schedule and the socket.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::tls::Stream;

/// A base URL split into what a request needs.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` to dial and to send as `Host`.
    pub authority: String,
    /// `https://`: TLS to the node (the CA from `--tls-ca`).
    pub tls: bool,
}

impl Target {
    /// Parses `http://host:port` or `https://host:port` (a trailing path is ignored).
    ///
    /// # Errors
    /// Not an `http://` or `https://` URL.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .with_context(|| format!("not an http:// or https:// URL: {url}"))?;
        let authority = rest.split('/').next().unwrap_or(rest).to_string();
        Ok(Self {
            authority,
            tls: crate::tls::is_tls_url(url),
        })
    }
}

/// One keep-alive connection; reconnects on the next request after an error.
pub struct Client {
    target: Target,
    auth: Option<String>,
    conn: Option<BufReader<Stream>>,
}

/// A response: status and body.
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Client {
    /// A client for `target`, sending `Authorization: Bearer key` when a key is given.
    pub fn new(target: Target, api_key: Option<&str>) -> Self {
        Self {
            target,
            auth: api_key.map(|k| format!("Authorization: Bearer {k}\r\n")),
            conn: None,
        }
    }

    /// A client for `target` that sends the key as `X-API-Key: key` (Centrifugo's HTTP API,
    /// `--centrifugo`).
    pub fn with_x_api_key(target: Target, api_key: &str) -> Self {
        Self {
            target,
            auth: Some(format!("X-API-Key: {api_key}\r\n")),
            conn: None,
        }
    }

    /// Sends one request and reads the whole response; one retry on a stale keep-alive socket.
    ///
    /// # Errors
    /// Connect, I/O or a malformed response.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Response> {
        let fresh = self.conn.is_none();
        match self.try_request(method, path, body).await {
            Ok(r) => Ok(r),
            Err(_) if !fresh => {
                self.conn = None;
                self.try_request(method, path, body).await
            }
            Err(e) => Err(e),
        }
    }

    async fn try_request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Response> {
        if self.conn.is_none() {
            let s = tokio::time::timeout(
                Duration::from_secs(5),
                TcpStream::connect(&self.target.authority),
            )
            .await
            .context("connect timed out")??;
            s.set_nodelay(true)?;
            let host = crate::tls::url_host(&self.target.authority);
            let s = crate::tls::wrap(s, self.target.tls, host)
                .await
                .map_err(anyhow::Error::msg)?;
            self.conn = Some(BufReader::new(s));
        }
        let res = self.exchange(method, path, body).await;
        if res.is_err() {
            self.conn = None;
        }
        res
    }

    async fn exchange(&mut self, method: &str, path: &str, body: Option<&str>) -> Result<Response> {
        let conn = self.conn.as_mut().expect("connected above");
        let body = body.unwrap_or("");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.target.authority,
            self.auth.as_deref().unwrap_or(""),
            body.len()
        );
        let mut req = head.into_bytes();
        req.extend_from_slice(body.as_bytes());
        conn.get_mut().write_all(&req).await?;
        let (resp, close) = read_response(conn).await?;
        if close {
            // The server will not reuse this socket; the next request dials anew.
            self.conn = None;
        }
        Ok(resp)
    }
}

async fn read_response(conn: &mut BufReader<Stream>) -> Result<(Response, bool)> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        bail!("connection closed");
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {line:?}"))?;
    let (mut len, mut chunked, mut close) = (None, false, false);
    loop {
        line.clear();
        if conn.read_line(&mut line).await? == 0 {
            bail!("connection closed in headers");
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            match k.as_str() {
                "content-length" => len = v.parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                "connection" => close = v.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            conn.read_line(&mut line).await?;
            let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)?;
            if n == 0 {
                line.clear();
                conn.read_line(&mut line).await?;
                break;
            }
            let at = body.len();
            body.resize(at + n, 0);
            conn.read_exact(&mut body[at..]).await?;
            let mut crlf = [0u8; 2];
            conn.read_exact(&mut crlf).await?;
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        conn.read_exact(&mut body).await?;
    } else {
        conn.read_to_end(&mut body).await?;
        close = true;
    }
    Ok((Response { status, body }, close))
}

/// `GET url path` once, on a fresh connection.
///
/// # Errors
/// Any transport error.
pub async fn get(base: &str, path: &str) -> Result<Response> {
    Client::new(Target::parse(base)?, None)
        .request("GET", path, None)
        .await
}

/// Polls `GET {path}` (`/health` on Herald) until it answers 200 or `wait` passes.
///
/// # Errors
/// The node never became healthy.
pub async fn wait_healthy(base: &str, path: &str, wait: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Ok(r) = get(base, path).await {
            if r.status == 200 {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{base}{path} did not answer 200 within {wait:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
