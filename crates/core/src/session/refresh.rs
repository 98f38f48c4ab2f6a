//! Token lifetimes: `refresh` and `sub_refresh` from the client, the refresh hooks, and what
//! expires when a deadline passes.

use super::*;

impl Session {
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
                if let Some(proxy) = self.channel_hook(Hook::SubRefresh, Some(&channel)) {
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
    pub(super) async fn sub_refresh_by_proxy(
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
    pub(super) async fn refresh_by_proxy(&mut self, proxy: &dyn Proxy) -> Option<CloseRequest> {
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

    pub(super) async fn refresh(
        &mut self,
        id: u64,
        p: RefreshParams,
    ) -> Result<Bytes, CommandError> {
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
    pub(super) async fn sub_refresh(
        &mut self,
        id: u64,
        p: SubRefreshParams,
    ) -> Result<Bytes, CommandError> {
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
}
