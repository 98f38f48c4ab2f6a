//! Channel names ↔ NATS subject tokens, and every subject the broker uses.
//!
//! A channel becomes one subject token, so a channel never spans several tokens and no channel
//! name can act as a wildcard. `[A-Za-z0-9_/-]` pass through; every other byte becomes `=XX`
//! (upper-case hex), `=` included. The result is also a valid JetStream KV key and stream subject,
//! and the mapping is reversible ([`unescape`]).
//!
//! ```text
//! chat:room.1   →  chat=3Aroom=2E1
//! ```

use std::fmt::Write;

/// Escape a channel name (or client id) into one subject token. Never empty: `""` → `=`.
pub fn escape(name: &str) -> String {
    if name.is_empty() {
        return "=".to_owned();
    }
    let mut out = String::with_capacity(name.len() + 8);
    for &b in name.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'/' {
            out.push(b as char);
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    out
}

/// Reverse [`escape`]. `None` for a token that no channel name escapes to.
pub fn unescape(token: &str) -> Option<String> {
    if token == "=" {
        return Some(String::new());
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = token.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The subjects of one Herald deployment (all under one prefix).
///
/// ```text
/// <p>.h.<channel>            history stream (publish target, JetStream)
/// <p>.l.<channel>            live stream: channels without history, one message kept per channel
/// <p>.d.<channel>            delivery: both streams republish here; presence changes too
/// <p>.p.<channel>.<client>   presence stream (one message per client, expires)
/// <p>.control                control messages, every node subscribes
/// ```
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Subjects under `prefix` (e.g. `herald`).
    pub fn new(prefix: &str) -> Self {
        Subjects {
            prefix: prefix.trim_end_matches('.').to_owned(),
        }
    }

    /// Where publications of a channel with history are stored.
    pub fn history(&self, channel: &str) -> String {
        format!("{}.h.{}", self.prefix, escape(channel))
    }

    /// The subject prefix (no trailing dot).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The channel token of a history subject (`<p>.h.<token>`); `None` for another subject.
    pub(crate) fn history_token<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".h.")
            .filter(|token| !token.is_empty() && !token.contains('.'))
    }

    /// Where publications of a channel without history are stored (one kept).
    pub fn live(&self, channel: &str) -> String {
        format!("{}.l.{}", self.prefix, escape(channel))
    }

    /// Where nodes that host the channel receive its publications and presence changes.
    pub fn delivery(&self, channel: &str) -> String {
        format!("{}.d.{}", self.prefix, escape(channel))
    }

    /// One client's presence record in a channel.
    pub fn presence(&self, channel: &str, client: &str) -> String {
        format!("{}.p.{}.{}", self.prefix, escape(channel), escape(client))
    }

    /// Filter over every presence record of a channel (used only to read, never to deliver).
    pub fn presence_of(&self, channel: &str) -> String {
        format!("{}.p.{}.*", self.prefix, escape(channel))
    }

    /// The control subject.
    pub fn control(&self) -> String {
        format!("{}.control", self.prefix)
    }

    /// A subject nothing subscribes to or stores: a request to it comes back as "no responders"
    /// after one server round trip (see `Inner::round_trip`).
    pub fn sync(&self) -> String {
        format!("{}.sync", self.prefix)
    }

    /// The subject of the boot id (see the `boot` module), in its own memory stream.
    pub fn boot(&self) -> String {
        format!("{}.boot", self.prefix)
    }

    /// Stream subjects and republish mappings: (history filter, live filter, presence filter,
    /// history → delivery, live → delivery).
    pub(crate) fn stream_filters(&self) -> StreamFilters {
        let p = &self.prefix;
        StreamFilters {
            history: format!("{p}.h.>"),
            live: format!("{p}.l.>"),
            presence: format!("{p}.p.>"),
            delivery: format!("{p}.d.>"),
        }
    }
}

/// Wildcard filters of the streams (stream configuration only; never subscribed to).
pub(crate) struct StreamFilters {
    pub(crate) history: String,
    pub(crate) live: String,
    pub(crate) presence: String,
    pub(crate) delivery: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_into_one_safe_token_and_back() {
        let names = [
            "chat",
            "chat:room.1",
            "ns:name#alice,bob",
            "a..b",
            "x=y",
            "@/_-,=#",
            "*",
            ">",
            "",
            "é",
        ];
        for name in names {
            let token = escape(name);
            assert!(!token.is_empty());
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-/=".contains(&b)),
                "{name} → {token}"
            );
            assert_eq!(unescape(&token).as_deref(), Some(name), "{name} → {token}");
        }
        assert_eq!(escape("chat:room.1"), "chat=3Aroom=2E1");
    }

    #[test]
    fn distinct_names_get_distinct_tokens() {
        assert_ne!(escape("a.b"), escape("a=2Eb"));
        assert_ne!(escape(""), escape("="));
    }

    #[test]
    fn rejects_malformed_tokens() {
        assert_eq!(unescape("=4"), None);
        assert_eq!(unescape("=ZZ"), None);
    }

    #[test]
    fn subjects_live_under_the_prefix() {
        let s = Subjects::new("herald");
        assert_eq!(s.history("a:b"), "herald.h.a=3Ab");
        assert_eq!(s.delivery("a:b"), "herald.d.a=3Ab");
        assert_eq!(s.presence("a:b", "c.1"), "herald.p.a=3Ab.c=2E1");
        assert_eq!(s.presence_of("a:b"), "herald.p.a=3Ab.*");
        assert_eq!(s.control(), "herald.control");
        assert_eq!(s.history_token("herald.h.a=3Ab"), Some("a=3Ab"));
        assert_eq!(s.history_token("herald.l.a"), None);
        assert_eq!(s.history_token("heraldx.h.a"), None);
        assert_eq!(s.history_token("herald.h.a.b"), None);
    }
}
