//! One client connection's protocol state: it turns commands into replies and subscriptions.
//! The transport (WebSocket, timers, writes) lives in the server; the session only queues bytes on
//! its [`Outbound`].
//!
//! # Layout
//! This file holds the session's state, the dispatch of one message ([`Session::handle`]), the
//! hook calls and the permission question every command asks (`permit`, over
//! [`crate::permission::decide`]). Each command has its own file: `connect`, `subscribe` (and
//! `unsubscribe`), `publish`, `history`, `presence`, `rpc`, `refresh` (and `sub_refresh`, token
//! expiry); `controls` is work from outside (API subscribe, lost continuity) and the end of the
//! connection; `context` is [`NodeContext`], what all sessions of a node share.

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
use crate::config::NamespaceConfig;
use crate::hub::{ConnKey, Hub};
use crate::namespace::{NamespaceError, Namespaces};
use crate::outbound::{CloseRequest, Control, Outbound};
use crate::permission::{self, Action, Allowed};
use crate::proxy::{
    ask, failure, Answer, ClientMeta, ConnectRequest, ConnectResult as ProxyConnectResult,
    ConnectedRequest, DataResult, Hook, Proxy, RefreshResult, Refusal, SubOptions,
    SubscribeResult as ProxySubscribeResult, Target,
};
use crate::rate::TokenBucket;
use crate::recovery::SubscribeResult;

mod connect;
mod context;
mod controls;
mod history;
mod presence;
mod publish;
mod refresh;
mod rpc;
mod subscribe;

pub use context::NodeContext;
pub use history::history_body;
pub use presence::{presence_stats_body, PresenceQuery, PresenceReply, MAX_PRESENCE_PAGE};

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
    /// What the hooks' answers gave the connection; boxed, and only when there is any: most
    /// connections have none, and every idle connection's task holds this struct.
    hooked: Option<Box<Hooked>>,
}

/// What the proxy hooks' answers gave a connection.
#[derive(Default)]
struct Hooked {
    /// The connect hook's `meta`: sent with every later hook call, never to the client.
    meta: Option<Box<RawValue>>,
    /// Rights the backend listed for subscriptions (`allow`), by channel.
    grants: HashMap<String, permission::Grants>,
}

impl Connected {
    fn hook_meta(&self) -> Option<&RawValue> {
        self.hooked.as_ref().and_then(|h| h.meta.as_deref())
    }

    fn grants(&self, channel: &str) -> Option<permission::Grants> {
        self.hooked
            .as_ref()
            .and_then(|h| h.grants.get(channel))
            .copied()
    }
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

    /// The backend for a connection-wide `hook`, when its URL is configured.
    fn hook(&self, hook: Hook) -> Option<Arc<dyn Proxy>> {
        self.channel_hook(hook, None)
    }

    /// The backend for `hook` about `channel`, when a URL is configured for it (the channel's
    /// namespace's own, or `[proxy]`'s).
    fn channel_hook(&self, hook: Hook, channel: Option<&str>) -> Option<Arc<dyn Proxy>> {
        let namespace = self.namespace_of(channel);
        if self.ctx.config.proxy.hook_url(hook, &namespace).is_empty() {
            return None;
        }
        self.ctx.proxy.clone()
    }

    /// The name of `channel`'s namespace ("" for none or the default namespace).
    /// (Owned: a reload may replace the namespaces while a hook call waits.)
    fn namespace_of(&self, channel: Option<&str>) -> String {
        channel
            .and_then(|c| self.ctx.namespaces.resolve(c).ok())
            .map_or_else(String::new, |ns| ns.name.clone())
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
            conn_meta: conn.hook_meta(),
        };
        let namespace = self.namespace_of(channel);
        let target = Target {
            hook,
            namespace: &namespace,
            headers: &self.meta().headers,
        };
        match ask::<T>(proxy, &target, &body, self.ctx.hub.metrics()).await {
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

    /// The client id, once `connect` succeeded.
    pub fn client_id(&self) -> Option<&str> {
        self.connected.as_ref().map(|c| &*c.client)
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
            Command::PresenceStats(p) => self.presence_stats(id, p).await.map_err(Refusal::from),
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
            grants: conn.grants(channel),
        };
        let allowed = permission::decide(&ns, channel, &client, action)?;
        Ok((ns, allowed))
    }
}
