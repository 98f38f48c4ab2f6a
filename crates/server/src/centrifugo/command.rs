//! Centrifugo's `publish` and `broadcast` requests as Herald commands ([`decode`]), and its
//! `subscribe`, `unsubscribe` and `disconnect` requests as control messages ([`control`]): the
//! one decoder that the compatibility API (`/centrifugo/api/<method>`, `batch`), the PostgreSQL
//! outbox and the Kafka consumer share.
//!
//! Centrifugo's fields are a superset of Herald's own bodies (`channel`/`channels`, `data`,
//! `idempotency_key`), so every row or record Herald took before still decodes the same way.
//! The others:
//! - `b64data`: decoded, and published as the data when the bytes are JSON (Herald's
//!   publications are JSON); anything else is error 107.
//! - `skip_history`: honoured: on a channel with history the publication is delivered live
//!   only, not stored and without an offset (docs/protocol.md, "skip_history").
//! - `delta`: accepted; subscribers get the whole data (Herald has no delta compression), which
//!   is what a Centrifugo client that did not negotiate deltas gets too.
//! - `tags`: carried with the publication, within Herald's bounds (docs/protocol.md, "Tags").
//! - `version`, `version_epoch` set: error 107 (Herald does not drop stale versions).

use bytes::Bytes;
use herald_broker::ControlMessage;
use herald_core::namespace::Namespaces;
use herald_core::session::NodeContext;
use herald_protocol::{CloseCode, ErrorCode};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::fields::Fields;
use crate::publishing::{check_idempotency_key, check_tags, data_or_b64, Command, PublishError};
use herald_protocol::tags::Tags;

/// Centrifugo's fields of `publish` and `broadcast` that Herald does not honour, accepted
/// only at their zero value (`version` 0, `version_epoch` "").
const UNSUPPORTED: &[&str] = &["version", "version_epoch"];

/// The command for Centrifugo `method` (`publish` or `broadcast`) with `payload`, its request
/// body. Herald's own bodies are decoded
/// the same way. Errors are refusals (107, 104 for another method): retrying cannot help.
pub fn decode(method: &str, payload: &[u8]) -> Result<Command, PublishError> {
    let (mut f, broadcast) = match method {
        "publish" => (Fields::parse("publish", payload)?, false),
        "broadcast" => (Fields::parse("broadcast", payload)?, true),
        other => {
            return Err(PublishError::refused(
                ErrorCode::UnknownMethod,
                format!("unknown method {other:?} (publish or broadcast)"),
            ))
        }
    };
    let channels: Vec<String> = if broadcast {
        f.required("channels")?
    } else {
        vec![f.required::<String>("channel")?]
    };
    let data = data(&mut f)?;
    let idempotency_key = f
        .take::<String>("idempotency_key")?
        .filter(|k| !k.is_empty());
    if let Some(key) = &idempotency_key {
        check_idempotency_key(key)?;
    }
    let tags: Tags = f.take("tags")?.unwrap_or_default();
    check_tags(&tags)?;
    let skip_history = f.take::<bool>("skip_history")?.unwrap_or(false);
    let _delta = f.take::<bool>("delta")?;
    f.finish(UNSUPPORTED)?;
    Ok(if broadcast {
        Command::Broadcast {
            channels,
            data,
            idempotency_key,
            tags,
            skip_history,
        }
    } else {
        Command::Publish {
            channel: channels.into_iter().next().expect("one channel"),
            data,
            idempotency_key,
            tags,
            skip_history,
        }
    })
}

/// `data`, or `b64data` decoded to JSON text; exactly one of them.
fn data(f: &mut Fields) -> Result<Bytes, PublishError> {
    let raw = f.take_raw("data");
    let b64 = f.take::<String>("b64data")?.filter(|s| !s.is_empty());
    // `"data": null` is data (as on Herald's API), unless `b64data` gives the data.
    let raw = raw.filter(|r| b64.is_none() || r.get() != "null");
    data_or_b64(raw.as_deref(), b64.as_deref())
}

fn bad(message: impl Into<String>) -> PublishError {
    PublishError::refused(ErrorCode::BadRequest, message)
}

/// Centrifugo's `subscribe`, `unsubscribe` and `disconnect` requests as the control message
/// every node acts on (`None` for another method): the compatibility API and the consumers
/// run them alike.
/// - `subscribe` / `unsubscribe`: `user` and `channel` (every connection of the user); the
///   other Centrifugo fields (`client`, `session`, `info`, `data`, `expire_at`,
///   `recover_since`, `override`, …) are error 107 when set.
/// - `disconnect`: `user` (all its connections) or `client` (one connection), with
///   `disconnect.code` in 4000–4999 (default 4502, no reconnect, Centrifugo's 3503 "force
///   disconnect"); `disconnect.reason` is not carried (the client sees Herald's reason);
///   `whitelist`, `session` are error 107 when set.
pub fn control(
    method: &str,
    payload: &[u8],
    namespaces: &Namespaces,
) -> Result<Option<ControlMessage>, PublishError> {
    match method {
        "subscribe" | "unsubscribe" => {
            let subscribe = method == "subscribe";
            let mut f = Fields::parse(
                if subscribe {
                    "subscribe"
                } else {
                    "unsubscribe"
                },
                payload,
            )?;
            let channel: String = f.required("channel")?;
            let user: String = f.required("user")?;
            if subscribe {
                f.finish(&[
                    "expire_at",
                    "info",
                    "b64info",
                    "client",
                    "data",
                    "b64data",
                    "recover_since",
                    "override",
                    "session",
                    "label_filter",
                    "all_users",
                ])?;
            } else {
                f.finish(&["client", "session", "label_filter", "all_users"])?;
            }
            namespaces.resolve(&channel)?;
            Ok(Some(if subscribe {
                ControlMessage::Subscribe { user, channel }
            } else {
                ControlMessage::Unsubscribe { user, channel }
            }))
        }
        "disconnect" => disconnect(payload).map(Some),
        _ => Ok(None),
    }
}

/// A Centrifugo command that publishes nothing: a message every node acts on, or the removal of a
/// channel's history (in the shared store, done once).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `subscribe`, `unsubscribe`, `disconnect` ([`control`]).
    Control(ControlMessage),
    /// `history_remove`: the channel whose stored publications go (its epoch and top offset
    /// stay, so recovery from before answers `recovered: false`).
    RemoveHistory {
        /// The channel.
        channel: String,
    },
}

impl Action {
    /// Run it: the one place the compatibility API, the batch and both consumers do. A broker
    /// that cannot remove history answers 108.
    pub async fn run(&self, ctx: &NodeContext) -> Result<(), PublishError> {
        let broker = ctx.hub.broker();
        match self {
            Action::Control(message) => Ok(broker.publish_control(message).await?),
            Action::RemoveHistory { channel } => match broker.remove_history(channel).await? {
                true => Ok(()),
                false => Err(PublishError::refused(
                    ErrorCode::NotAvailable,
                    "this broker cannot remove a channel's history",
                )),
            },
        }
    }
}

/// [`control`], and `history_remove` (`{"channel"}`): what the compatibility API, the batch and
/// the consumers run without publishing (`None` for another method); [`Action::run`] runs it.
pub fn action(
    method: &str,
    payload: &[u8],
    namespaces: &Namespaces,
) -> Result<Option<Action>, PublishError> {
    if method == "history_remove" {
        let mut f = Fields::parse("history_remove", payload)?;
        let channel: String = f.required("channel")?;
        f.finish(&[])?;
        namespaces.resolve(&channel)?;
        return Ok(Some(Action::RemoveHistory { channel }));
    }
    Ok(control(method, payload, namespaces)?.map(Action::Control))
}

fn disconnect(payload: &[u8]) -> Result<ControlMessage, PublishError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Disconnect {
        #[serde(default)]
        code: u32,
        #[serde(default)]
        #[allow(dead_code)]
        reason: String,
    }
    let mut f = Fields::parse("disconnect", payload)?;
    let user = f.string("user")?;
    let client = f.string("client")?;
    let code = match f.take::<Disconnect>("disconnect")? {
        Some(d) if d.code != 0 => d.code,
        _ => u32::from(CloseCode::DISCONNECTED_BY_API.0),
    };
    f.finish(&["whitelist", "session", "label_filter", "all_users"])?;
    if !(4000..5000).contains(&code) {
        return Err(bad(
            "disconnect: Herald's close codes are 4000–4999 (4000–4499 reconnect, 4500–4999 do \
             not); Centrifugo's 3503 \"force disconnect\" is Herald's default, 4502",
        ));
    }
    if user.is_empty() && client.is_empty() {
        return Err(bad("bad JSON body: missing field \"user\""));
    }
    // A client id names one connection, whoever its user.
    let (user, client) = match client.is_empty() {
        true => (Some(user), None),
        false => (None, Some(client)),
    };
    Ok(ControlMessage::Disconnect {
        user,
        client,
        code: code as u16,
    })
}

/// `{"method", "payload"}`, the shape of a Centrifugo outbox row or Kafka record, where the
/// payload may also be a JSON string holding the request (as CDC tools write a `jsonb` column).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The API method.
    pub method: String,
    /// The request body.
    pub payload: Box<RawValue>,
}

impl Envelope {
    /// The payload's JSON text: the payload itself, or the text of a JSON string payload.
    pub fn payload_text(&self) -> Result<String, PublishError> {
        let raw = self.payload.get();
        if raw.starts_with('"') {
            serde_json::from_str::<String>(raw)
                .map_err(|e| bad(format!("bad JSON payload string: {e}")))
        } else {
            Ok(raw.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::config::NamespaceConfig;
    use herald_core::Config;

    fn namespaces() -> Namespaces {
        let mut config = Config::default();
        config.default_namespace.history_size = 10;
        config.namespaces.push(NamespaceConfig {
            name: "live".into(),
            history_size: 0,
            ..NamespaceConfig::default()
        });
        Namespaces::from_config(&config)
    }

    fn data_of(c: &Command) -> (&[String], String, Option<String>) {
        match c {
            Command::Publish {
                channel,
                data,
                idempotency_key,
                ..
            } => (
                std::slice::from_ref(channel),
                String::from_utf8(data.to_vec()).unwrap(),
                idempotency_key.clone(),
            ),
            Command::Broadcast {
                channels,
                data,
                idempotency_key,
                ..
            } => (
                channels,
                String::from_utf8(data.to_vec()).unwrap(),
                idempotency_key.clone(),
            ),
        }
    }

    #[test]
    fn herald_and_centrifugo_bodies_decode() {
        let c = decode(
            "publish",
            br#"{"channel":"a","data":{"x":12345678901234567890123},"idempotency_key":"k"}"#,
        )
        .unwrap();
        assert_eq!(
            data_of(&c),
            (
                &["a".to_owned()][..],
                r#"{"x":12345678901234567890123}"#.to_owned(),
                Some("k".into())
            )
        );
        let c = decode("broadcast", br#"{"channels":["a","b"],"b64data":"eyJ4IjoxfQ==","tags":{},"delta":true,"version":0,"idempotency_key":""}"#)
        .unwrap();
        assert_eq!(
            data_of(&c),
            (
                &["a".to_owned(), "b".to_owned()][..],
                r#"{"x":1}"#.to_owned(),
                None
            )
        );
        assert!(decode(
            "publish",
            br#"{"channel":"live:x","data":1,"skip_history":true}"#
        )
        .is_ok());
    }

    #[test]
    fn what_herald_cannot_honour_is_refused_by_name() {
        let err = |m: &str, b: &str| decode(m, b.as_bytes()).unwrap_err();
        let e = err("publish", r#"{"channel":"a","data":1,"tags":{"":"v"}}"#);
        assert_eq!(e.error_code(), ErrorCode::BadRequest);
        assert!(e.message().contains("tags: a key"), "{e}");
        let e = err("publish", r#"{"channel":"a","data":1,"tags":{"k":1}}"#);
        assert!(e.message().contains("\"tags\""), "{e}");
        let e = err("publish", r#"{"channel":"a","b64data":"AAEC"}"#);
        assert!(e.message().contains("must decode to JSON"), "{e}");
        let e = err("publish", r#"{"channel":"a","b64data":"%%"}"#);
        assert!(e.message().contains("not base64"), "{e}");
        let e = err("publish", r#"{"channel":"a"}"#);
        assert!(e.message().contains("missing field \"data\""), "{e}");
        let e = err("publish", r#"{"chanel":"a","data":1}"#);
        assert!(e.message().starts_with("bad JSON body"), "{e}");
        let e = err("publish", "[1, 2]");
        assert!(e.message().starts_with("bad JSON body"), "{e}");
        let e = err("publish", r#"{"channel":"a","data":1,"version":3}"#);
        assert!(e.message().contains("\"version\""), "{e}");
        let e = err("publish", r#"{"channel":"a","data":1,"colour":3}"#);
        assert!(e.message().contains("unknown field"), "{e}");
        let e = err(
            "publish",
            r#"{"channel":"a","data":1,"idempotency_key":"a b"}"#,
        );
        assert!(e.message().contains("idempotency_key"), "{e}");
        let e = err("subscribe", r#"{}"#);
        assert_eq!(e.error_code(), ErrorCode::UnknownMethod);
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let e = err("publish", &format!(r#"{{"channel":"a","data":{deep}}}"#));
        assert_eq!(e.error_code(), ErrorCode::BadRequest);
    }

    #[test]
    fn control_commands_become_messages_for_every_node() {
        let ns = namespaces();
        let msg = |m: &str, b: &str| control(m, b.as_bytes(), &ns);
        assert_eq!(
            msg("disconnect", r#"{"user":"u"}"#).unwrap(),
            Some(ControlMessage::Disconnect {
                user: Some("u".into()),
                client: None,
                code: 4502
            })
        );
        assert_eq!(
            msg(
                "disconnect",
                r#"{"user":"u","client":"c","disconnect":{"code":4001,"reason":"r"}}"#
            )
            .unwrap(),
            Some(ControlMessage::Disconnect {
                user: None,
                client: Some("c".into()),
                code: 4001
            })
        );
        let e = msg("disconnect", r#"{"user":"u","disconnect":{"code":3503}}"#).unwrap_err();
        assert!(e.message().contains("4502"), "{e}");
        assert!(msg("disconnect", r#"{"user":"u","whitelist":["c"]}"#).is_err());
        assert_eq!(
            msg("unsubscribe", r#"{"user":"u","channel":"a"}"#).unwrap(),
            Some(ControlMessage::Unsubscribe {
                user: "u".into(),
                channel: "a".into()
            })
        );
        let e = msg("subscribe", r#"{"user":"u","channel":"a","client":"c"}"#).unwrap_err();
        assert!(e.message().contains("\"client\" is not supported"), "{e}");
        assert_eq!(
            msg("subscribe", r#"{"user":"u","channel":"nope:a"}"#)
                .unwrap_err()
                .error_code(),
            ErrorCode::UnknownNamespace
        );
        assert_eq!(msg("publish", "{}").unwrap(), None);
    }

    #[test]
    fn an_envelope_payload_may_be_a_string() {
        let e: Envelope = serde_json::from_str(
            r#"{"method":"publish","payload":"{\"channel\":\"a\",\"data\":1}"}"#,
        )
        .unwrap();
        assert_eq!(e.payload_text().unwrap(), r#"{"channel":"a","data":1}"#);
        let e: Envelope =
            serde_json::from_str(r#"{"method":"publish","payload":{"channel":"a","data":1}}"#)
                .unwrap();
        assert_eq!(e.payload_text().unwrap(), r#"{"channel":"a","data":1}"#);
    }
}
