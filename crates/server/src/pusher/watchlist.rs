//! Pusher's watchlist events (opt-in per app, `enable_watchlist_events`): a connection signed in
//! (`pusher:signin`) with a `watchlist` in its `user_data` is told which of the watched users are
//! online, then when each comes online or goes offline, in `pusher_internal:watchlist_events`.
//! A user is online while at least one connection anywhere in the cluster is signed in as them.
//!
//! # How
//! Built on the hub's presence, so it works on every broker and across nodes:
//! - every signed-in connection of such an app is a presence member of its user's online
//!   channel, the app's `#watchlist-online-{user}` (`#` is outside Pusher's channel alphabet: no
//!   client can subscribe to it, and the census and webhooks skip it);
//! - a watcher subscribes, through the hub, to the online channel of each watched user: the hub
//!   delivers the joins and leaves of every node to it, and the broker's presence set says who
//!   is online when it signs in.
//!
//! [`Watched`] turns the sockets joining and leaving into users coming online and going offline.
//! Joins and leaves are per socket, and each may reach the watcher twice (the member list read at
//! sign-in and the live push), so it keeps each watched user's sockets and reports a user only
//! when the first socket comes or the last one goes.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use serde::Deserialize;

/// The Pusher-side name of a user's online channel, before the user id.
pub const ONLINE_PREFIX: &str = "#watchlist-online-";

/// Most users one watchlist may name (Pusher's limit).
pub const MAX_WATCHLIST: usize = 100;

/// The Pusher-side name of `user`'s online channel (the app's prefix makes it the Herald one).
pub fn online_channel(user: &str) -> String {
    format!("{ONLINE_PREFIX}{user}")
}

/// The user whose online channel this is (`None`: not an online channel).
pub fn watched_user(channel: &str) -> Option<&str> {
    channel.strip_prefix(ONLINE_PREFIX)
}

/// The `watchlist` of a sign-in's `user_data`.
#[derive(Debug, Deserialize)]
pub struct WatchlistData {
    /// The users to watch (absent: none).
    #[serde(default)]
    pub watchlist: Option<serde_json::Value>,
}

/// The watched user ids of a `user_data` JSON text, checked: an array of at most
/// [`MAX_WATCHLIST`] non-empty strings (repeats count once). `Err`: why not.
pub fn parse(user_data: &str) -> Result<Vec<String>, String> {
    let data: WatchlistData = serde_json::from_str(user_data)
        .map_err(|_| "user_data must be a JSON object".to_owned())?;
    let Some(list) = data.watchlist else {
        return Ok(Vec::new());
    };
    let serde_json::Value::Array(items) = list else {
        return Err("user_data watchlist must be an array of user ids".into());
    };
    let mut seen = HashSet::new();
    let mut users = Vec::new();
    for item in items {
        match item {
            serde_json::Value::String(id) if !id.is_empty() => {
                if seen.insert(id.clone()) {
                    users.push(id);
                }
            }
            _ => return Err("user_data watchlist entries must be non-empty strings".into()),
        }
    }
    if users.len() > MAX_WATCHLIST {
        return Err(format!(
            "user_data watchlist names {} users, at most {MAX_WATCHLIST}",
            users.len()
        ));
    }
    Ok(users)
}

/// A watched user's change: online (`true`) or offline.
pub type Change = bool;

/// What one connection knows of its watched users: each one's signed-in sockets (none: offline).
#[derive(Debug, Default)]
pub struct Watched {
    users: HashMap<String, HashSet<Box<str>>>,
}

impl Watched {
    /// Watching `users`, none of them known online yet.
    pub fn new(users: &[String]) -> Watched {
        Watched {
            users: users.iter().map(|u| (u.clone(), HashSet::new())).collect(),
        }
    }

    /// The watched users.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Stop watching `user` (its channel could not be followed).
    pub fn forget(&mut self, user: &str) {
        self.users.remove(user);
    }

    /// Socket `client` of `user` joined (`joined`) or left: whether the user came online or
    /// went offline (`None`: neither, or not watched).
    pub fn change(&mut self, user: &str, client: &str, joined: bool) -> Option<Change> {
        let sockets = self.users.get_mut(user)?;
        let was_online = !sockets.is_empty();
        match joined {
            true => sockets.insert(client.into()),
            false => sockets.remove(client),
        };
        let online = !sockets.is_empty();
        (online != was_online).then_some(online)
    }

    /// `user`'s sockets are `clients` now (the presence set as read): whether the user came
    /// online or went offline.
    pub fn reset<'a>(
        &mut self,
        user: &str,
        clients: impl Iterator<Item = &'a str>,
    ) -> Option<Change> {
        let sockets = self.users.get_mut(user)?;
        let was_online = !sockets.is_empty();
        *sockets = clients.map(Box::from).collect();
        let online = !sockets.is_empty();
        (online != was_online).then_some(online)
    }
}

/// `pusher_internal:watchlist_events` with the users that came `online` and went `offline`
/// (data, a JSON string: `{"events": [{"name": "online"|"offline", "user_ids": [...]}]}`, an
/// event only for a non-empty list). `None`: both are empty.
pub fn events_frame(online: &[&str], offline: &[&str]) -> Option<Bytes> {
    let events: Vec<serde_json::Value> = [("online", online), ("offline", offline)]
        .into_iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(name, ids)| serde_json::json!({"name": name, "user_ids": ids}))
        .collect();
    (!events.is_empty()).then(|| super::wire::watchlist_events(&events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_online_from_the_first_socket_to_the_last() {
        let mut w = Watched::new(&["a".into()]);
        assert_eq!(w.change("a", "1.1", true), Some(true));
        assert_eq!(w.change("a", "1.2", true), None);
        assert_eq!(w.change("a", "1.1", true), None, "a repeated join");
        assert_eq!(w.change("a", "1.1", false), None);
        assert_eq!(w.change("a", "1.1", false), None, "a repeated leave");
        assert_eq!(w.change("a", "1.2", false), Some(false));
        assert_eq!(w.change("b", "1.3", true), None, "b is not watched");
    }

    #[test]
    fn a_reset_reports_the_difference() {
        let mut w = Watched::new(&["a".into(), "b".into()]);
        assert_eq!(w.reset("a", ["1.1"].into_iter()), Some(true));
        assert_eq!(w.reset("a", ["1.2"].into_iter()), None);
        assert_eq!(w.change("a", "1.2", true), None, "already counted");
        assert_eq!(w.reset("a", std::iter::empty()), Some(false));
        assert_eq!(w.reset("b", std::iter::empty()), None);
    }

    #[test]
    fn watchlists_are_checked() {
        assert_eq!(parse(r#"{"id":"u"}"#).unwrap(), Vec::<String>::new());
        assert_eq!(
            parse(r#"{"id":"u","watchlist":["a","b","a"]}"#).unwrap(),
            ["a", "b"]
        );
        assert!(parse(r#"{"id":"u","watchlist":"a"}"#).is_err());
        assert!(parse(r#"{"id":"u","watchlist":[1]}"#).is_err());
        assert!(parse(r#"{"id":"u","watchlist":[""]}"#).is_err());
        let ids: Vec<String> = (0..=MAX_WATCHLIST).map(|i| i.to_string()).collect();
        let over = serde_json::json!({"id": "u", "watchlist": ids}).to_string();
        let why = parse(&over).unwrap_err();
        assert!(why.contains("at most 100"), "{why}");
        let ids = &ids[..MAX_WATCHLIST];
        let full = serde_json::json!({"id": "u", "watchlist": ids}).to_string();
        assert_eq!(parse(&full).unwrap().len(), MAX_WATCHLIST);
    }

    #[test]
    fn the_frame_lists_each_kind_once() {
        assert!(events_frame(&[], &[]).is_none());
        let frame = events_frame(&["a"], &[]).unwrap();
        let m: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(m["event"], "pusher_internal:watchlist_events");
        let data: serde_json::Value = serde_json::from_str(m["data"].as_str().unwrap()).unwrap();
        assert_eq!(
            data,
            serde_json::json!({"events": [{"name": "online", "user_ids": ["a"]}]})
        );
    }
}
