//! One client connection's protocol state: it turns commands into replies and subscriptions.
//! The transport (WebSocket, timers, writes) lives in the server; the session only queues bytes on
//! its [`Outbound`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use herald_broker::{BrokerError, HistoryQuery, PublishOptions};
use herald_protocol::command::{
    ChannelParams, ConnectParams, HistoryParams, Message, PublishParams, RefreshParams, RpcParams,
    SubRefreshParams, SubscribeParams,
};
use herald_protocol::depth::{json_depth, MAX_DATA_DEPTH};
use herald_protocol::encode::{push_subscribed, push_unsub, reply, reply_error, reply_error_code};
use herald_protocol::types::PublicationWire;
use herald_protocol::{
    codes, ClientInfo, CloseCode, Command, CommandError, ErrorCode, StreamPosition,
};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::auth::{AuthError, TokenVerifier};
use crate::config::{Config, NamespaceConfig};
use crate::hub::{ConnKey, Hub};
use crate::namespace::{NamespaceError, Namespaces};
use crate::outbound::{CloseRequest, Control, Outbound};
use crate::permission::{self, Action, Allowed};
use crate::proxy::{
    ask, failure, Answer, ClientMeta, ConnectRequest, ConnectResult as ProxyConnectResult,
    ConnectedRequest, DataResult, Hook, Proxy, RefreshResult, Refusal,
    SubscribeResult as ProxySubscribeResult,
};
use crate::rate::TokenBucket;
use crate::recovery::SubscribeResult;

/// What every session of a node shares.
pub struct NodeContext {
    /// The hub.
    pub hub: Hub,
    /// Namespaces from the config.
    pub namespaces: Namespaces,
    /// Token keys.
    pub verifier: TokenVerifier,
    /// The node's configuration.
    pub config: Arc<Config>,
    /// The application's backend, when any proxy hook is configured.
    pub proxy: Option<Arc<dyn Proxy>>,
}

struct Connected {
    key: ConnKey,
    client: Arc<str>,
    user: Arc<str>,
    info: Option<Box<RawValue>>,
    expires_at: Option<Instant>,
    channels: HashMap<String, Arc<NamespaceConfig>>,
    /// Channels the server subscribed (token `channels` claim, API `subscribe`): the client
    /// cannot resubscribe them itself, so losing one closes the connection with 4003 instead.
    server_side: HashSet<String>,
    /// When subscriptions granted by an expiring subscription token end, unless `sub_refresh`
    /// extends them.
    sub_expires: HashMap<String, Instant>,
    /// Authenticated by the connect proxy: at its expiry the refresh hook may extend it.
    proxied: bool,
    /// Subscriptions the subscribe hook granted with an expiry: the sub_refresh hook extends them.
    proxied_subs: HashSet<String>,
}

impl Connected {
    fn who(&self) -> ClientInfo {
        ClientInfo {
            user: self.user.to_string(),
            client: self.client.to_string(),
            info: self.info.clone(),
        }
    }
}

/// A connection's session. See the module docs.
pub struct Session {
    ctx: Arc<NodeContext>,
    out: Arc<Outbound>,
    connected: Option<Connected>,
    rate: TokenBucket,
    /// The client's HTTP request as the proxy hooks see it (set by the transport).
    meta: Option<Arc<ClientMeta>>,
}

/// Meta of a session whose transport set none.
static NO_META: ClientMeta = ClientMeta {
    transport: "",
    ip: None,
    headers: std::collections::BTreeMap::new(),
    cookies: std::collections::BTreeMap::new(),
};

/// A subscription's first half, with the subscribe proxy's `data` for the reply.
type Prepared = (SubscribeResult, Option<Box<RawValue>>);

fn close(code: CloseCode, reason: impl Into<String>) -> CloseRequest {
    CloseRequest {
        code,
        reason: reason.into(),
        after_ms: None,
    }
}

fn broker_error(e: BrokerError) -> CommandError {
    match e {
        BrokerError::Unavailable { message: m, .. } => {
            CommandError::new(ErrorCode::TemporarilyUnavailable, m)
        }
        BrokerError::Internal { message: m, .. } => {
            tracing::error!(cause = %m, "broker error");
            CommandError::new(ErrorCode::Internal, "internal error")
        }
    }
}

/// Refuse publication data nested deeper than [`MAX_DATA_DEPTH`] (error 107).
pub fn check_data_depth(data: &str) -> Result<(), CommandError> {
    if json_depth(data) > MAX_DATA_DEPTH {
        return Err(CommandError::new(
            ErrorCode::BadRequest,
            format!("data nests deeper than {MAX_DATA_DEPTH} levels"),
        ));
    }
    Ok(())
}

fn ns_error(e: NamespaceError) -> CommandError {
    e.into()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Expiries further away than this are treated as this far (an `Instant` cannot hold u64::MAX
/// seconds from now).
const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `expires_in` seconds and the matching deadline for a token's `exp`.
fn expiry(exp: Option<u64>) -> (Option<u64>, Option<Instant>) {
    match exp {
        Some(exp) => {
            let secs = exp.saturating_sub(unix_now()).min(MAX_EXPIRY.as_secs());
            (Some(secs), Some(Instant::now() + Duration::from_secs(secs)))
        }
        None => (None, None),
    }
}

#[derive(Serialize)]
struct ConnectResult<'a> {
    client: &'a str,
    node: &'a str,
    ping_interval: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_in: Option<u64>,
    /// The connect proxy's `data` for the client.
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
    subs: HashMap<&'a str, SubReply<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum SubReply<'a> {
    Ok {
        #[serde(flatten)]
        result: &'a SubscribeResult,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
    },
    Err {
        error: ErrorBody,
    },
}

#[derive(Serialize)]
struct ErrorBody {
    code: u16,
    message: String,
}

impl From<&Refusal> for ErrorBody {
    fn from(r: &Refusal) -> Self {
        let (code, message) = match r {
            Refusal::Command(e) => (e.code.as_u16(), e.message.clone()),
            Refusal::App { code, message } => (*code, message.clone()),
            Refusal::Close { code, reason } => (code.0, reason.clone()),
        };
        ErrorBody { code, message }
    }
}

/// Who `connect` authenticated, by token or by the connect proxy.
struct Authenticated {
    user: String,
    info: Option<Box<RawValue>>,
    exp: Option<u64>,
    channels: Vec<String>,
    /// The connect proxy's `data` for the client.
    data: Option<Box<RawValue>>,
    proxied: bool,
}

/// Longest `rpc` method name.
const MAX_RPC_METHOD_LEN: usize = 255;

impl Session {
    /// A session for a connection that has not sent `connect` yet.
    pub fn new(ctx: Arc<NodeContext>, out: Arc<Outbound>) -> Self {
        let limits = &ctx.config.limits;
        let rate = TokenBucket::new(limits.commands_per_second, limits.command_burst);
        Session {
            ctx,
            out,
            connected: None,
            rate,
            meta: None,
        }
    }

    /// What the proxy hooks are told about the client's HTTP request.
    pub fn set_client_meta(&mut self, meta: ClientMeta) {
        self.meta = Some(Arc::new(meta));
    }

    fn meta(&self) -> &ClientMeta {
        self.meta.as_deref().unwrap_or(&NO_META)
    }

    /// The backend for `hook`, when its URL is configured.
    fn hook(&self, hook: Hook) -> Option<Arc<dyn Proxy>> {
        let p = &self.ctx.config.proxy;
        let url = match hook {
            Hook::Connect => &p.connect_url,
            Hook::Refresh => &p.refresh_url,
            Hook::Subscribe => &p.subscribe_url,
            Hook::SubRefresh => &p.sub_refresh_url,
            Hook::Publish => &p.publish_url,
            Hook::Rpc => &p.rpc_url,
        };
        if url.is_empty() {
            return None;
        }
        self.ctx.proxy.clone()
    }

    /// Call a hook for the connected client; a failed call is already the client's refusal.
    async fn ask_connected<T: serde::de::DeserializeOwned>(
        &self,
        proxy: &dyn Proxy,
        hook: Hook,
        channel: Option<&str>,
        method: Option<&str>,
        data: Option<&RawValue>,
    ) -> Result<T, Refusal> {
        let conn = self.connected.as_ref().expect("connected");
        let body = ConnectedRequest {
            client: &conn.client,
            user: &conn.user,
            meta: self.meta(),
            channel,
            method,
            data,
        };
        match ask::<T>(proxy, hook, &body, self.ctx.hub.metrics()).await {
            Ok(Answer::Result(r)) => Ok(r),
            Ok(Answer::Error(refusal)) => Err(refusal),
            Err(e) => Err(failure(hook, e)),
        }
    }

    /// Answer a refused command: an error reply, or the close request.
    fn refuse(&self, id: u64, refusal: Refusal) -> Option<CloseRequest> {
        match refusal {
            Refusal::Command(e) => self.reply_err(id, &e),
            Refusal::App { code, message } => {
                self.out.push(reply_error_code(id, code, &message));
            }
            Refusal::Close { code, reason } => return Some(close(code, reason)),
        }
        None
    }

    /// Whether `connect` succeeded.
    pub fn is_connected(&self) -> bool {
        self.connected.is_some()
    }

    /// The next token deadline: the connection token's expiry or a subscription token's. The
    /// transport calls [`Session::expire`] when it passes.
    pub fn expires_at(&self) -> Option<Instant> {
        let conn = self.connected.as_ref()?;
        let subs = conn.sub_expires.values().min().copied();
        match (conn.expires_at, subs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// End what expired by `now`: each subscription whose token expired gets `unsub` 4004; an
    /// expired connection token returns the close request (4004).
    pub async fn expire(&mut self, now: Instant) -> Option<CloseRequest> {
        let conn = self.connected.as_ref()?;
        if conn.expires_at.is_some_and(|exp| exp <= now) {
            match (conn.proxied, self.hook(Hook::Refresh)) {
                (true, Some(proxy)) => {
                    if let Some(req) = self.refresh_by_proxy(proxy.as_ref()).await {
                        return Some(req);
                    }
                }
                _ => return Some(close(CloseCode::TOKEN_EXPIRED, "token expired")),
            }
        }
        let conn = self.connected.as_ref()?;
        let expired: Vec<String> = conn
            .sub_expires
            .iter()
            .filter(|(_, exp)| **exp <= now)
            .map(|(channel, _)| channel.clone())
            .collect();
        for channel in expired {
            let conn = self.connected.as_ref().expect("connected");
            let by_proxy = conn.proxied_subs.contains(&channel);
            if by_proxy {
                if let Some(proxy) = self.hook(Hook::SubRefresh) {
                    match self.sub_refresh_by_proxy(proxy.as_ref(), &channel).await {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(req) => return Some(req),
                    }
                }
            }
            if self.leave(&channel).await {
                self.out.push(push_unsub(
                    &channel,
                    codes::UNSUB_TOKEN_EXPIRED,
                    match by_proxy {
                        true => "subscription expired",
                        false => "subscription token expired",
                    },
                ));
            }
        }
        None
    }

    /// Ask the sub_refresh hook to extend a proxy-granted subscription that expires now: true
    /// when extended, false when it ends, the close request when the backend disconnects.
    async fn sub_refresh_by_proxy(
        &mut self,
        proxy: &dyn Proxy,
        channel: &str,
    ) -> Result<bool, CloseRequest> {
        let r = self
            .ask_connected::<RefreshResult>(proxy, Hook::SubRefresh, Some(channel), None, None)
            .await;
        let conn = self.connected.as_mut().expect("connected");
        match r {
            Ok(r) if !r.expired => match expiry(r.expire_at).1 {
                Some(at) if at <= Instant::now() => Ok(false),
                Some(at) => {
                    conn.sub_expires.insert(channel.to_owned(), at);
                    Ok(true)
                }
                None => {
                    conn.sub_expires.remove(channel);
                    Ok(true)
                }
            },
            Err(Refusal::Close { code, reason }) => Err(close(code, reason)),
            // Expired, refused, or no usable answer: the subscription ends; the client may
            // subscribe again (and the subscribe hook decides).
            _ => Ok(false),
        }
    }

    /// Ask the refresh hook to extend a proxy-authenticated connection that expires now.
    async fn refresh_by_proxy(&mut self, proxy: &dyn Proxy) -> Option<CloseRequest> {
        let r = self
            .ask_connected::<RefreshResult>(proxy, Hook::Refresh, None, None, None)
            .await;
        let conn = self.connected.as_mut().expect("connected");
        match r {
            Ok(r) if !r.expired => {
                conn.expires_at = expiry(r.expire_at).1;
                if r.info.is_some() {
                    conn.info = r.info;
                }
                // An expiry already past would ask again at once: treat it as expired.
                if conn.expires_at.is_some_and(|at| at <= Instant::now()) {
                    return Some(close(CloseCode::TOKEN_EXPIRED, "connection expired"));
                }
                None
            }
            Ok(_) => Some(close(CloseCode::TOKEN_EXPIRED, "connection expired")),
            Err(Refusal::Close { code, reason }) => Some(close(code, reason)),
            Err(Refusal::Command(e)) if e.code == ErrorCode::BackendUnavailable => Some(close(
                CloseCode::BACKEND_ERROR,
                "backend unavailable for refresh",
            )),
            Err(_) => Some(close(CloseCode::TOKEN_EXPIRED, "connection expired")),
        }
    }

    /// Handle one client message. Returns a close request when the connection must end.
    pub async fn handle(&mut self, message: Message) -> Option<CloseRequest> {
        let (id, command) = match message {
            Message::Pong => return None,
            Message::Command { id, command } => (id, command),
        };
        self.ctx.hub.metrics().commands.inc();
        if !self.rate.try_take(Instant::now()) {
            self.reply_err(id, &ErrorCode::TooManyRequests.into());
            return None;
        }
        let command = match command {
            Ok(c) => c,
            Err(e) if self.connected.is_none() => {
                self.reply_err(id, &e);
                return Some(close(
                    CloseCode::BAD_REQUEST,
                    "first command must be a valid connect",
                ));
            }
            Err(e) => {
                self.reply_err(id, &e);
                return None;
            }
        };
        if self.connected.is_none() {
            return match command {
                Command::Connect(p) => self.connect(id, p).await,
                _ => Some(close(
                    CloseCode::BAD_REQUEST,
                    "first command must be connect",
                )),
            };
        }
        let method = command.method().name();
        let result: Result<Bytes, Refusal> = match command {
            Command::Connect(_) => {
                Err(CommandError::new(ErrorCode::BadRequest, "already connected").into())
            }
            Command::Subscribe(p) => match self.subscribe(id, p).await {
                Ok(()) => return None,
                Err(e) => Err(e),
            },
            Command::Unsubscribe(p) => self
                .unsubscribe(p)
                .await
                .map(|_| reply(id, method, &serde_json::json!({})))
                .map_err(Refusal::from),
            Command::Publish(p) => self.publish(p).await.map(|pos| reply(id, method, &pos)),
            Command::History(p) => self.history(id, p).await.map_err(Refusal::from),
            Command::Presence(p) => self.presence(id, p).await.map_err(Refusal::from),
            Command::Refresh(p) => self.refresh(id, p).await.map_err(Refusal::from),
            Command::SubRefresh(p) => self.sub_refresh(id, p).await.map_err(Refusal::from),
            Command::Rpc(p) => self.rpc(id, p).await,
        };
        match result {
            Ok(bytes) => {
                self.out.push(bytes);
                None
            }
            Err(refusal) => self.refuse(id, refusal),
        }
    }

    fn reply_err(&self, id: u64, e: &CommandError) {
        self.out.push(reply_error(id, e.code, &e.message));
    }

    async fn connect(&mut self, id: u64, params: ConnectParams) -> Option<CloseRequest> {
        let client: Arc<str> = Arc::from(format!("{:016x}", rand::random::<u64>()));
        let token = params.token.as_deref().filter(|t| !t.is_empty());
        if let Some(proxy) = self.hook(Hook::Connect) {
            if token.is_none() || self.ctx.config.proxy.connect_always {
                let body = ConnectRequest {
                    client: &client,
                    meta: self.meta(),
                    name: params.name.as_deref(),
                    version: params.version.as_deref(),
                    data: params.data.as_deref(),
                };
                let result = match ask::<ProxyConnectResult>(
                    proxy.as_ref(),
                    Hook::Connect,
                    &body,
                    self.ctx.hub.metrics(),
                )
                .await
                {
                    Ok(Answer::Result(r)) => r,
                    Ok(Answer::Error(refusal)) => {
                        return self.refuse(id, refusal).or_else(|| {
                            Some(close(
                                CloseCode::REFUSED_BY_BACKEND,
                                "connection refused by the application",
                            ))
                        })
                    }
                    Err(e) => {
                        let unavailable = matches!(e, crate::proxy::ProxyError::Unavailable(_));
                        self.refuse(id, failure(Hook::Connect, e));
                        let reason = match unavailable {
                            true => "backend unavailable",
                            false => "backend error",
                        };
                        return Some(close(CloseCode::BACKEND_ERROR, reason));
                    }
                };
                let auth = Authenticated {
                    user: result.user,
                    info: result.info,
                    exp: result.expire_at,
                    channels: result.channels,
                    data: result.data,
                    proxied: true,
                };
                return self.connected(id, client, auth, params).await;
            }
        }
        let claims = match token {
            Some(token) => match self.ctx.verifier.connection(token).await {
                Ok(c) => Some(c),
                Err(AuthError::Expired) => {
                    self.reply_err(id, &ErrorCode::TokenExpired.into());
                    return Some(close(CloseCode::TOKEN_EXPIRED, "token expired"));
                }
                Err(AuthError::Invalid(why)) => {
                    self.reply_err(id, &CommandError::new(ErrorCode::Unauthorized, why));
                    return Some(close(CloseCode::UNAUTHORIZED, "invalid token"));
                }
            },
            None if self.ctx.config.allow_anonymous => None,
            None => {
                self.reply_err(
                    id,
                    &CommandError::new(ErrorCode::Unauthorized, "a connection token is required"),
                );
                return Some(close(CloseCode::UNAUTHORIZED, "token required"));
            }
        };
        let auth = match claims {
            Some(c) => Authenticated {
                user: c.sub,
                info: c.info,
                exp: c.exp,
                channels: c.channels,
                data: None,
                proxied: false,
            },
            None => Authenticated {
                user: String::new(),
                info: None,
                exp: None,
                channels: Vec::new(),
                data: None,
                proxied: false,
            },
        };
        self.connected(id, client, auth, params).await
    }

    /// Register an authenticated connection, subscribe its channels, and reply.
    async fn connected(
        &mut self,
        id: u64,
        client: Arc<str>,
        auth: Authenticated,
        params: ConnectParams,
    ) -> Option<CloseRequest> {
        let Authenticated {
            user,
            info,
            exp,
            channels: granted,
            data,
            proxied,
        } = auth;
        let (expires_in, expires_at) = expiry(exp);
        let mut granted = granted;
        let pattern = &self.ctx.config.personal_channel;
        if !pattern.is_empty() && !user.is_empty() {
            let personal = pattern.replace("{user}", &user);
            if !granted.contains(&personal) {
                granted.push(personal);
            }
        }
        let user: Arc<str> = Arc::from(user);
        let key = self
            .ctx
            .hub
            .register(client.clone(), user.clone(), self.out.clone());
        self.connected = Some(Connected {
            key,
            client: client.clone(),
            user,
            info,
            expires_at,
            channels: HashMap::new(),
            server_side: HashSet::new(),
            sub_expires: HashMap::new(),
            proxied,
            proxied_subs: HashSet::new(),
        });

        // Server-side channels from the token, then the client's own `subs`, in one reply.
        let mut wanted: Vec<(String, Option<StreamPosition>, Option<String>, bool)> =
            granted.into_iter().map(|c| (c, None, None, true)).collect();
        for (channel, opts) in params.subs {
            match wanted.iter_mut().find(|w| w.0 == channel) {
                Some(w) => w.1 = opts.since,
                None => wanted.push((channel, opts.since, opts.token, false)),
            }
        }
        let mut results: Vec<(String, Result<Prepared, Refusal>)> = Vec::new();
        let mut budget = self.recovery_budget();
        for (channel, since, token, granted) in wanted {
            let mut r = self
                .prepare(&channel, token.as_deref(), since.as_ref(), granted, None)
                .await;
            match &mut r {
                Ok((result, _)) => self.charge_recovery(result, &mut budget),
                // The subscribe proxy ended the connection.
                Err(Refusal::Close { code, reason }) => return Some(close(*code, reason.clone())),
                Err(_) => {}
            }
            results.push((channel, r));
        }
        let connect_result = ConnectResult {
            client: &client,
            node: self.ctx.hub.node_name(),
            ping_interval: self.ctx.config.ping_interval_s,
            expires_in,
            data: data.as_deref(),
            subs: results
                .iter()
                .map(|(ch, r)| {
                    let sub = match r {
                        Ok((result, data)) => SubReply::Ok {
                            result,
                            data: data.as_deref(),
                        },
                        Err(e) => SubReply::Err {
                            error: ErrorBody::from(e),
                        },
                    };
                    (ch.as_str(), sub)
                })
                .collect(),
        };
        let recovering = results.iter().any(|(_, r)| {
            r.as_ref()
                .is_ok_and(|(result, _)| result.carries_publications())
        });
        self.push_reply(reply(id, "connect", &connect_result), recovering);
        for (channel, r) in results {
            if let Ok((result, _)) = r {
                self.activate(&channel, &result).await;
            }
        }
        None
    }

    /// Checks and first half of a subscription (see [`Hub::prepare_subscription`]).
    async fn prepare(
        &mut self,
        channel: &str,
        token: Option<&str>,
        since: Option<&StreamPosition>,
        granted: bool,
        data: Option<&RawValue>,
    ) -> Result<Prepared, Refusal> {
        let ctx = self.ctx.clone();
        let conn = self.connected.as_ref().expect("connected");
        let ns = ctx.namespaces.resolve(channel).map_err(ns_error)?.clone();
        if conn.channels.contains_key(channel) {
            return Err(ErrorCode::AlreadySubscribed.into());
        }
        if conn.channels.len() >= ctx.config.limits.max_channels_per_connection {
            return Err(CommandError::new(
                ErrorCode::LimitExceeded,
                "too many channels on this connection",
            )
            .into());
        }
        let mut token_exp = None;
        let has_subscription_token = match token {
            Some(t) => match ctx.verifier.subscription(t, &conn.user, channel).await {
                Ok(claims) => {
                    token_exp = claims.exp;
                    true
                }
                Err(AuthError::Expired) => return Err(ErrorCode::TokenExpired.into()),
                Err(AuthError::Invalid(why)) => {
                    return Err(CommandError::new(
                        ErrorCode::PermissionDenied,
                        format!("subscription token: {why}"),
                    )
                    .into())
                }
            },
            None => false,
        };
        let client = permission::Client {
            user: &conn.user,
            subscribed: false,
            granted,
            has_subscription_token,
        };
        let by_proxy = permission::decide(&ns, channel, &client, Action::Subscribe)
            .map_err(CommandError::from)?
            == Allowed::IfSubscribeHookAllows;
        let mut reply_data = None;
        if by_proxy {
            let Some(proxy) = self.hook(Hook::Subscribe) else {
                return Err(CommandError::new(
                    ErrorCode::Internal,
                    "subscribe proxy not configured",
                )
                .into());
            };
            let r: ProxySubscribeResult = self
                .ask_connected(proxy.as_ref(), Hook::Subscribe, Some(channel), None, data)
                .await?;
            reply_data = r.data;
            token_exp = r.expire_at;
        }
        let conn = self.connected.as_mut().expect("connected");
        let result = ctx
            .hub
            .prepare_subscription(channel, conn.key, &self.out, since, &ns)
            .await
            .map_err(broker_error)?;
        conn.channels.insert(channel.to_owned(), ns);
        if let (Some(at), false) = (expiry(token_exp).1, granted) {
            conn.sub_expires.insert(channel.to_owned(), at);
        }
        if granted {
            conn.server_side.insert(channel.to_owned());
        }
        if by_proxy && token_exp.is_some() {
            conn.proxied_subs.insert(channel.to_owned());
        }
        Ok((result, reply_data))
    }

    /// Second half: after the reply is queued, go live and announce presence.
    async fn activate(&mut self, channel: &str, result: &SubscribeResult) {
        let conn = self.connected.as_ref().expect("connected");
        self.ctx.hub.activate(channel, conn.key, &result.position);
        let Some(ns) = conn.channels.get(channel) else {
            return;
        };
        if ns.presence {
            let who = conn.who();
            let broker = self.ctx.hub.broker();
            if let Err(e) = broker.add_presence(channel, &who).await {
                tracing::warn!(channel, cause = %e, "presence not recorded");
            }
            if ns.join_leave {
                if let Err(e) = broker.publish_presence_change(channel, true, &who).await {
                    tracing::warn!(channel, cause = %e, "join not published");
                }
            }
        }
    }

    /// Recovered bytes one reply may carry: `limits.max_recovery_bytes`, less what earlier
    /// recovery replies still waiting in the queue hold.
    fn recovery_budget(&self) -> usize {
        self.out
            .recovery_room(self.ctx.config.limits.max_recovery_bytes)
    }

    /// Queue a reply; one that carries recovered publications does not count against the
    /// queue's bound while it waits, so an allowed recovery is always delivered (see
    /// [`Outbound::push_recovery`]).
    fn push_reply(&self, frame: Bytes, recovering: bool) {
        if recovering {
            self.out.push_recovery(frame);
        } else {
            self.out.push(frame);
        }
    }

    /// Bound the recovered publications of one reply (see `limits.max_recovery_bytes`).
    fn charge_recovery(&self, result: &mut SubscribeResult, budget: &mut usize) {
        if !result.charge(budget) {
            self.ctx.hub.metrics().recovery_over_budget.inc();
        }
    }

    async fn subscribe(&mut self, id: u64, p: SubscribeParams) -> Result<(), Refusal> {
        let (mut result, data) = self
            .prepare(
                &p.channel,
                p.token.as_deref(),
                p.since.as_ref(),
                false,
                p.data.as_deref(),
            )
            .await?;
        let mut budget = self.recovery_budget();
        self.charge_recovery(&mut result, &mut budget);
        let expires_in = self
            .connected
            .as_ref()
            .and_then(|c| c.sub_expires.get(&p.channel))
            .map(|at| at.saturating_duration_since(Instant::now()).as_secs());
        #[derive(Serialize)]
        struct Subscribed<'a> {
            #[serde(flatten)]
            result: &'a SubscribeResult,
            /// Seconds until the subscription token expires (then `sub_refresh` or `unsub` 4004).
            #[serde(skip_serializing_if = "Option::is_none")]
            expires_in: Option<u64>,
            /// The subscribe proxy's `data` for the client.
            #[serde(skip_serializing_if = "Option::is_none")]
            data: Option<&'a RawValue>,
        }
        let subscribed = Subscribed {
            result: &result,
            expires_in,
            data: data.as_deref(),
        };
        self.push_reply(
            reply(id, "subscribe", &subscribed),
            result.carries_publications(),
        );
        self.activate(&p.channel, &result).await;
        Ok(())
    }

    /// Leave a channel: hub, presence and leave push.
    async fn leave(&mut self, channel: &str) -> bool {
        let conn = self.connected.as_mut().expect("connected");
        let Some(ns) = conn.channels.remove(channel) else {
            return false;
        };
        conn.server_side.remove(channel);
        conn.sub_expires.remove(channel);
        conn.proxied_subs.remove(channel);
        self.ctx.hub.unsubscribe(channel, conn.key).await;
        if ns.presence {
            let broker = self.ctx.hub.broker();
            if let Err(e) = broker.remove_presence(channel, &conn.client).await {
                tracing::warn!(channel, cause = %e, "presence not removed");
            }
            if ns.join_leave {
                if let Err(e) = broker
                    .publish_presence_change(channel, false, &conn.who())
                    .await
                {
                    tracing::warn!(channel, cause = %e, "leave not published");
                }
            }
        }
        true
    }

    async fn unsubscribe(&mut self, p: ChannelParams) -> Result<(), CommandError> {
        self.ctx.namespaces.resolve(&p.channel).map_err(ns_error)?;
        self.leave(&p.channel).await;
        Ok(())
    }

    /// May this connection do `action` on `channel`? The one question every command asks
    /// ([`permission::decide`]); the namespace comes back for the caller's other checks.
    fn permit(
        &self,
        channel: &str,
        action: Action,
    ) -> Result<(Arc<NamespaceConfig>, Allowed), CommandError> {
        let conn = self.connected.as_ref().expect("connected");
        let ns = self
            .ctx
            .namespaces
            .resolve(channel)
            .map_err(ns_error)?
            .clone();
        let client = permission::Client {
            user: &conn.user,
            subscribed: conn.channels.contains_key(channel),
            granted: conn.server_side.contains(channel),
            has_subscription_token: false,
        };
        let allowed = permission::decide(&ns, channel, &client, action)?;
        Ok((ns, allowed))
    }

    async fn publish(&mut self, p: PublishParams) -> Result<StreamPosition, Refusal> {
        let (ns, allowed) = self.permit(&p.channel, Action::Publish)?;
        check_data_depth(p.data.get())?;
        let mut data = Bytes::copy_from_slice(p.data.get().as_bytes());
        if allowed == Allowed::IfPublishHookAllows {
            let Some(proxy) = self.hook(Hook::Publish) else {
                return Err(
                    CommandError::new(ErrorCode::Internal, "publish proxy not configured").into(),
                );
            };
            let r: DataResult = self
                .ask_connected(
                    proxy.as_ref(),
                    Hook::Publish,
                    Some(&p.channel),
                    None,
                    Some(&p.data),
                )
                .await?;
            if let Some(rewritten) = r.data {
                if json_depth(rewritten.get()) > MAX_DATA_DEPTH {
                    tracing::error!(channel = %p.channel, "publish proxy's data nests too deep");
                    return Err(ErrorCode::Internal.into());
                }
                data = Bytes::copy_from_slice(rewritten.get().as_bytes());
            }
        }
        let conn = self.connected.as_ref().expect("connected");
        let info = conn.who();
        let opts = PublishOptions {
            stream: ns.stream_options(),
            idempotency_key: None,
        };
        let position = self
            .ctx
            .hub
            .publish(&p.channel, data, Some(info), &opts)
            .await
            .map_err(broker_error)?;
        Ok(position)
    }

    /// `rpc`: the backend's `result.data` is the reply.
    async fn rpc(&mut self, id: u64, p: RpcParams) -> Result<Bytes, Refusal> {
        let Some(proxy) = self.hook(Hook::Rpc) else {
            return Err(CommandError::new(ErrorCode::NotAvailable, "rpc is not configured").into());
        };
        if p.method.len() > MAX_RPC_METHOD_LEN {
            return Err(CommandError::new(
                ErrorCode::BadRequest,
                format!("rpc method longer than {MAX_RPC_METHOD_LEN} bytes"),
            )
            .into());
        }
        if let Some(data) = &p.data {
            check_data_depth(data.get())?;
        }
        let r: DataResult = self
            .ask_connected(
                proxy.as_ref(),
                Hook::Rpc,
                None,
                Some(&p.method),
                p.data.as_deref(),
            )
            .await?;
        #[derive(Serialize)]
        struct RpcReply<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            data: Option<&'a RawValue>,
        }
        Ok(reply(
            id,
            "rpc",
            &RpcReply {
                data: r.data.as_deref(),
            },
        ))
    }

    async fn history(&mut self, id: u64, p: HistoryParams) -> Result<Bytes, CommandError> {
        let (ns, _) = self.permit(&p.channel, Action::History)?;
        if !ns.history || ns.history_size == 0 {
            return Err(CommandError::new(
                ErrorCode::NotAvailable,
                "this namespace keeps no history for clients",
            ));
        }
        let query = HistoryQuery {
            since: p.since,
            limit: p.limit,
        };
        let h = self
            .ctx
            .hub
            .broker()
            .history(&p.channel, &query, &ns.stream_options())
            .await
            .map_err(broker_error)?;
        Ok(reply(id, "history", &HistoryReply::from(&h)))
    }

    async fn presence(&mut self, id: u64, p: ChannelParams) -> Result<Bytes, CommandError> {
        let (ns, _) = self.permit(&p.channel, Action::Presence)?;
        if !ns.presence {
            return Err(CommandError::new(
                ErrorCode::NotAvailable,
                "presence is off in this namespace",
            ));
        }
        let clients = self
            .ctx
            .hub
            .broker()
            .presence(&p.channel)
            .await
            .map_err(broker_error)?;
        Ok(reply(id, "presence", &PresenceReply::from(&clients[..])))
    }

    async fn refresh(&mut self, id: u64, p: RefreshParams) -> Result<Bytes, CommandError> {
        let claims = match self.ctx.verifier.connection(&p.token).await {
            Ok(c) => c,
            Err(AuthError::Expired) => return Err(ErrorCode::TokenExpired.into()),
            Err(AuthError::Invalid(why)) => {
                return Err(CommandError::new(ErrorCode::Unauthorized, why))
            }
        };
        let conn = self.connected.as_mut().expect("connected");
        if claims.sub != *conn.user {
            return Err(CommandError::new(
                ErrorCode::Unauthorized,
                "token is for another user",
            ));
        }
        let (expires_in, expires_at) = expiry(claims.exp);
        conn.expires_at = expires_at;
        #[derive(Serialize)]
        struct Refreshed {
            #[serde(skip_serializing_if = "Option::is_none")]
            expires_in: Option<u64>,
        }
        Ok(reply(id, "refresh", &Refreshed { expires_in }))
    }

    /// Extend a subscription granted by an expiring subscription token with a new token.
    async fn sub_refresh(&mut self, id: u64, p: SubRefreshParams) -> Result<Bytes, CommandError> {
        let user = {
            let conn = self.connected.as_ref().expect("connected");
            if !conn.sub_expires.contains_key(&p.channel) {
                return Err(CommandError::new(
                    ErrorCode::BadRequest,
                    "no subscription with an expiring token on this channel",
                ));
            }
            conn.user.clone()
        };
        let claims = match self
            .ctx
            .verifier
            .subscription(&p.token, &user, &p.channel)
            .await
        {
            Ok(c) => c,
            Err(AuthError::Expired) => return Err(ErrorCode::TokenExpired.into()),
            Err(AuthError::Invalid(why)) => {
                return Err(CommandError::new(
                    ErrorCode::PermissionDenied,
                    format!("subscription token: {why}"),
                ))
            }
        };
        let conn = self.connected.as_mut().expect("connected");
        let (expires_in, expires_at) = expiry(claims.exp);
        match expires_at {
            Some(at) => conn.sub_expires.insert(p.channel, at),
            None => conn.sub_expires.remove(&p.channel),
        };
        #[derive(Serialize)]
        struct Refreshed {
            #[serde(skip_serializing_if = "Option::is_none")]
            expires_in: Option<u64>,
        }
        Ok(reply(id, "sub_refresh", &Refreshed { expires_in }))
    }

    /// Act on controls from the API (server-side subscribe / unsubscribe).
    pub async fn handle_controls(&mut self, controls: Vec<Control>) {
        if self.connected.is_none() {
            return;
        }
        for control in controls {
            match control {
                Control::Subscribe(channel) => {
                    match self.prepare(&channel, None, None, true, None).await {
                        Ok((result, _)) => {
                            self.out.push(push_subscribed(&channel, &result));
                            self.activate(&channel, &result).await;
                        }
                        Err(e) => {
                            tracing::debug!(channel, cause = ?e, "server-side subscribe skipped")
                        }
                    }
                }
                Control::Unsubscribe(channel) => {
                    if self.leave(&channel).await {
                        self.out.push(push_unsub(
                            &channel,
                            codes::UNSUB_SERVER,
                            "unsubscribed by the server",
                        ));
                    }
                }
                Control::Lost { channel, reason } => {
                    let conn = self.connected.as_ref().expect("connected");
                    let server_side = conn.server_side.contains(&channel);
                    if !self.leave(&channel).await {
                        continue;
                    }
                    if server_side {
                        self.out.close(close(CloseCode::INSUFFICIENT_STATE, reason));
                    } else {
                        self.out
                            .push(push_unsub(&channel, codes::UNSUB_RESUBSCRIBE, &reason));
                    }
                }
            }
        }
    }

    /// The connection is gone: leave every channel and forget the client.
    pub async fn end(mut self) {
        let Some(conn) = self.connected.as_ref() else {
            return;
        };
        let channels: Vec<String> = conn.channels.keys().cloned().collect();
        let client = conn.client.clone();
        for channel in channels {
            self.leave(&channel).await;
        }
        self.ctx.hub.unregister(&client);
    }
}

#[derive(Serialize)]
struct HistoryReply<'a> {
    epoch: &'a str,
    offset: u64,
    publications: Vec<PublicationWire<'a>>,
    /// With `since`: false when history no longer holds everything after it (extra field).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    incomplete: bool,
}

impl<'a> From<&'a herald_broker::HistoryResult> for HistoryReply<'a> {
    fn from(h: &'a herald_broker::HistoryResult) -> Self {
        HistoryReply {
            epoch: &h.position.epoch,
            offset: h.position.offset,
            publications: h.publications.iter().map(PublicationWire::from).collect(),
            incomplete: !h.continuous,
        }
    }
}

/// `{"clients": {client: {"user", "info"?}}}`.
#[derive(Serialize)]
pub struct PresenceReply<'a> {
    clients: HashMap<&'a str, PresenceEntry<'a>>,
}

#[derive(Serialize)]
struct PresenceEntry<'a> {
    user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    info: Option<&'a RawValue>,
}

impl<'a> From<&'a [ClientInfo]> for PresenceReply<'a> {
    fn from(clients: &'a [ClientInfo]) -> Self {
        PresenceReply {
            clients: clients
                .iter()
                .map(|c| {
                    (
                        c.client.as_str(),
                        PresenceEntry {
                            user: &c.user,
                            info: c.info.as_deref(),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// `history` reply body, shared with the HTTP API. Fails (never panics) on stored data that no
/// JSON parser here can read back, e.g. nested past serde_json's limit.
pub fn history_body(
    h: &herald_broker::HistoryResult,
) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(HistoryReply::from(h))
}
