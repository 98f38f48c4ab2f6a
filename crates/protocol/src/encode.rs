//! Encoding replies and pushes. Every push is encoded once into [`Bytes`] and shared by all the
//! connections that receive it.

use bytes::Bytes;
use serde::Serialize;

use crate::codes::{CloseCode, ErrorCode};
use crate::types::{ClientInfo, Publication, PublicationWire, PublisherWire};

/// The ping the server sends, and the pong a client answers with.
pub const PING: &[u8] = b"{}";

/// `{"id": N, "<method>": <result>}`.
pub fn reply(id: u64, method: &str, result: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(id.to_string().as_bytes());
    out.extend_from_slice(b",\"");
    out.extend_from_slice(method.as_bytes());
    out.extend_from_slice(b"\":");
    serde_json::to_writer(&mut out, result).expect("reply serializes");
    out.push(b'}');
    Bytes::from(out)
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: u16,
    message: &'a str,
}

/// `{"id": N, "error": {"code": C, "message": "..."}}`.
pub fn reply_error(id: u64, code: ErrorCode, message: &str) -> Bytes {
    reply_error_code(id, code.as_u16(), message)
}

/// An error reply with a code that is not one of the protocol's own: an application's code
/// relayed from a proxy hook.
pub fn reply_error_code(id: u64, code: u16, message: &str) -> Bytes {
    #[derive(Serialize)]
    struct Reply<'a> {
        id: u64,
        error: ErrorBody<'a>,
    }
    let body = Reply {
        id,
        error: ErrorBody { code, message },
    };
    Bytes::from(serde_json::to_vec(&body).expect("error serializes"))
}

/// `{"pub": {"channel": "c", "offset": 7, "data": ..., "info"?: ...}}`.
pub fn push_publication(channel: &str, publication: &Publication) -> Bytes {
    #[derive(Serialize)]
    struct Pub<'a> {
        channel: &'a str,
        #[serde(flatten)]
        publication: PublicationWire<'a>,
    }
    #[derive(Serialize)]
    struct Push<'a> {
        #[serde(rename = "pub")]
        publication: Pub<'a>,
    }
    let push = Push {
        publication: Pub {
            channel,
            publication: publication.into(),
        },
    };
    Bytes::from(serde_json::to_vec(&push).expect("publication serializes"))
}

/// A publication for a subscription with delta compression, its data carried as a JSON string:
/// `{"pub": {"channel": "c", "offset": 7, "data": "<text>", "delta": false|true, "info"?: ...}}`.
/// With `delta: false`, `text` is the publication's JSON text itself (the client keeps it as the
/// base of the next delta); with `delta: true`, it is a Fossil delta that turns the previous
/// publication's text into this one's. A string, not embedded JSON, because a delta is computed
/// on exact bytes, which a client's JSON parser would not give back.
pub fn push_publication_text(
    channel: &str,
    publication: &Publication,
    text: &str,
    delta: bool,
) -> Bytes {
    #[derive(Serialize)]
    struct Pub<'a> {
        channel: &'a str,
        offset: u64,
        data: &'a str,
        delta: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        info: Option<PublisherWire<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tags: Option<&'a crate::tags::Tags>,
    }
    #[derive(Serialize)]
    struct Push<'a> {
        #[serde(rename = "pub")]
        publication: Pub<'a>,
    }
    let push = Push {
        publication: Pub {
            channel,
            offset: publication.offset,
            data: text,
            delta,
            info: publication.info.as_ref().map(PublisherWire::from),
            tags: (!publication.tags.is_empty()).then_some(&publication.tags),
        },
    };
    Bytes::from(serde_json::to_vec(&push).expect("publication serializes"))
}

/// `{"skip": {"channel": "c", "from": 5, "to": 8}}`: publications `from..=to` of the channel were
/// left out for this connection by its namespace's backpressure policy (it read too slowly); the
/// client takes `to` as its position and goes on without recovering them.
pub fn push_skip(channel: &str, from: u64, to: u64) -> Bytes {
    #[derive(Serialize)]
    struct Skip<'a> {
        channel: &'a str,
        from: u64,
        to: u64,
    }
    #[derive(Serialize)]
    struct Push<'a> {
        skip: Skip<'a>,
    }
    let push = Push {
        skip: Skip { channel, from, to },
    };
    Bytes::from(serde_json::to_vec(&push).expect("skip serializes"))
}

/// `{"join": {...}}` or `{"leave": {...}}` for a presence change.
pub fn push_presence_change(joined: bool, channel: &str, who: &ClientInfo) -> Bytes {
    #[derive(Serialize)]
    struct Change<'a> {
        channel: &'a str,
        info: PublisherWire<'a>,
    }
    let change = Change {
        channel,
        info: PublisherWire::from(who),
    };
    let key = if joined { "join" } else { "leave" };
    keyed(key, &change)
}

/// `{"presence_batch": {"channel": "c", "changes": [{"join": info}, {"leave": info}, ...]}}`:
/// several presence changes of one channel, in the order they happened.
pub fn push_presence_batch<'a>(
    channel: &str,
    changes: impl IntoIterator<Item = (bool, &'a ClientInfo)>,
) -> Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Change<'a> {
        Join(PublisherWire<'a>),
        Leave(PublisherWire<'a>),
    }
    #[derive(Serialize)]
    struct Batch<'a> {
        channel: &'a str,
        changes: Vec<Change<'a>>,
    }
    let changes = changes
        .into_iter()
        .map(|(joined, who)| match joined {
            true => Change::Join(PublisherWire::from(who)),
            false => Change::Leave(PublisherWire::from(who)),
        })
        .collect();
    keyed("presence_batch", &Batch { channel, changes })
}

/// `{"presence_count": {"channel": "c", "num_clients": N, "num_users": U}}`: a channel's presence
/// counts, pushed once per batch in a namespace with `join_leave_counts`.
pub fn push_presence_count(channel: &str, num_clients: u64, num_users: u64) -> Bytes {
    #[derive(Serialize)]
    struct Count<'a> {
        channel: &'a str,
        num_clients: u64,
        num_users: u64,
    }
    keyed(
        "presence_count",
        &Count {
            channel,
            num_clients,
            num_users,
        },
    )
}

/// `{"unsub": {"channel": "c", "code": C, "reason": "..."}}`.
pub fn push_unsub(channel: &str, code: u16, reason: &str) -> Bytes {
    #[derive(Serialize)]
    struct Unsub<'a> {
        channel: &'a str,
        code: u16,
        reason: &'a str,
    }
    keyed(
        "unsub",
        &Unsub {
            channel,
            code,
            reason,
        },
    )
}

/// `{"subscribe": {"channel": "c", ...subscribe result}}`: the server subscribed the connection
/// (API `subscribe`). An addition to the v1 tables, documented in docs/protocol.md.
pub fn push_subscribed(channel: &str, result: &impl Serialize) -> Bytes {
    #[derive(Serialize)]
    struct Sub<'a, R: Serialize> {
        channel: &'a str,
        #[serde(flatten)]
        result: &'a R,
    }
    keyed("subscribe", &Sub { channel, result })
}

/// `{"disconnect": {"code": C, "reason": "...", "reconnect": bool, "after_ms"?: n}}`.
pub fn push_disconnect(code: CloseCode, reason: &str, after_ms: Option<u64>) -> Bytes {
    #[derive(Serialize)]
    struct Disconnect<'a> {
        code: u16,
        reason: &'a str,
        reconnect: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        after_ms: Option<u64>,
    }
    keyed(
        "disconnect",
        &Disconnect {
            code: code.0,
            reason,
            reconnect: code.reconnect(),
            after_ms,
        },
    )
}

fn keyed(key: &str, value: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"{\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    serde_json::to_writer(&mut out, value).expect("push serializes");
    out.push(b'}');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publication_push_has_exact_bytes() {
        let p = Publication {
            offset: 7,
            data: Bytes::from_static(br#"{"x": 1}"#),
            info: None,
            tags: Default::default(),
        };
        assert_eq!(
            &push_publication("news", &p)[..],
            br#"{"pub":{"channel":"news","offset":7,"data":{"x": 1}}}"#
        );
    }

    #[test]
    fn publisher_info_carries_the_token_info_claim() {
        let who = ClientInfo {
            user: "alice".into(),
            client: "c1".into(),
            info: Some(
                serde_json::value::RawValue::from_string(r#"{"name":"Alice"}"#.into()).unwrap(),
            ),
        };
        let p = Publication {
            offset: 1,
            data: Bytes::from_static(b"1"),
            info: Some(who.clone()),
            tags: Default::default(),
        };
        assert_eq!(
            &push_publication("c", &p)[..],
            br#"{"pub":{"channel":"c","offset":1,"data":1,"info":{"user":"alice","client":"c1","info":{"name":"Alice"}}}}"#
        );
        assert_eq!(
            &push_presence_change(true, "c", &who)[..],
            br#"{"join":{"channel":"c","info":{"user":"alice","client":"c1","info":{"name":"Alice"}}}}"#
        );
    }

    #[test]
    fn presence_batch_keeps_the_order_of_changes() {
        let a = ClientInfo {
            user: "alice".into(),
            client: "c1".into(),
            info: None,
        };
        let b = ClientInfo {
            user: "bob".into(),
            client: "c2".into(),
            info: None,
        };
        assert_eq!(
            &push_presence_batch("c", [(true, &a), (true, &b), (false, &a)])[..],
            br#"{"presence_batch":{"channel":"c","changes":[{"join":{"user":"alice","client":"c1"}},{"join":{"user":"bob","client":"c2"}},{"leave":{"user":"alice","client":"c1"}}]}}"#
        );
    }

    #[test]
    fn reply_and_error_shapes() {
        assert_eq!(
            &reply(4, "unsubscribe", &serde_json::json!({}))[..],
            br#"{"id":4,"unsubscribe":{}}"#
        );
        assert_eq!(
            &reply_error(5, ErrorCode::PermissionDenied, "no")[..],
            br#"{"id":5,"error":{"code":103,"message":"no"}}"#
        );
    }

    #[test]
    fn disconnect_carries_reconnect_rule() {
        let d = push_disconnect(CloseCode::SHUTDOWN, "shutdown", Some(1200));
        assert_eq!(
            &d[..],
            br#"{"disconnect":{"code":4000,"reason":"shutdown","reconnect":true,"after_ms":1200}}"#
        );
    }
}
