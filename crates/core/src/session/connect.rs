//! `connect`: authenticate by token or by the connect hook, then subscribe the server-side
//! channels and the client's own `subs` in one reply.

use super::subscribe::Prepared;
use super::*;

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
    /// The connect proxy's server-side subscriptions with options (`subs`).
    subs: std::collections::BTreeMap<String, SubOptions>,
    /// The connect proxy's `meta`.
    meta: Option<Box<RawValue>>,
}

impl Session {
    pub(super) async fn connect(&mut self, id: u64, params: ConnectParams) -> Option<CloseRequest> {
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
                let target = Target {
                    hook: Hook::Connect,
                    namespace: "",
                    headers: &self.meta().headers,
                };
                let result = match ask::<ProxyConnectResult>(
                    proxy.as_ref(),
                    &target,
                    &body,
                    self.ctx.hub.metrics(),
                )
                .await
                {
                    Ok(Answer::Result(r)) => match r.check_meta() {
                        Ok(()) => r,
                        Err(e) => {
                            self.refuse(id, failure(Hook::Connect, e));
                            return Some(close(CloseCode::BACKEND_ERROR, "backend error"));
                        }
                    },
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
                    subs: result.subs,
                    meta: result.meta,
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
                subs: Default::default(),
                meta: None,
            },
            None => Authenticated {
                user: String::new(),
                info: None,
                exp: None,
                channels: Vec::new(),
                data: None,
                proxied: false,
                subs: Default::default(),
                meta: None,
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
            subs: mut options,
            meta,
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
        for channel in options.keys() {
            if !granted.contains(channel) {
                granted.push(channel.clone());
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
            hooked: meta.map(|meta| {
                Box::new(Hooked {
                    meta: Some(meta),
                    grants: HashMap::new(),
                })
            }),
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
            let server_opts = granted.then(|| options.remove(&channel)).flatten();
            let mut r = self
                .prepare(
                    &channel,
                    token.as_deref(),
                    since.as_ref(),
                    granted,
                    None,
                    server_opts,
                )
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
}
