//! The SSE event id: every channel's position in one string, so that the `Last-Event-ID` a
//! browser sends when `EventSource` reconnects resumes all of them.
//!
//! Format: one `epoch:offset` per channel, in the order the request named the channels, joined
//! by `,` (`3fa9c2d1e0b7a6f4:17,9c1e0b7a6f43fa9c:0`). A channel with no position yet is `:`
//! (nothing to recover from). Epochs are `[A-Za-z0-9_-]`, offsets decimal.

use herald_protocol::StreamPosition;

/// Longest `Last-Event-ID` accepted.
pub const MAX_LEN: usize = 8 * 1024;

/// Encode positions (in channel order).
pub fn encode(positions: &[Option<StreamPosition>]) -> String {
    let mut id = String::with_capacity(positions.len() * 24);
    for (i, p) in positions.iter().enumerate() {
        if i > 0 {
            id.push(',');
        }
        match p {
            Some(p) => {
                id.push_str(&p.epoch);
                id.push(':');
                id.push_str(&p.offset.to_string());
            }
            None => id.push(':'),
        }
    }
    id
}

/// Decode an id for `channels` channels. Errors say what is wrong, never echo the input.
pub fn decode(id: &str, channels: usize) -> Result<Vec<Option<StreamPosition>>, &'static str> {
    if id.len() > MAX_LEN {
        return Err("Last-Event-ID is too long");
    }
    let parts: Vec<&str> = id.split(',').collect();
    if parts.len() != channels {
        return Err("Last-Event-ID names a different number of channels than the request");
    }
    parts
        .into_iter()
        .map(|part| {
            let (epoch, offset) = part
                .split_once(':')
                .ok_or("Last-Event-ID: each position is epoch:offset")?;
            if epoch.is_empty() && offset.is_empty() {
                return Ok(None);
            }
            let epoch_ok = !epoch.is_empty()
                && epoch.len() <= 64
                && epoch
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !epoch_ok {
                return Err("Last-Event-ID: bad epoch");
            }
            let offset = offset
                .parse::<u64>()
                .map_err(|_| "Last-Event-ID: bad offset")?;
            Ok(Some(StreamPosition {
                epoch: epoch.to_owned(),
                offset,
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(epoch: &str, offset: u64) -> Option<StreamPosition> {
        Some(StreamPosition {
            epoch: epoch.into(),
            offset,
        })
    }

    #[test]
    fn round_trip() {
        let positions = vec![pos("3fa9c2d1e0b7a6f4", 17), None, pos("e-2_x", 0)];
        let id = encode(&positions);
        assert_eq!(id, "3fa9c2d1e0b7a6f4:17,:,e-2_x:0");
        assert_eq!(decode(&id, 3).unwrap(), positions);
    }

    #[test]
    fn bad_ids_are_refused() {
        for (id, n) in [
            ("a:1", 2),
            ("a1", 1),
            ("a:x", 1),
            ("a:-1", 1),
            (":5", 1),
            ("a b:1", 1),
            ("a:1\n", 1),
        ] {
            assert!(decode(id, n).is_err(), "{id:?}");
        }
        assert!(decode(&"a".repeat(MAX_LEN + 1), 1).is_err());
    }

    // Fuzz harness (`scripts/fuzz.sh` runs it longer): any header value a browser or an attacker
    // sends is decoded or refused, never a panic; every id the node writes reads back the same.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        fn position() -> impl Strategy<Value = Option<StreamPosition>> {
            proptest::option::of(
                ("[0-9a-zA-Z_-]{1,20}", any::<u64>())
                    .prop_map(|(epoch, offset)| StreamPosition { epoch, offset }),
            )
        }

        proptest! {
            #[test]
            fn any_last_event_id_is_decoded_or_refused(id in any::<String>(), n in 0usize..10) {
                if let Ok(positions) = decode(&id, n) {
                    prop_assert_eq!(positions.len(), n);
                }
            }

            #[test]
            fn id_shaped_text_is_decoded_or_refused(id in "[0-9a-f:,x -]{0,80}", n in 0usize..6) {
                let _ = decode(&id, n);
            }

            #[test]
            fn written_ids_read_back(positions in proptest::collection::vec(position(), 1..8)) {
                let id = encode(&positions);
                if id.len() <= MAX_LEN {
                    prop_assert_eq!(decode(&id, positions.len()).unwrap(), positions);
                }
            }
        }
    }
}
