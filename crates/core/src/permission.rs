//! Who may do what on a channel: the one decision every command and every front door asks.
//!
//! A client's rights on a channel come from four things: the namespace's static rule
//! (`subscribe`, `publish`), the tokens it holds (the connection token's `channels` claim, a
//! subscription token), the backend's hooks (`subscribe_proxy`, `publish_proxy`) and its live
//! subscriptions. [`decide`] weighs them for one action; nothing else in the node does.
//!
//! The rule that matters most: on a channel whose subscriptions the backend decides
//! (`subscribe_proxy`), the static `subscribe` rule admits nobody by itself. Reading history or
//! presence there, or publishing, needs a subscription the hook allowed (or a token that grants
//! the channel); otherwise a client the hook refused could still read and write the channel.

use herald_protocol::{CommandError, ErrorCode};

use crate::config::{NamespaceConfig, SubscribePolicy};
use crate::namespace::allowed_users;

/// What a client asks to do on a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Subscribe (by command, in `connect`'s `subs`, or by emulation/SSE requests).
    Subscribe,
    /// Publish from the client.
    Publish,
    /// Read the channel's history.
    History,
    /// Read the channel's presence.
    Presence,
}

/// What the asking connection brings.
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    /// The connection's user ("" for anonymous).
    pub user: &'a str,
    /// The connection holds a live subscription to the channel (admitted by this function when
    /// it was made, and by the hook where the hook decides).
    pub subscribed: bool,
    /// The channel is in the connection token's `channels` claim (or the node's personal
    /// channel for this user, or an API `subscribe`): the server granted it.
    pub granted: bool,
    /// A valid subscription token for this channel and user came with the request.
    pub has_subscription_token: bool,
    /// The rights the backend listed for this subscription (`allow` in the subscribe hook's
    /// answer or the connect hook's `subs`), when it listed any: they replace the namespace's
    /// rules for publish, history and presence on this channel (see [`Grants`]).
    pub grants: Option<Grants>,
}

/// What a subscription may do beyond receiving publications, as the backend listed it
/// (`"allow": ["publish", "history", "presence"]`). A subscription with a list may do exactly
/// what it names: history or presence it leaves out are refused even where the namespace lets
/// subscribers read them, and `publish` lets this client publish even with `publish = false`
/// (a namespace with `publish_proxy` still asks the publish hook).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grants {
    /// May publish.
    pub publish: bool,
    /// May read history.
    pub history: bool,
    /// May read presence.
    pub presence: bool,
}

impl Grants {
    fn allows(&self, action: Action) -> bool {
        match action {
            Action::Subscribe => true,
            Action::Publish => self.publish,
            Action::History => self.history,
            Action::Presence => self.presence,
        }
    }
}

impl<'a> Client<'a> {
    /// A connection of `user` with no subscription and no grant on the channel.
    pub fn new(user: &'a str) -> Self {
        Client {
            user,
            subscribed: false,
            granted: false,
            has_subscription_token: false,
            grants: None,
        }
    }
}

/// What the caller must do next when the action is not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// Go ahead.
    Yes,
    /// Ask the subscribe hook; its answer decides.
    IfSubscribeHookAllows,
    /// Ask the publish hook; its answer decides (and may rewrite the data).
    IfPublishHookAllows,
}

/// Why an action is refused. Always the client's fault; the same request gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// A user-limited channel (`name#alice,bob`) does not list this user.
    #[error("channel is limited to other users")]
    OtherUsersOnly,
    /// The namespace admits only holders of a subscription token.
    #[error("channel needs a subscription token")]
    NeedsSubscriptionToken,
    /// The namespace admits only authenticated users.
    #[error("channel needs an authenticated user")]
    NeedsUser,
    /// The backend decides who may use this channel: only a subscription it allowed reads or
    /// writes it.
    #[error("subscribe first: the backend decides who may use this channel")]
    NeedsSubscription,
    /// The namespace does not let clients publish.
    #[error("clients may not publish here")]
    PublishOff,
    /// The backend listed what this subscription may do (`allow`), and this is not in it.
    #[error("the backend did not allow this on your subscription")]
    NotGranted,
}

impl From<Denied> for CommandError {
    fn from(e: Denied) -> Self {
        CommandError::new(ErrorCode::PermissionDenied, e.to_string())
    }
}

/// May `client` do `action` on `channel` of namespace `ns`? See the module docs.
pub fn decide(
    ns: &NamespaceConfig,
    channel: &str,
    client: &Client<'_>,
    action: Action,
) -> Result<Allowed, Denied> {
    // A user list binds everyone: no token, hook or rule widens it.
    if let Some(mut users) = allowed_users(channel) {
        if client.user.is_empty() || !users.any(|u| u == client.user) {
            return Err(Denied::OtherUsersOnly);
        }
    }
    // The backend's list for a live subscription decides publish, history and presence.
    if let (Some(grants), true, false) = (
        client.grants,
        client.subscribed,
        action == Action::Subscribe,
    ) {
        return match (grants.allows(action), action) {
            (false, _) => Err(Denied::NotGranted),
            (true, Action::Publish) if ns.publish_proxy => Ok(Allowed::IfPublishHookAllows),
            (true, _) => Ok(Allowed::Yes),
        };
    }
    match action {
        Action::Subscribe => {
            if client.granted || client.has_subscription_token {
                Ok(Allowed::Yes)
            } else if ns.subscribe_proxy {
                Ok(Allowed::IfSubscribeHookAllows)
            } else {
                static_rule(ns, client).map(|()| Allowed::Yes)
            }
        }
        Action::History | Action::Presence => may_read(ns, client).map(|()| Allowed::Yes),
        Action::Publish => {
            if ns.publish_proxy {
                return Ok(Allowed::IfPublishHookAllows);
            }
            if !ns.publish {
                return Err(Denied::PublishOff);
            }
            may_read(ns, client).map(|()| Allowed::Yes)
        }
    }
}

/// Reading (and, where the namespace allows it, publishing) needs what a subscription needs, or
/// the subscription itself where the hook decides.
fn may_read(ns: &NamespaceConfig, client: &Client<'_>) -> Result<(), Denied> {
    if client.subscribed || client.granted {
        Ok(())
    } else if ns.subscribe_proxy {
        Err(Denied::NeedsSubscription)
    } else {
        static_rule(ns, client)
    }
}

/// The namespace's `subscribe` rule alone.
fn static_rule(ns: &NamespaceConfig, client: &Client<'_>) -> Result<(), Denied> {
    match ns.subscribe {
        SubscribePolicy::Anonymous => Ok(()),
        SubscribePolicy::Authenticated if !client.user.is_empty() => Ok(()),
        SubscribePolicy::Authenticated => Err(Denied::NeedsUser),
        SubscribePolicy::Token => Err(Denied::NeedsSubscriptionToken),
    }
}

/// A Pusher client event (`client-*` sent by a client to the other subscribers of a channel),
/// as the Pusher protocol allows it: the app enables them, and the connection is subscribed to
/// the channel, which is private or presence (so its subscription was signed by the backend)
/// and not end-to-end encrypted (the node cannot encrypt what the client sends).
#[derive(Debug, Clone, Copy)]
pub struct ClientEvent {
    /// The app has `enable_client_events`.
    pub enabled: bool,
    /// The connection is subscribed to the channel.
    pub subscribed: bool,
    /// The channel is `private-` or `presence-`.
    pub signed_channel: bool,
    /// The channel is `private-encrypted-`.
    pub encrypted: bool,
}

/// Why a client event is refused (the Pusher error's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClientEventDenied {
    /// The app does not enable client events.
    #[error("To send client events, enable client events for the app (enable_client_events)")]
    Disabled,
    /// Not subscribed to the channel.
    #[error("Client event on a channel this connection is not subscribed to")]
    NotSubscribed,
    /// A public (or user) channel.
    #[error("Client events are only allowed on private and presence channels")]
    UnsignedChannel,
    /// An end-to-end encrypted channel.
    #[error("Client events are not supported on encrypted channels (private-encrypted-)")]
    Encrypted,
}

/// May a Pusher connection send a client event? See [`ClientEvent`].
pub fn decide_client_event(event: &ClientEvent) -> Result<(), ClientEventDenied> {
    if !event.enabled {
        Err(ClientEventDenied::Disabled)
    } else if !event.subscribed {
        Err(ClientEventDenied::NotSubscribed)
    } else if !event.signed_channel {
        Err(ClientEventDenied::UnsignedChannel)
    } else if event.encrypted {
        Err(ClientEventDenied::Encrypted)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
