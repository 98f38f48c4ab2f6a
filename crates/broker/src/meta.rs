//! A publication's publisher info and tags as one byte string, for brokers that store and send
//! them in one slot beside the data (Redis, NATS).
//!
//! # Format
//! - empty: no info, no tags;
//! - `{…}`: the info's JSON, no tags (what nodes wrote before tags existed);
//! - `t{"k":"v"}\n` then the info's JSON or nothing: tags, then the info if any. Compact JSON
//!   never holds a raw newline, so the first one ends the tags.

use herald_protocol::tags::Tags;
use herald_protocol::ClientInfo;

/// Encode `info` and `tags`; without tags, exactly the info's JSON (or empty).
pub fn encode_meta(info: Option<&ClientInfo>, tags: &Tags) -> Vec<u8> {
    let mut out = Vec::new();
    if !tags.is_empty() {
        out.push(b't');
        serde_json::to_writer(&mut out, tags).expect("tags serialize");
        out.push(b'\n');
    }
    if let Some(info) = info {
        serde_json::to_writer(&mut out, info).expect("ClientInfo serializes");
    }
    out
}

/// Decode what [`encode_meta`] wrote; `None` when it is malformed.
pub fn decode_meta(bytes: &[u8]) -> Option<(Option<ClientInfo>, Tags)> {
    let (tags, info) = match bytes.strip_prefix(b"t") {
        Some(rest) => {
            let end = rest.iter().position(|b| *b == b'\n')?;
            let tags: Tags = serde_json::from_slice(&rest[..end]).ok()?;
            (tags, &rest[end + 1..])
        }
        None => (Tags::new(), bytes),
    };
    let info = match info {
        [] => None,
        json => Some(serde_json::from_slice::<ClientInfo>(json).ok()?),
    };
    Some((info, tags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_and_tags_round_trip_and_untagged_is_the_info_json() {
        let who = ClientInfo {
            user: "u".into(),
            client: "c".into(),
            info: None,
        };
        let tags: Tags = [("k".to_string(), "v\nw".to_string())].into();
        assert_eq!(
            encode_meta(Some(&who), &Tags::new()),
            serde_json::to_vec(&who).unwrap()
        );
        assert!(encode_meta(None, &Tags::new()).is_empty());
        for (info, tags) in [
            (None, Tags::new()),
            (Some(who.clone()), Tags::new()),
            (None, tags.clone()),
            (Some(who.clone()), tags.clone()),
        ] {
            let bytes = encode_meta(info.as_ref(), &tags);
            assert_eq!(decode_meta(&bytes), Some((info, tags)));
        }
        assert_eq!(decode_meta(b"t{\"k\":"), None);
        assert_eq!(decode_meta(b"{nope"), None);
    }
}
