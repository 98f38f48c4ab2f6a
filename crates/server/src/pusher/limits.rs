//! Pusher's size limits, in one place for every path that takes the input (client events,
//! the HTTP API, presence subscriptions). An app may set its own (`AppConfig`'s Soketi-named
//! limits); these are the defaults.

use serde_json::value::RawValue;

/// Longest event name, in characters (Pusher's limit).
pub const MAX_EVENT_NAME_CHARS: usize = 200;

/// Largest presence `user_info`, as JSON text, in bytes (Pusher documents 1 KB). Every member's
/// info goes to every subscriber of the channel and into the broker's presence set, so it is
/// bounded as hosted Pusher bounds it.
pub const MAX_USER_INFO_BYTES: usize = 1024;

/// Input over one of the limits. Its message is the text Pusher clients are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// An event name of 0 or more than this many characters.
    #[error("Event names are 1 to {0} characters")]
    EventName(usize),
    /// A presence `user_info` over this many bytes.
    #[error("user_info is over {0} bytes")]
    UserInfo(usize),
}

/// An event name is 1 to `max` characters; the error says so.
pub fn check_event_name(name: &str, max: usize) -> Result<(), LimitError> {
    match name.chars().count() {
        n if n >= 1 && n <= max => Ok(()),
        _ => Err(LimitError::EventName(max)),
    }
}

/// A presence member's `user_info` is at most `max` bytes of JSON.
pub fn check_user_info(info: Option<&RawValue>, max: usize) -> Result<(), LimitError> {
    match info {
        Some(info) if info.get().len() > max => Err(LimitError::UserInfo(max)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive() {
        let names = MAX_EVENT_NAME_CHARS;
        assert!(
            check_event_name(&"é".repeat(200), names).is_ok(),
            "characters, not bytes"
        );
        assert!(check_event_name(&"x".repeat(201), names).is_err());
        assert!(check_event_name("", names).is_err());
        assert!(check_event_name("abc", 2).is_err(), "an app's own limit");
        let info = MAX_USER_INFO_BYTES;
        let at = RawValue::from_string(format!("\"{}\"", "a".repeat(1022))).unwrap();
        let over = RawValue::from_string(format!("\"{}\"", "a".repeat(1023))).unwrap();
        assert!(check_user_info(Some(&at), info).is_ok());
        assert!(check_user_info(Some(&over), info).is_err());
        assert!(check_user_info(None, info).is_ok());
    }

    #[test]
    fn messages_name_the_limits() {
        assert_eq!(
            LimitError::EventName(200).to_string(),
            "Event names are 1 to 200 characters"
        );
        assert_eq!(
            LimitError::UserInfo(1024).to_string(),
            "user_info is over 1024 bytes"
        );
    }
}
