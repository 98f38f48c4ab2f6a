//! Pusher's own size limits, in one place for every path that takes the input (client events,
//! the HTTP API, presence subscriptions).

use serde_json::value::RawValue;

/// Longest event name, in characters (Pusher's limit).
pub const MAX_EVENT_NAME_CHARS: usize = 200;

/// Largest presence `user_info`, as JSON text, in bytes (Pusher documents 1 KB). Every member's
/// info goes to every subscriber of the channel and into the broker's presence set, so it is
/// bounded as hosted Pusher bounds it.
pub const MAX_USER_INFO_BYTES: usize = 1024;

/// Input over one of Pusher's limits. Its message is the text Pusher clients are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// An event name of 0 or more than [`MAX_EVENT_NAME_CHARS`] characters.
    #[error("Event names are 1 to {MAX_EVENT_NAME_CHARS} characters")]
    EventName,
    /// A presence `user_info` over [`MAX_USER_INFO_BYTES`].
    #[error("user_info is over {MAX_USER_INFO_BYTES} bytes")]
    UserInfo,
}

impl LimitError {
    /// The message as static text (what `Display` writes).
    pub fn message(&self) -> &'static str {
        match self {
            LimitError::EventName => "Event names are 1 to 200 characters",
            LimitError::UserInfo => "user_info is over 1024 bytes",
        }
    }
}

/// An event name is 1 to [`MAX_EVENT_NAME_CHARS`] characters; the error says so.
pub fn check_event_name(name: &str) -> Result<(), LimitError> {
    match name.chars().count() {
        1..=MAX_EVENT_NAME_CHARS => Ok(()),
        _ => Err(LimitError::EventName),
    }
}

/// A presence member's `user_info` is at most [`MAX_USER_INFO_BYTES`] of JSON.
pub fn check_user_info(info: Option<&RawValue>) -> Result<(), LimitError> {
    match info {
        Some(info) if info.get().len() > MAX_USER_INFO_BYTES => Err(LimitError::UserInfo),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive() {
        assert!(
            check_event_name(&"é".repeat(200)).is_ok(),
            "characters, not bytes"
        );
        assert!(check_event_name(&"x".repeat(201)).is_err());
        assert!(check_event_name("").is_err());
        let at = RawValue::from_string(format!("\"{}\"", "a".repeat(1022))).unwrap();
        let over = RawValue::from_string(format!("\"{}\"", "a".repeat(1023))).unwrap();
        assert!(check_user_info(Some(&at)).is_ok());
        assert!(check_user_info(Some(&over)).is_err());
        assert!(check_user_info(None).is_ok());
    }

    #[test]
    fn messages_name_the_limits() {
        for e in [LimitError::EventName, LimitError::UserInfo] {
            assert_eq!(
                e.to_string(),
                e.message(),
                "the static text follows the constants"
            );
        }
    }
}
