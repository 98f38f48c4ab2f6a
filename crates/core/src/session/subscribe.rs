//! `subscribe` and `unsubscribe`: the permission check, the subscribe hook, recovery within its
//! budget, and presence on joining and leaving.

use super::*;
use herald_protocol::tags::{FilterSpec, TagFilter};

/// A subscription's first half, with the subscribe proxy's `data` for the reply.
pub(super) type Prepared = (SubscribeResult, Option<Box<RawValue>>);

impl Session {
    /// Checks and first half of a subscription (see [`Hub::prepare_subscription`]).
    pub(super) async fn prepare(
        &mut self,
        channel: &str,
        token: Option<&str>,
        since: Option<&StreamPosition>,
        granted: bool,
        data: Option<&RawValue>,
        server_opts: Option<SubOptions>,
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
            grants: None,
        };
        let by_proxy = permission::decide(&ns, channel, &client, Action::Subscribe)
            .map_err(CommandError::from)?
            == Allowed::IfSubscribeHookAllows;
        // Options from the connect hook's `subs` (server-side) or the subscribe hook's answer.
        let mut options = (server_opts, Hook::Connect);
        if by_proxy {
            let Some(proxy) = self.channel_hook(Hook::Subscribe, Some(channel)) else {
                return Err(CommandError::new(
                    ErrorCode::Internal,
                    "subscribe proxy not configured",
                )
                .into());
            };
            let r: ProxySubscribeResult = self
                .ask_connected(proxy.as_ref(), Hook::Subscribe, Some(channel), None, data)
                .await?;
            token_exp = r.expire_at;
            options = (Some(r.options()), Hook::Subscribe);
        }
        let (options, hook) = options;
        let options = options.unwrap_or_default();
        let (ns, recovers) = match options.apply(&ns) {
            Ok((ns, recovers)) => (Arc::new(ns), recovers),
            Err(e) => return Err(failure(hook, e)),
        };
        let since = since.filter(|_| recovers);
        let conn = self.connected.as_mut().expect("connected");
        let result = ctx
            .hub
            .prepare_subscription(channel, conn.key, &self.out, since, &ns)
            .await
            .map_err(broker_error)?;
        conn.channels.insert(channel.to_owned(), ns);
        if let Some(grants) = options.grants() {
            conn.hooked
                .get_or_insert_with(Default::default)
                .grants
                .insert(channel.to_owned(), grants);
        }
        let reply_data = options.data;
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
    pub(super) async fn activate(&mut self, channel: &str, result: &SubscribeResult) {
        let conn = self.connected.as_ref().expect("connected");
        self.ctx.hub.activate(channel, conn.key, &result.position);
        let Some(ns) = conn.channels.get(channel) else {
            return;
        };
        if ns.presence {
            self.ctx.hub.join(channel, &conn.who(), ns.join_leave).await;
        }
    }

    /// Recovered bytes one reply may carry: `limits.max_recovery_bytes`, less what earlier
    /// recovery replies still waiting in the queue hold.
    pub(super) fn recovery_budget(&self) -> usize {
        self.out
            .recovery_room(self.ctx.config.limits.max_recovery_bytes)
    }

    /// Queue a reply; one that carries recovered publications does not count against the
    /// queue's bound while it waits, so an allowed recovery is always delivered (see
    /// [`Outbound::push_recovery`]).
    pub(super) fn push_reply(&self, frame: Bytes, recovering: bool) {
        if recovering {
            self.out.push_recovery(frame);
        } else {
            self.out.push(frame);
        }
    }

    /// Bound the recovered publications of one reply (see `limits.max_recovery_bytes`).
    pub(super) fn charge_recovery(&self, result: &mut SubscribeResult, budget: &mut usize) {
        if !result.charge(budget) {
            self.ctx.hub.metrics().recovery_over_budget.inc();
        }
    }

    pub(super) async fn subscribe(&mut self, id: u64, p: SubscribeParams) -> Result<(), Refusal> {
        let delta = p.delta.is_some();
        if delta {
            self.check_delta(&p.channel)?;
        }
        let filter = match &p.tf {
            Some(spec) => Some(self.check_tags_filter(&p.channel, spec)?),
            None => None,
        };
        let (mut result, data) = self
            .prepare(
                &p.channel,
                p.token.as_deref(),
                p.since.as_ref(),
                false,
                p.data.as_deref(),
                None,
            )
            .await?;
        if let Some(f) = &filter {
            // Recovery skips what the filter refuses, as live delivery does.
            result.publications.retain(|p| f.matches(&p.tags));
        }
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
            /// Live publications come with delta compression (asked for and allowed).
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            delta: bool,
        }
        let key = self.connected.as_ref().expect("connected").key;
        if delta {
            self.ctx.hub.use_delta(&p.channel, key);
        }
        if let Some(f) = filter {
            self.ctx.hub.use_tags_filter(&p.channel, key, f);
        }
        let subscribed = Subscribed {
            result: &result,
            expires_in,
            data: data.as_deref(),
            delta,
        };
        self.push_reply(
            reply(id, "subscribe", &subscribed),
            result.carries_publications(),
        );
        self.activate(&p.channel, &result).await;
        Ok(())
    }

    /// Delta compression is asked for: the channel's namespace must allow it (an unknown
    /// namespace is left to the subscription's own checks).
    fn check_delta(&self, channel: &str) -> Result<(), Refusal> {
        match self.ctx.namespaces.resolve(channel) {
            Ok(ns) if !ns.allow_delta => Err(CommandError::new(
                ErrorCode::NotAvailable,
                "delta compression is not allowed in this namespace (allow_delta)",
            )
            .into()),
            _ => Ok(()),
        }
    }

    /// A tag filter is asked for: the channel's namespace must allow it (an unknown namespace is
    /// left to the subscription's own checks), and the filter must be well formed and within
    /// bounds.
    fn check_tags_filter(&self, channel: &str, spec: &FilterSpec) -> Result<TagFilter, Refusal> {
        if let Ok(ns) = self.ctx.namespaces.resolve(channel) {
            if !ns.allow_tags_filter {
                return Err(CommandError::new(
                    ErrorCode::NotAvailable,
                    "tag filters are not allowed in this namespace (allow_tags_filter)",
                )
                .into());
            }
        }
        TagFilter::from_spec(spec)
            .map_err(|why| CommandError::new(ErrorCode::BadRequest, why).into())
    }

    /// Leave a channel: hub, presence and leave push.
    pub(super) async fn leave(&mut self, channel: &str) -> bool {
        let conn = self.connected.as_mut().expect("connected");
        let Some(ns) = conn.channels.remove(channel) else {
            return false;
        };
        conn.server_side.remove(channel);
        conn.sub_expires.remove(channel);
        conn.proxied_subs.remove(channel);
        if let Some(h) = &mut conn.hooked {
            h.grants.remove(channel);
        }
        self.ctx.hub.unsubscribe(channel, conn.key).await;
        if ns.presence {
            self.ctx
                .hub
                .leave(channel, &conn.who(), ns.join_leave)
                .await;
        }
        true
    }

    pub(super) async fn unsubscribe(&mut self, p: ChannelParams) -> Result<(), CommandError> {
        self.ctx.namespaces.resolve(&p.channel).map_err(ns_error)?;
        self.leave(&p.channel).await;
        Ok(())
    }
}
