//! Centrifugo's `publish` and `broadcast` requests as Herald commands: the one decoder that the
//! compatibility API (`/centrifugo/api/publish`, `…/broadcast`, `batch`), the PostgreSQL outbox
//! and the Kafka consumer share.
//!
//! Centrifugo's fields are a superset of Herald's own bodies (`channel`/`channels`, `data`,
//! `idempotency_key`), so every row or record Herald took before still decodes the same way.
//! The others:
//! - `b64data`: decoded, and published as the data when the bytes are JSON (Herald's
//!   publications are JSON); anything else is error 107.
//! - `skip_history`: honoured where it changes nothing, on channels whose namespace keeps no
//!   history; on a channel with history it is error 107, because every publication of a Herald
//!   stream is kept in order (recovery is all or nothing over offsets).
//! - `delta`: accepted; subscribers get the whole data (Herald has no delta compression), which
//!   is what a Centrifugo client that did not negotiate deltas gets too.
//! - `tags`, `version`, `version_epoch` set: error 107 (Herald publications carry no tags, and
//!   do not drop stale versions).

use base64::Engine;
use bytes::Bytes;
use herald_core::namespace::Namespaces;
use herald_core::session::check_data_depth;
use herald_protocol::ErrorCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::fields::Fields;
use crate::publishing::{check_idempotency_key, Command, PublishError};

/// Centrifugo's fields of `publish` and `broadcast` that Herald does not honour, accepted
/// only at their zero value (`tags` `{}`, `version` 0, `version_epoch` "").
const UNSUPPORTED: &[&str] = &["tags", "version", "version_epoch"];

/// The command for Centrifugo `method` (`publish` or `broadcast`) with `payload`, its request
/// body; `namespaces` decide where `skip_history` is allowed. Herald's own bodies are decoded
/// the same way. Errors are refusals (107, 104 for another method): retrying cannot help.
pub fn decode(
    method: &str,
    payload: &[u8],
    namespaces: &Namespaces,
) -> Result<Command, PublishError> {
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
    let skip_history = f.take::<bool>("skip_history")?.unwrap_or(false);
    let _delta = f.take::<bool>("delta")?;
    f.finish(UNSUPPORTED)?;
    if skip_history {
        for channel in &channels {
            if namespaces
                .resolve(channel)
                .is_ok_and(|ns| ns.history_size > 0)
            {
                return Err(PublishError::refused(
                    ErrorCode::BadRequest,
                    format!(
                        "skip_history: channel {channel:?} keeps history, and Herald keeps every \
                         publication of such a channel (publish it to a namespace without \
                         history instead)"
                    ),
                ));
            }
        }
    }
    Ok(if broadcast {
        Command::Broadcast {
            channels,
            data,
            idempotency_key,
        }
    } else {
        Command::Publish {
            channel: channels.into_iter().next().expect("one channel"),
            data,
            idempotency_key,
        }
    })
}

/// `data`, or `b64data` decoded to JSON text; exactly one of them.
fn data(f: &mut Fields) -> Result<Bytes, PublishError> {
    let raw = f.take_raw("data");
    let b64 = f.take::<String>("b64data")?.filter(|s| !s.is_empty());
    // `"data": null` is data (as on Herald's API), unless `b64data` gives the data.
    let raw = raw.filter(|r| b64.is_none() || r.get() != "null");
    let text = match (raw, b64) {
        (Some(_), Some(_)) => return Err(bad("give \"data\" or \"b64data\", not both")),
        (None, None) => {
            return Err(bad(
                "bad JSON body: missing field \"data\" (or \"b64data\")",
            ))
        }
        (Some(raw), None) => raw.get().as_bytes().to_vec(),
        (None, Some(b64)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| bad(format!("b64data is not base64: {e}")))?;
            // Herald publications are JSON: the decoded bytes must be one JSON value.
            let value: Box<RawValue> = serde_json::from_slice(&bytes).map_err(|_| {
                bad("b64data must decode to JSON text: Herald publications are JSON, not binary")
            })?;
            value.get().trim().as_bytes().to_vec()
        }
    };
    check_data_depth(std::str::from_utf8(&text).unwrap_or_default())?;
    Ok(Bytes::from(text))
}

fn bad(message: impl Into<String>) -> PublishError {
    PublishError::refused(ErrorCode::BadRequest, message)
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
            } => (
                std::slice::from_ref(channel),
                String::from_utf8(data.to_vec()).unwrap(),
                idempotency_key.clone(),
            ),
            Command::Broadcast {
                channels,
                data,
                idempotency_key,
            } => (
                channels,
                String::from_utf8(data.to_vec()).unwrap(),
                idempotency_key.clone(),
            ),
        }
    }

    #[test]
    fn herald_and_centrifugo_bodies_decode() {
        let ns = namespaces();
        let c = decode(
            "publish",
            br#"{"channel":"a","data":{"x":12345678901234567890123},"idempotency_key":"k"}"#,
            &ns,
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
        let c = decode(
            "broadcast",
            br#"{"channels":["a","b"],"b64data":"eyJ4IjoxfQ==","tags":{},"delta":true,"version":0,"idempotency_key":""}"#,
            &ns,
        )
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
            br#"{"channel":"live:x","data":1,"skip_history":true}"#,
            &ns
        )
        .is_ok());
    }

    #[test]
    fn what_herald_cannot_honour_is_refused_by_name() {
        let ns = namespaces();
        let err = |m: &str, b: &str| decode(m, b.as_bytes(), &ns).unwrap_err();
        let e = err("publish", r#"{"channel":"a","data":1,"tags":{"k":"v"}}"#);
        assert_eq!(e.error_code(), ErrorCode::BadRequest);
        assert!(e.message().contains("\"tags\" is not supported"), "{e}");
        let e = err("publish", r#"{"channel":"a","data":1,"skip_history":true}"#);
        assert!(e.message().contains("skip_history"), "{e}");
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
