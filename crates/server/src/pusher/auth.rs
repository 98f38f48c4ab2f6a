//! Pusher signatures: channel authorizations (`key:hex(HMAC-SHA256(secret, socket_id:channel[:channel_data]))`)
//! and signed HTTP API requests.

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Signed requests older or newer than this are refused.
pub const MAX_CLOCK_SKEW_S: u64 = 600;

/// `hex(HMAC-SHA256(secret, message))`.
pub fn sign(secret: &str, message: &str) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(message.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `signature` (hex) is the HMAC of `message`; compared in constant time.
pub fn verify(secret: &str, message: &str, signature: &str) -> bool {
    let Ok(given) = hex::decode(signature) else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(message.as_bytes());
    mac.verify_slice(&given).is_ok()
}

/// Whether a subscription's `auth` (`key:signature`) authorizes `socket_id` on `channel`.
pub fn channel_authorized(
    key: &str,
    secret: &str,
    socket_id: &str,
    channel: &str,
    channel_data: Option<&str>,
    auth: &str,
) -> bool {
    let Some((given_key, signature)) = auth.split_once(':') else {
        return false;
    };
    if given_key != key {
        return false;
    }
    let message = match channel_data {
        Some(data) => format!("{socket_id}:{channel}:{data}"),
        None => format!("{socket_id}:{channel}"),
    };
    verify(secret, &message, signature)
}

/// Whether a `pusher:signin`'s `auth` (`key:signature`) signs `socket_id::user::user_data`.
pub fn user_authenticated(
    key: &str,
    secret: &str,
    socket_id: &str,
    user_data: &str,
    auth: &str,
) -> bool {
    let Some((given_key, signature)) = auth.split_once(':') else {
        return false;
    };
    given_key == key
        && verify(
            secret,
            &format!("{socket_id}::user::{user_data}"),
            signature,
        )
}

/// `hex(MD5(body))`, the `body_md5` of a signed request.
pub fn md5_hex(body: &[u8]) -> String {
    hex::encode(Md5::digest(body))
}

/// Why a signed request is refused (answered 401).
#[derive(Debug, PartialEq, Eq)]
pub struct Unauthorized(pub String);

/// Check a signed HTTP API request: `auth_key`, `auth_timestamp` within
/// [`MAX_CLOCK_SKEW_S`] of `now`, `auth_version=1.0`, `body_md5` for a body, and
/// `auth_signature` over `METHOD\nPATH\nk=v&…` (every other parameter, keys lowercased and
/// sorted, values decoded).
pub fn check_request(
    key: &str,
    secret: &str,
    method: &str,
    path: &str,
    query: &[(String, String)],
    body: &[u8],
    now: u64,
) -> Result<(), Unauthorized> {
    let get = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let fail = |why: &str| Err(Unauthorized(why.to_owned()));
    match get("auth_key") {
        Some(k) if k == key => {}
        Some(_) => return fail("Unknown auth_key"),
        None => return fail("Missing auth_key"),
    }
    let Some(timestamp) = get("auth_timestamp").and_then(|t| t.parse::<u64>().ok()) else {
        return fail("Missing or invalid auth_timestamp");
    };
    if timestamp.abs_diff(now) > MAX_CLOCK_SKEW_S {
        return fail("Timestamp expired: given timestamp is not within 600s of server time");
    }
    if get("auth_version") != Some("1.0") {
        return fail("auth_version must be 1.0");
    }
    if !body.is_empty() {
        match get("body_md5") {
            Some(m) if m.eq_ignore_ascii_case(&md5_hex(body)) => {}
            Some(_) => return fail("body_md5 does not match the body"),
            None => return fail("Missing body_md5"),
        }
    }
    let Some(signature) = get("auth_signature") else {
        return fail("Missing auth_signature");
    };
    let mut params: Vec<(String, &str)> = query
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("auth_signature"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    params.sort();
    let canonical = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let message = format!("{method}\n{path}\n{canonical}");
    if verify(secret, &message, signature) {
        Ok(())
    } else {
        fail("Invalid signature: you should have sent HmacSHA256Hex(\"METHOD\\nPATH\\nQUERY\", secret)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example from Pusher's authentication reference.
    const KEY: &str = "278d425bdf160c739803";
    const SECRET: &str = "7ad3773142a6692b25b8";

    #[test]
    fn private_channel_signature_matches_the_reference() {
        let sig = sign(SECRET, "1234.1234:private-foobar");
        assert_eq!(
            sig,
            "58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
        );
        let auth = format!("{KEY}:{sig}");
        assert!(channel_authorized(
            KEY,
            SECRET,
            "1234.1234",
            "private-foobar",
            None,
            &auth
        ));
        assert!(!channel_authorized(
            KEY,
            SECRET,
            "1234.1235",
            "private-foobar",
            None,
            &auth
        ));
        assert!(!channel_authorized(
            "other",
            SECRET,
            "1234.1234",
            "private-foobar",
            None,
            &auth
        ));
        assert!(!channel_authorized(
            KEY,
            SECRET,
            "1234.1234",
            "private-foobar",
            None,
            "garbage"
        ));
    }

    fn signed(query: &mut Vec<(String, String)>, method: &str, path: &str) {
        let mut sorted = query.clone();
        sorted.sort();
        let canonical = sorted
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let sig = sign(SECRET, &format!("{method}\n{path}\n{canonical}"));
        query.push(("auth_signature".into(), sig));
    }

    #[test]
    fn signed_requests() {
        let body = br#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
        let mut q: Vec<(String, String)> = vec![
            ("auth_key".into(), KEY.into()),
            ("auth_timestamp".into(), "1353088179".into()),
            ("auth_version".into(), "1.0".into()),
            ("body_md5".into(), md5_hex(body)),
        ];
        signed(&mut q, "POST", "/apps/3/events");
        let check = |q: &[(String, String)], body: &[u8], now| {
            check_request(KEY, SECRET, "POST", "/apps/3/events", q, body, now)
        };
        assert_eq!(check(&q, body, 1353088179 + 10), Ok(()));
        assert!(check(&q, body, 1353088179 + 601).is_err(), "stale");
        assert!(check(&q, b"{}", 1353088179).is_err(), "other body");
        let mut forged = q.clone();
        forged.last_mut().unwrap().1 = sign("wrong", "x");
        assert!(check(&forged, body, 1353088179).is_err());
    }
}
