//! One Pusher connection's protocol state: its subscriptions (through the hub, as every Herald
//! connection's), presence members, client events, and the translation of hub pushes into
//! Pusher events. The WebSocket task in [`super::ws`] drives it.
//!
//! Cache channels (`cache-`, `private-cache-`, …): a new subscriber reads the channel from its
//! last publication on (the position before it goes as `since` to the hub, which answers that
//! publication and anything after it consistently with live delivery), and is sent the newest
//! of them after `subscription_succeeded`, or `pusher:cache_miss` when there is none.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use herald_broker::{HistoryQuery, PublishOptions};
use herald_core::config::NamespaceConfig;
use herald_core::hub::ConnKey;
use herald_core::outbound::Control;
use herald_core::permission;
use herald_core::rate::TokenBucket;
use herald_core::{Hub, Outbound};
use herald_protocol::{ClientInfo, StreamPosition};
use serde_json::value::RawValue;

use super::apps::{is_cache, valid_channel, ChannelKind, PusherApp, USER_CHANNEL_PREFIX};
use super::auth::{channel_authorized, user_authenticated};
use super::census::Census;
use super::codes;
use super::counting::Counting;
use super::direct::PusherDirect;
use super::limits;
use super::shared::SharedFrames;
use super::watchlist::{self, Watched};
use super::webhooks::Webhooks;
use super::wire::{
    self, ChannelData, ClientMessage, Envelope, SigninData, SubscribeData, UnsubscribeData,
    UserData,
};
use super::Node;
use crate::ws::shared::Locked;

/// What the connection shares with the node: two handles, read through accessors (every idle
/// connection keeps this, so it holds no copies of settings).
pub struct ConnContext {
    /// The node, as Pusher's endpoints see it.
    pub node: Arc<Node>,
    /// The connection's app.
    pub app: Arc<PusherApp>,
}

impl ConnContext {
    fn hub(&self) -> &Hub {
        &self.node.state.ctx.hub
    }

    /// Stream options of a Pusher channel (cache channels keep their last event longer).
    fn namespace(&self, channel: &str) -> &Arc<NamespaceConfig> {
        self.node.apps.namespace_for(channel)
    }

    /// Channels one connection may join.
    fn max_channels(&self) -> usize {
        self.node
            .state
            .ctx
            .config
            .limits
            .max_channels_per_connection
    }

    /// Largest event data.
    fn max_event_bytes(&self) -> usize {
        self.app
            .max_event_bytes(self.node.apps.settings.max_event_bytes)
    }

    /// Subscription counts for this app's subscribers, when the app enables them.
    fn counting(&self) -> Option<&Arc<Counting>> {
        self.node
            .apps
            .counting
            .as_ref()
            .filter(|_| self.app.config.enable_subscription_count)
    }

    /// Bytes of publications one catch-up may replay.
    fn max_recovery_bytes(&self) -> usize {
        self.node.state.ctx.config.limits.max_recovery_bytes
    }

    /// The webhook sender, when this app has webhooks.
    fn webhooks(&self) -> Option<&Arc<Webhooks>> {
        self.node
            .apps
            .webhooks
            .as_ref()
            .filter(|_| !self.app.config.webhooks.is_empty())
    }

    /// The node's subscription counts shared with the cluster.
    fn census(&self) -> Option<&Arc<Census>> {
        self.node.apps.census.as_ref()
    }

    /// The app whose key and secret check this connection's signatures: the app as it is now
    /// (a secret changed at run time applies to open connections too), or as it was when the
    /// connection opened if it is no longer in force under the same key.
    fn signer(&self) -> Arc<PusherApp> {
        self.node
            .apps
            .by_id(&self.app.config.id)
            .filter(|now| now.config.key == self.app.config.key)
            .unwrap_or_else(|| self.app.clone())
    }

    /// Publications translated once for every Pusher subscriber.
    fn frames(&self) -> &SharedFrames {
        &self.node.apps.frames
    }
}

/// A presence member as one subscriber sees it: one user, any number of sockets.
struct Member {
    info: Option<Box<RawValue>>,
    sockets: Vec<Box<str>>,
}

/// One channel of the connection. Kept small: every subscribed connection holds one per
/// channel, and a map's entries are allocated in fours. Its Herald channel is not kept: it is
/// the app's prefix and the name ([`PusherApp::internal`]), made again on the rare paths.
struct Subscription {
    kind: ChannelKind,
    /// Events carry `herald_offset` (the catch-up extension).
    positions: bool,
    /// Presence channels only (boxed: other channels do not pay for it).
    presence: Option<Box<Presence>>,
}

/// A presence channel's side of a subscription.
struct Presence {
    /// This connection as a presence member.
    me: ClientInfo,
    /// Presence members by user id.
    members: HashMap<String, Member>,
}

/// A signed-in connection's side of watchlist events (boxed: other connections do not pay for
/// it). See [`super::watchlist`].
#[derive(Default)]
struct UserWatch {
    /// This connection as a member of its user's online channel (the Herald name).
    online: Option<(String, ClientInfo)>,
    /// The users it watches.
    watched: Watched,
}

impl Subscription {
    /// This connection as a presence member.
    fn me(&self) -> Option<&ClientInfo> {
        self.presence.as_ref().map(|p| &p.me)
    }
}

/// See the module docs.
pub struct PusherConn {
    ctx: ConnContext,
    out: Arc<Outbound>,
    key: ConnKey,
    socket_id: Arc<str>,
    channels: HashMap<Box<str>, Subscription>,
    /// The channel of the last publication translated (its shared name, see
    /// [`super::shared`]) and whether its events carry positions: a fan-out's delivery then
    /// reads nothing but this connection's task state. Cleared whenever `channels` changes.
    recent: Option<(Arc<str>, bool)>,
    client_events: TokenBucket,
    /// The fan-out's writer for this connection, once the transport made one (super::direct).
    direct: Option<Arc<PusherDirect>>,
    /// The user this connection signed in as (`pusher:signin`).
    user: Option<String>,
    /// Watchlist events, once signed in to an app that enables them.
    watch: Option<Box<UserWatch>>,
}

/// A refusal that ends the connection: Pusher close code and message.
pub type Refusal = (u16, String);

impl PusherConn {
    /// Register a new connection with the hub and queue `pusher:connection_established`.
    pub fn open(ctx: ConnContext, out: Arc<Outbound>, activity_timeout_s: u64) -> Self {
        let socket_id: Arc<str> = Arc::from(format!(
            "{}.{}",
            rand::random_range(1..1_000_000_000u64),
            rand::random_range(1..1_000_000_000u64)
        ));
        // Until it signs in, the connection's user is the app's empty user (`pusher:ID:`, the
        // app's prefix, shared), which no Herald token and no other app can name.
        let key = ctx
            .hub()
            .register(socket_id.clone(), ctx.app.prefix.clone(), out.clone());
        out.push(wire::connection_established(&socket_id, activity_timeout_s));
        let rate = ctx
            .app
            .config
            .max_client_events_per_second
            .unwrap_or(ctx.node.apps.settings.client_events_per_second);
        PusherConn {
            ctx,
            out,
            key,
            socket_id,
            channels: HashMap::new(),
            recent: None,
            client_events: TokenBucket::new(rate, rate.saturating_mul(2)),
            direct: None,
            user: None,
            watch: None,
        }
    }

    fn error(&self, code: Option<u16>, message: &str) {
        self.out.push(wire::error(code, message));
    }

    /// Handle one text message from the client. Bad input gets `pusher:error` and changes
    /// nothing else; only a failed sign-in ends the connection (4009, as Pusher does).
    pub async fn handle(&mut self, text: &str) -> Option<Refusal> {
        let message: ClientMessage = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(_) => {
                self.error(
                    None,
                    "Invalid message: expected a JSON object with an \"event\"",
                );
                return None;
            }
        };
        match message.event.as_str() {
            "pusher:ping" => {
                self.out.push(wire::pong());
            }
            "pusher:pong" => {}
            "pusher:subscribe" => {
                match wire::parse_data::<SubscribeData>(message.data.as_deref()) {
                    Some(data) => self.subscribe(data).await,
                    None => self.error(None, "pusher:subscribe needs data {\"channel\": …}"),
                }
            }
            "pusher:unsubscribe" => {
                match wire::parse_data::<UnsubscribeData>(message.data.as_deref()) {
                    Some(data) => {
                        self.leave(&data.channel).await;
                    }
                    None => self.error(None, "pusher:unsubscribe needs data {\"channel\": …}"),
                }
            }
            "pusher:signin" => {
                return match wire::parse_data::<SigninData>(message.data.as_deref()) {
                    Some(data) => self.signin(data).await,
                    None => Some((
                        codes::UNAUTHORIZED,
                        "pusher:signin needs auth and user_data".into(),
                    )),
                }
            }
            name if name.starts_with("client-") => self.client_event(message).await,
            name => self.error(None, &format!("Unsupported event {name:?}")),
        }
        None
    }

    /// `pusher:signin`: check the signature over `socket_id::user::user_data`, then the
    /// connection is reachable as the user (`terminate_connections`) and may subscribe to the
    /// user's channel (`sendToUser`).
    async fn signin(&mut self, data: SigninData) -> Option<Refusal> {
        let signer = self.ctx.signer();
        let config = &signer.config;
        if !user_authenticated(
            &config.key,
            &config.secret,
            &self.socket_id,
            &data.user_data,
            &data.auth,
        ) {
            return Some((
                codes::UNAUTHORIZED,
                "Invalid signature for pusher:signin".into(),
            ));
        }
        let user = match serde_json::from_str::<UserData>(&data.user_data) {
            Ok(u) if !u.id.is_empty() => u.id,
            _ => {
                return Some((
                    codes::UNAUTHORIZED,
                    "user_data must be JSON with a string id".into(),
                ))
            }
        };
        // Without watchlist events (Pusher's default) a watchlist is signed data the app keeps.
        let watch_events = config.enable_watchlist_events;
        let watchlist = match watch_events {
            true => match watchlist::parse(&data.user_data) {
                Ok(users) => users,
                Err(why) => return Some((codes::UNAUTHORIZED, why)),
            },
            false => Vec::new(),
        };
        self.ctx
            .hub()
            .set_user(&self.socket_id, Arc::from(self.ctx.app.internal(&user)));
        if let Some(previous) = self.user.replace(user) {
            // Signed in again as someone else: the previous user's channel is not theirs.
            if self.user.as_deref() != Some(previous.as_str()) {
                self.leave(&format!("{USER_CHANNEL_PREFIX}{previous}"))
                    .await;
            }
        }
        self.out.push(wire::signin_success(&data.user_data));
        self.unwatch().await;
        match (watch_events, self.user.clone()) {
            (true, Some(user)) => self.go_online(&user).await,
            _ => self.go_offline().await,
        }
        if !watchlist.is_empty() {
            self.watch(watchlist).await;
        }
        None
    }

    /// Be a member of `user`'s online channel (and of no other user's): watchers see the user
    /// online.
    async fn go_online(&mut self, user: &str) {
        let channel = self.ctx.app.internal(&watchlist::online_channel(user));
        let watch = self.watch.get_or_insert_with(Box::default);
        if watch.online.as_ref().is_some_and(|(c, _)| *c == channel) {
            return; // signed in again as the same user: still online
        }
        let me = ClientInfo {
            user: user.to_owned(),
            client: self.socket_id.to_string(),
            info: None,
        };
        let hub = self.ctx.hub();
        if let Some((previous, who)) = watch.online.replace((channel.clone(), me.clone())) {
            hub.leave(&previous, &who, true).await;
        }
        hub.join(&channel, &me, true).await;
    }

    /// Leave the online channel, if this connection is in one.
    async fn go_offline(&mut self) {
        let Some((channel, who)) = self.watch.as_mut().and_then(|w| w.online.take()) else {
            return;
        };
        self.ctx.hub().leave(&channel, &who, true).await;
    }

    /// Watch `users`: follow their online channels, then tell the client which are online.
    async fn watch(&mut self, users: Vec<String>) {
        self.watch.get_or_insert_with(Box::default).watched = Watched::new(&users);
        let failed = self.follow_online(&users).await;
        if !failed.is_empty() {
            let watched = &mut self.watch.get_or_insert_with(Box::default).watched;
            for user in &failed {
                watched.forget(user);
            }
            self.error(
                None,
                &format!(
                    "Watchlist events unavailable for {} of the watched users: temporarily unavailable",
                    failed.len()
                ),
            );
        }
        let followed: Vec<String> = users.into_iter().filter(|u| !failed.contains(u)).collect();
        self.refresh_watched(&followed).await;
    }

    /// Subscribe (through the hub) to the online channels of `users`, live at once: the joins
    /// and leaves of every node reach [`Self::translate`]. The users that could not be followed.
    async fn follow_online(&self, users: &[String]) -> Vec<String> {
        let hub = self.ctx.hub();
        let follow = users.iter().map(|user| async move {
            let name = watchlist::online_channel(user);
            let internal = self.ctx.app.internal(&name);
            let prepared = hub
                .prepare_subscription(
                    &internal,
                    self.key,
                    &self.out,
                    None,
                    self.ctx.namespace(&name),
                )
                .await;
            match prepared {
                Ok(result) => {
                    hub.activate(&internal, self.key, &result.position);
                    None
                }
                Err(e) => {
                    tracing::warn!(channel = %internal, cause = %e, "watchlist channel not followed");
                    Some(user.clone())
                }
            }
        });
        futures_util::future::join_all(follow)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Read who is online among `users` (now that their channels are live: nothing between the
    /// read and live delivery is missed) and tell the client what changed.
    async fn refresh_watched(&mut self, users: &[String]) {
        let (hub, app) = (self.ctx.hub(), &self.ctx.app);
        let reads = users.iter().map(|user| async move {
            let internal = app.internal(&watchlist::online_channel(user));
            (user, hub.members(&internal).await)
        });
        let read = futures_util::future::join_all(reads).await;
        let Some(watch) = self.watch.as_deref_mut() else {
            return;
        };
        let (mut online, mut offline) = (Vec::new(), Vec::new());
        for (user, members) in &read {
            let clients = match members {
                Ok(clients) => clients,
                Err(e) => {
                    tracing::warn!(user = %user, cause = %e, "watched user's presence not read");
                    continue;
                }
            };
            match watch
                .watched
                .reset(user, clients.iter().map(|c| c.client.as_str()))
            {
                Some(true) => online.push(user.as_str()),
                Some(false) => offline.push(user.as_str()),
                None => {}
            }
        }
        if let Some(frame) = watchlist::events_frame(&online, &offline) {
            self.out.push(frame);
        }
    }

    /// Stop following the watched users' online channels.
    async fn unwatch(&mut self) {
        let Some(watch) = self.watch.as_deref_mut() else {
            return;
        };
        let watched = std::mem::take(&mut watch.watched);
        let (hub, app, key) = (self.ctx.hub(), &self.ctx.app, self.key);
        let leave = watched.users().map(|user| {
            let internal = app.internal(&watchlist::online_channel(user));
            async move { hub.unsubscribe(&internal, key).await }
        });
        futures_util::future::join_all(leave).await;
    }

    fn refuse(&self, channel: &str, kind: &str, message: &str, status: u16) {
        self.out
            .push(wire::subscription_error(channel, kind, message, status));
    }

    async fn subscribe(&mut self, data: SubscribeData) {
        let channel = data.channel;
        if !valid_channel(&channel) {
            return self.refuse(
                &channel,
                "InvalidChannel",
                "Channel names are 1 to 164 of [A-Za-z0-9_-=@,.;]",
                400,
            );
        }
        if self.channels.contains_key(channel.as_str()) {
            return; // already subscribed: nothing changes
        }
        if self.channels.len() >= self.ctx.max_channels() {
            return self.refuse(
                &channel,
                "LimitReached",
                "Too many channels on this connection",
                400,
            );
        }
        let kind = ChannelKind::of(&channel);
        let mut me = None;
        if kind == ChannelKind::User {
            let id = &channel[USER_CHANNEL_PREFIX.len()..];
            if self.user.as_deref() != Some(id) {
                return self.refuse(
                    &channel,
                    "AuthError",
                    "Only the connection signed in as this user may subscribe",
                    403,
                );
            }
        } else if kind != ChannelKind::Public {
            // Signed with `channel_data` whenever it is given (the server SDKs include it for
            // any channel); presence channels need it.
            let channel_data = data.channel_data.as_deref();
            if kind == ChannelKind::Presence && channel_data.is_none() {
                return self.refuse(
                    &channel,
                    "AuthError",
                    "Presence channels need channel_data",
                    401,
                );
            }
            let signer = self.ctx.signer();
            let config = &signer.config;
            let authorized = channel_authorized(
                &config.key,
                &config.secret,
                &self.socket_id,
                &channel,
                channel_data,
                data.auth.as_deref().unwrap_or(""),
            );
            if !authorized {
                return self.refuse(
                    &channel,
                    "AuthError",
                    "Invalid signature: the connection is unauthorized for this channel",
                    401,
                );
            }
            if let (ChannelKind::Presence, Some(raw)) = (kind, channel_data) {
                let parsed: Option<ChannelData> = serde_json::from_str(raw).ok();
                let Some((user, info)) = parsed.and_then(|d| Some((d.user_id()?, d.user_info)))
                else {
                    return self.refuse(
                        &channel,
                        "AuthError",
                        "channel_data must be JSON with a user_id",
                        400,
                    );
                };
                let max_info = self.ctx.app.max_user_info_bytes();
                if let Err(why) = limits::check_user_info(info.as_deref(), max_info) {
                    return self.refuse(&channel, "LimitReached", &why.to_string(), 400);
                }
                me = Some(ClientInfo {
                    user,
                    client: self.socket_id.to_string(),
                    info,
                });
            }
        }
        let internal = self.ctx.app.internal(&channel);
        let positions = data.herald_positions || data.herald_since.is_some();
        // A cache channel without the catch-up extension: read from its last publication on,
        // so that the answer holds the event to send (and nothing between it and going live is
        // lost or sent twice).
        let cache = is_cache(&channel) && data.herald_since.is_none();
        let from_last = match cache {
            true => self.last_position(&channel, &internal).await,
            false => None,
        };
        let since = data.herald_since.as_ref().or(from_last.as_ref());
        if positions {
            // Events with `herald_offset` are this connection's own translation (the fan-out's
            // direct writes send the plain event): from now on its task translates every
            // publication. Before the hub delivers this channel, and for good.
            if let Some(direct) = &self.direct {
                direct.leave();
            }
        }
        let prepared = self
            .ctx
            .hub()
            .prepare_subscription(
                &internal,
                self.key,
                &self.out,
                since,
                self.ctx.namespace(&channel),
            )
            .await;
        let mut result = match prepared {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(channel = %internal, cause = %e, "pusher subscribe failed");
                return self.refuse(&channel, "ServerError", "Temporarily unavailable", 503);
            }
        };
        if let (Some(who), Some(max)) = (&me, self.ctx.app.config.max_presence_members_per_channel)
        {
            if !self.room_for(&internal, &who.user, max).await {
                self.ctx.hub().unsubscribe(&internal, self.key).await;
                return self.refuse(
                    &channel,
                    "LimitReached",
                    &format!("The presence channel is full: at most {max} members"),
                    4004,
                );
            }
        }
        let mut members = HashMap::new();
        let mut succeeded = match &me {
            Some(who) => {
                members = self.join_presence(&internal, who).await;
                presence_data(&members)
            }
            None => serde_json::json!({}),
        };
        if positions {
            let mut budget = self.ctx.max_recovery_bytes();
            result.charge(&mut budget);
            succeeded["herald"] = serde_json::json!({
                "epoch": result.position.epoch,
                "offset": result.position.offset,
                "recoverable": result.recoverable,
                "recovered": result.recovered,
            });
        }
        self.out.push(wire::subscription_succeeded(
            &channel,
            &succeeded.to_string(),
        ));
        // The cached event: the newest publication up to the subscription's start, whoever it
        // excluded when it was sent live.
        let cached = match (cache, result.recovered) {
            (true, Some(true)) => result.publications.last(),
            _ => None,
        };
        let replay: Vec<&herald_protocol::Publication> = match cache {
            true => cached.into_iter().collect(),
            false => result.publications.iter().collect(),
        };
        for p in replay {
            let envelope = wire::envelope_of(p.data_raw());
            if cache || envelope.exclude.as_deref() != Some(&*self.socket_id) {
                self.out.push(wire::event(
                    &envelope.event,
                    &channel,
                    envelope.data,
                    envelope.user_id.as_deref(),
                    Some(p.offset),
                ));
            }
        }
        if cache && cached.is_none() {
            self.out.push(wire::cache_miss(&channel));
            if let Some(hooks) = self.ctx.webhooks() {
                hooks.event(
                    &self.ctx.app,
                    serde_json::json!({"name": "cache_miss", "channel": channel}),
                );
            }
        }
        self.ctx
            .hub()
            .activate(&internal, self.key, &result.position);
        if let Some(census) = self.ctx.census() {
            census.changed();
        }
        if let (Some(counting), ChannelKind::Public | ChannelKind::Private) =
            (self.ctx.counting(), kind)
        {
            counting.add(
                &self.ctx.app,
                &channel,
                &internal,
                &self.socket_id,
                &self.out,
            );
            if let Some(hooks) = self.ctx.webhooks() {
                hooks.count_changed(&self.ctx.app, &internal);
            }
        }
        let presence = me.is_some();
        // A user's own channel is private plumbing: no occupancy webhooks for it.
        let hooks = self.ctx.webhooks().filter(|_| kind != ChannelKind::User);
        if let Some(hooks) = hooks {
            hooks.subscribed(&self.ctx.app, &internal);
            let first_socket = me
                .as_ref()
                .and_then(|who| members.get(&who.user))
                .is_some_and(|m| m.sockets.len() == 1);
            if let (Some(who), true) = (&me, first_socket) {
                hooks.event(
                    &self.ctx.app,
                    serde_json::json!({"name": "member_added", "channel": channel, "user_id": who.user}),
                );
            }
        }
        if let Some(who) = &me {
            self.ctx.hub().announce(&internal, true, who).await;
        }
        self.recent = None;
        self.channels.insert(
            channel.as_str().into(),
            Subscription {
                kind,
                positions,
                presence: me.map(|me| Box::new(Presence { me, members })),
            },
        );
        if presence {
            self.reconcile_members(&channel).await;
        }
    }

    /// The position just before a cache channel's newest publication (`None`: it has none, or
    /// history could not be read: the subscriber is told `pusher:cache_miss`).
    async fn last_position(&self, channel: &str, internal: &str) -> Option<StreamPosition> {
        let query = HistoryQuery {
            since: None,
            limit: Some(1),
        };
        let opts = self.ctx.namespace(channel).stream_options();
        match self
            .ctx
            .hub()
            .broker()
            .history(internal, &query, &opts)
            .await
        {
            Ok(h) => h.publications.last().map(|p| StreamPosition {
                epoch: h.position.epoch.clone(),
                offset: p.offset.saturating_sub(1),
            }),
            Err(e) => {
                tracing::warn!(channel = %internal, cause = %e, "cache channel not read");
                None
            }
        }
    }

    /// Whether `user` may join a presence channel limited to `max` distinct users: one of them
    /// already, or fewer than `max` there.
    async fn room_for(&self, internal: &str, user: &str, max: usize) -> bool {
        let Ok(now) = self.ctx.hub().members(internal).await else {
            return true; // not read: the limit is not enforced rather than the channel refused
        };
        let users: std::collections::HashSet<&str> = now.iter().map(|c| c.user.as_str()).collect();
        users.contains(user) || users.len() < max
    }

    /// Joins and leaves published between the member list read and going live never reach this
    /// connection: read the list again now that it is live and announce the difference. Changes
    /// queued since are deduplicated by socket in [`Self::translate`].
    async fn reconcile_members(&mut self, channel: &str) {
        if !self.channels.contains_key(channel) {
            return;
        }
        let internal = self.ctx.app.internal(channel);
        let Ok(now) = self.ctx.hub().members(&internal).await else {
            return;
        };
        let Some(sub) = self
            .channels
            .get_mut(channel)
            .and_then(|s| s.presence.as_deref_mut())
        else {
            return;
        };
        let mut current: HashMap<&str, Vec<&ClientInfo>> = HashMap::new();
        for c in &now {
            current.entry(c.user.as_str()).or_default().push(c);
        }
        let gone: Vec<String> = sub
            .members
            .keys()
            .filter(|user| !current.contains_key(user.as_str()))
            .filter(|user| sub.me.user != **user)
            .cloned()
            .collect();
        for user in gone {
            sub.members.remove(&user);
            self.out.push(wire::member_removed(channel, &user));
        }
        for (user, clients) in current {
            if sub.members.contains_key(user) {
                continue;
            }
            sub.members.insert(
                user.to_owned(),
                Member {
                    info: clients[0].info.clone(),
                    sockets: clients.iter().map(|c| c.client.as_str().into()).collect(),
                },
            );
            self.out.push(wire::member_added(
                channel,
                user,
                clients[0].info.as_deref(),
            ));
        }
    }

    /// Record this connection as a member and read the members (itself included).
    async fn join_presence(&self, internal: &str, who: &ClientInfo) -> HashMap<String, Member> {
        let hub = self.ctx.hub();
        hub.add_member(internal, who).await;
        let clients = hub.members(internal).await.unwrap_or_else(|e| {
            tracing::warn!(channel = %internal, cause = %e, "presence not read");
            Vec::new()
        });
        let mut members: HashMap<String, Member> = HashMap::new();
        for c in clients.iter().chain(std::iter::once(who)) {
            let member = members.entry(c.user.clone()).or_insert_with(|| Member {
                info: c.info.clone(),
                sockets: Vec::new(),
            });
            if !member.sockets.iter().any(|s| **s == *c.client) {
                member.sockets.push(c.client.as_str().into());
            }
        }
        members
    }

    /// Leave a channel: hub, presence and `member_removed` for the others.
    async fn leave(&mut self, channel: &str) -> bool {
        let Some(sub) = self.channels.remove(channel) else {
            return false;
        };
        self.recent = None;
        let internal = self.ctx.app.internal(channel);
        self.ctx.hub().unsubscribe(&internal, self.key).await;
        if let Some(census) = self.ctx.census() {
            census.changed();
        }
        if let (Some(counting), ChannelKind::Public | ChannelKind::Private) =
            (self.ctx.counting(), sub.kind)
        {
            counting.remove(&internal, &self.socket_id);
            if let Some(hooks) = self.ctx.webhooks() {
                hooks.count_changed(&self.ctx.app, &internal);
            }
        }
        if let Some(hooks) = self.ctx.webhooks() {
            if sub.kind != ChannelKind::User {
                hooks.unsubscribed(&self.ctx.app, &internal);
            }
        }
        if let Some(who) = sub.me() {
            let hub = self.ctx.hub();
            hub.leave(&internal, who, true).await;
            if let Some(hooks) = self.ctx.webhooks() {
                // The user's last socket anywhere in the cluster?
                let gone = hub
                    .members(&internal)
                    .await
                    .is_ok_and(|all| all.iter().all(|c| c.user != who.user));
                if gone {
                    hooks.event(
                        &self.ctx.app,
                        serde_json::json!({"name": "member_removed", "channel": channel, "user_id": who.user}),
                    );
                }
            }
        }
        true
    }

    async fn client_event(&mut self, message: ClientMessage) {
        let Some(channel) = message.channel.as_deref() else {
            return self.error(None, "Client events need a channel");
        };
        let sub = self.channels.get(channel);
        let asked = permission::ClientEvent {
            enabled: self.ctx.app.config.enable_client_events,
            subscribed: sub.is_some(),
            signed_channel: sub
                .is_some_and(|s| matches!(s.kind, ChannelKind::Private | ChannelKind::Presence)),
            encrypted: ChannelKind::encrypted(channel),
        };
        if let Err(why) = permission::decide_client_event(&asked) {
            return self.error(None, &why.to_string());
        }
        let Some(sub) = sub else {
            return;
        };
        if let Err(why) =
            limits::check_event_name(&message.event, self.ctx.app.max_event_name_chars())
        {
            return self.error(None, &why.to_string());
        }
        if !self.client_events.try_take(Instant::now()) {
            return self.error(
                Some(codes::CLIENT_EVENT_RATE_LIMITED),
                "Client event rejected due to rate limit",
            );
        }
        let null = RawValue::from_string("null".into()).expect("null is JSON");
        let data = message.data.as_deref().unwrap_or(&null);
        if data.get().len() > self.ctx.max_event_bytes() {
            return self.error(
                None,
                &format!(
                    "Client event data is over {} bytes",
                    self.ctx.max_event_bytes()
                ),
            );
        }
        let envelope = Envelope {
            event: message.event.as_str().into(),
            data,
            user_id: sub.me().map(|m| m.user.as_str().into()),
            exclude: Some((*self.socket_id).into()),
        };
        let opts = PublishOptions {
            stream: self.ctx.namespace(channel).stream_options(),
            idempotency_key: None,
            traceparent: None,
            tags: Default::default(),
            skip_history: false,
        };
        if let Some(hooks) = self.ctx.webhooks() {
            // Pusher's webhook carries the data as a string.
            let text = serde_json::from_str::<String>(data.get())
                .unwrap_or_else(|_| data.get().to_owned());
            let mut event = serde_json::json!({
                "name": "client_event",
                "channel": channel,
                "event": message.event,
                "data": text,
                "socket_id": &*self.socket_id,
            });
            if let Some(me) = sub.me() {
                event["user_id"] = serde_json::Value::from(me.user.as_str());
            }
            hooks.event(&self.ctx.app, event);
        }
        let internal = self.ctx.app.internal(channel);
        if let Err(e) = self
            .ctx
            .hub()
            .publish(&internal, envelope.to_bytes(), None, &opts)
            .await
        {
            tracing::warn!(channel = %internal, cause = %e, "client event not published");
            self.error(None, "Client event not delivered: temporarily unavailable");
        }
    }

    /// Turn a queued frame into what the Pusher client receives: this connection's own frames
    /// as they are, hub publications as events, presence changes as `member_added` /
    /// `member_removed` when a user's first socket joins or last socket leaves. `None`: nothing.
    pub fn translate(&mut self, frame: Bytes) -> Option<Bytes> {
        if frame.starts_with(wire::OWN_FRAME_PREFIX) {
            return Some(frame);
        }
        if frame.starts_with(b"{\"pub\":") {
            let event = self
                .ctx
                .frames()
                .event_for(&frame, &self.ctx.app, &self.socket_id)?;
            let positions = match &self.recent {
                Some((name, positions)) if Arc::ptr_eq(name, &event.channel) => *positions,
                _ => {
                    let positions = self
                        .channels
                        .get(&*event.channel)
                        .is_some_and(|s| s.positions);
                    self.recent = Some((event.channel.clone(), positions));
                    positions
                }
            };
            return Some(match positions {
                true => event.positioned.clone(),
                false => event.plain.clone(),
            });
        }
        let push: wire::HubPush<'_> = serde_json::from_slice(&frame).ok()?;
        let (joined, change) = match (push.join, push.leave) {
            (Some(j), _) => (true, j),
            (None, Some(l)) => (false, l),
            (None, None) => return None,
        };
        let channel = self.ctx.app.external(&change.channel)?;
        let who = change.info;
        if let Some(user) = watchlist::watched_user(channel) {
            let watched = &mut self.watch.as_deref_mut()?.watched;
            return match watched.change(user, &who.client, joined)? {
                true => watchlist::events_frame(&[user], &[]),
                false => watchlist::events_frame(&[], &[user]),
            };
        }
        let sub = self.channels.get_mut(channel)?.presence.as_deref_mut()?;
        if *who.client == *self.socket_id {
            return None;
        }
        if joined {
            let member = sub
                .members
                .entry(who.user.to_string())
                .or_insert_with(|| Member {
                    info: who.info.map(|i| i.to_owned()),
                    sockets: Vec::new(),
                });
            if member.sockets.iter().any(|s| **s == *who.client) {
                return None;
            }
            member.sockets.push(who.client.as_ref().into());
            (member.sockets.len() == 1).then(|| wire::member_added(channel, &who.user, who.info))
        } else {
            let member = sub.members.get_mut(who.user.as_ref())?;
            let before = member.sockets.len();
            member.sockets.retain(|s| **s != *who.client);
            if member.sockets.len() == before || !member.sockets.is_empty() {
                return None;
            }
            sub.members.remove(who.user.as_ref());
            Some(wire::member_removed(channel, &who.user))
        }
    }

    /// Act on work from the hub: a channel whose continuity the node lost is joined again at
    /// the stream's current position (stock Pusher clients have no way to recover a gap).
    pub async fn handle_controls(&mut self, controls: Vec<Control>) {
        for control in controls {
            let Control::Lost { channel, .. } = control else {
                continue; // Herald API subscribe/unsubscribe: not for Pusher connections
            };
            let Some(name) = self.ctx.app.external(&channel).map(str::to_owned) else {
                continue;
            };
            if let Some(user) = watchlist::watched_user(&name) {
                self.follow_again(user.to_owned()).await;
                continue;
            }
            if !self.channels.contains_key(name.as_str()) {
                continue;
            }
            self.ctx.hub().unsubscribe(&channel, self.key).await;
            match self
                .ctx
                .hub()
                .prepare_subscription(
                    &channel,
                    self.key,
                    &self.out,
                    None,
                    self.ctx.namespace(&name),
                )
                .await
            {
                Ok(result) => {
                    if self
                        .channels
                        .get(name.as_str())
                        .is_some_and(|s| s.positions)
                    {
                        self.out.push(wire::reset(&name, &result.position));
                    }
                    self.ctx
                        .hub()
                        .activate(&channel, self.key, &result.position)
                }
                Err(e) => {
                    tracing::warn!(channel, cause = %e, "pusher channel not rejoined");
                    self.leave(&name).await;
                }
            }
        }
    }

    /// A watched user's online channel lost continuity (joins or leaves may be missed): follow
    /// it again and read who is online.
    async fn follow_again(&mut self, user: String) {
        let watching = self
            .watch
            .as_deref()
            .is_some_and(|w| w.watched.users().any(|u| u == user));
        if !watching {
            return;
        }
        let internal = self.ctx.app.internal(&watchlist::online_channel(&user));
        self.ctx.hub().unsubscribe(&internal, self.key).await;
        let users = [user];
        if self.follow_online(&users).await.is_empty() {
            self.refresh_watched(&users).await;
        } else if let Some(w) = self.watch.as_deref_mut() {
            w.watched.forget(&users[0]);
        }
    }

    /// The connection's socket id (its client id in the hub's registry).
    pub fn socket_id(&self) -> &str {
        &self.socket_id
    }

    /// The writer through which the fan-out writes this connection's publications to `ws`
    /// (super::direct): it translates them as [`Self::translate`] does for a connection
    /// without positions.
    pub(crate) fn direct_writer(&mut self, ws: Arc<Locked>) -> Arc<PusherDirect> {
        let writer = Arc::new(PusherDirect::new(
            ws,
            self.ctx.node.apps.frames.clone(),
            self.ctx.app.clone(),
            self.socket_id.clone(),
        ));
        self.direct = Some(writer.clone());
        writer
    }

    /// The connection is gone: leave every channel and forget it.
    pub async fn end(mut self) {
        let channels: Vec<Box<str>> = self.channels.keys().cloned().collect();
        for channel in channels {
            self.leave(&channel).await;
        }
        self.unwatch().await;
        self.go_offline().await;
        self.ctx.hub().unregister(&self.socket_id);
    }
}

/// `{"presence": {"ids", "hash", "count"}}`.
fn presence_data(members: &HashMap<String, Member>) -> serde_json::Value {
    let ids: Vec<&str> = members.keys().map(String::as_str).collect();
    let hash: serde_json::Map<String, serde_json::Value> = members
        .iter()
        .map(|(id, m)| {
            let info = m
                .info
                .as_deref()
                .and_then(|i| serde_json::from_str(i.get()).ok())
                .unwrap_or(serde_json::Value::Null);
            (id.clone(), info)
        })
        .collect();
    serde_json::json!({"presence": {"ids": ids, "hash": hash, "count": members.len()}})
}
