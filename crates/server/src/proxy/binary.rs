//! `binary_encoding` (Centrifugo's): the client's data travels to the backend as `b64data`, the
//! standard base64 of its bytes, and the backend may give the data of its answer the same way.
//! Done here, on the bodies as they cross the wire, so that the hooks' logic in
//! `herald_core::proxy` reads and writes `data` only.
//!
//! Herald's data is JSON (its publications, replies and subscription data are JSON values): an
//! answer's `b64data` must decode to one JSON value, else the answer is refused.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use herald_core::proxy::ProxyError;
use serde_json::value::RawValue;

/// A JSON object with its values as they were written.
type Fields = BTreeMap<String, Box<RawValue>>;

/// A hook request with its `data` as `b64data`.
pub fn encode_request(body: Vec<u8>) -> Vec<u8> {
    let Ok(mut fields) = serde_json::from_slice::<Fields>(&body) else {
        return body; // not an object: nothing of ours to encode
    };
    let Some(data) = fields.remove("data") else {
        return body;
    };
    let encoded = serde_json::to_string(&STANDARD.encode(data.get())).expect("a string");
    fields.insert(
        "b64data".into(),
        RawValue::from_string(encoded).expect("a JSON string"),
    );
    serde_json::to_vec(&fields).expect("fields serialize")
}

/// A backend's answer with `result.b64data` (and `result.subs.*.b64data`, the connect hook's
/// subscriptions) as `data`. An answer that is not an object with an object `result` is left as
/// it is: reading it is the hooks' job, and they refuse what they cannot read.
pub fn decode_answer(answer: Vec<u8>) -> Result<Vec<u8>, ProxyError> {
    let Ok(mut envelope) = serde_json::from_slice::<Fields>(&answer) else {
        return Ok(answer);
    };
    let Some(Ok(mut result)) = envelope
        .get("result")
        .map(|r| serde_json::from_str::<Fields>(r.get()))
    else {
        return Ok(answer);
    };
    let mut changed = decode_data(&mut result, "result")?;
    if let Some(Ok(mut subs)) = result
        .get("subs")
        .map(|s| serde_json::from_str::<BTreeMap<String, Fields>>(s.get()))
    {
        let mut subs_changed = false;
        for (channel, options) in &mut subs {
            subs_changed |= decode_data(options, &format!("result.subs.{channel}"))?;
        }
        if subs_changed {
            result.insert("subs".into(), to_raw(&subs));
            changed = true;
        }
    }
    if !changed {
        return Ok(answer);
    }
    envelope.insert("result".into(), to_raw(&result));
    Ok(serde_json::to_vec(&envelope).expect("fields serialize"))
}

fn to_raw(value: &impl serde::Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("fields serialize")
}

/// Replace `b64data` in `fields` (the object at `at`) with `data`; whether there was one. An
/// empty `b64data` is none (as Centrifugo reads it).
fn decode_data(fields: &mut Fields, at: &str) -> Result<bool, ProxyError> {
    let Some(b64) = fields.remove("b64data") else {
        return Ok(false);
    };
    let bad = |why: String| ProxyError::BadAnswer(format!("{at}.b64data {why}"));
    let text: String =
        serde_json::from_str(b64.get()).map_err(|_| bad("is not a string".into()))?;
    if text.is_empty() {
        return Ok(false);
    }
    if fields.contains_key("data") {
        return Err(ProxyError::BadAnswer(format!(
            "{at} has both data and b64data"
        )));
    }
    let bytes = STANDARD
        .decode(text.as_bytes())
        .map_err(|e| bad(format!("is not base64: {e}")))?;
    let data: Box<RawValue> = serde_json::from_slice(&bytes)
        .map_err(|_| bad("is not one JSON value once decoded (Herald's data is JSON)".into()))?;
    fields.insert("data".into(), data);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    #[test]
    fn requests_carry_b64data_of_the_exact_bytes() {
        let body = br#"{"client":"c","data":{"a": 1.50},"user":"u"}"#.to_vec();
        let out: serde_json::Value = serde_json::from_slice(&encode_request(body)).unwrap();
        assert_eq!(out["b64data"], b64(r#"{"a": 1.50}"#));
        assert!(out.get("data").is_none());
        assert_eq!(out["user"], "u");
        let without = br#"{"client":"c"}"#.to_vec();
        assert_eq!(encode_request(without.clone()), without);
    }

    #[test]
    fn answers_give_b64data_as_data() {
        let answer = format!(
            r#"{{"result":{{"b64data":"{}","subs":{{"a":{{"b64data":"{}"}},"b":{{}}}}}}}}"#,
            b64(r#"{"x":1}"#),
            b64("[2]")
        );
        let out: serde_json::Value =
            serde_json::from_slice(&decode_answer(answer.into_bytes()).unwrap()).unwrap();
        assert_eq!(out["result"]["data"], serde_json::json!({"x": 1}));
        assert_eq!(out["result"]["subs"]["a"]["data"], serde_json::json!([2]));
        assert!(out["result"].get("b64data").is_none());
        let plain = br#"{"result":{"data":{"x":1}}}"#.to_vec();
        assert_eq!(decode_answer(plain.clone()).unwrap(), plain);
        let error = br#"{"error":{"code":1403}}"#.to_vec();
        assert_eq!(decode_answer(error.clone()).unwrap(), error);
        let empty = br#"{"result":{"b64data":"","data":1}}"#;
        let out: serde_json::Value =
            serde_json::from_slice(&decode_answer(empty.to_vec()).unwrap()).unwrap();
        assert_eq!(out["result"]["data"], 1);
    }

    #[test]
    fn unusable_b64data_is_a_bad_answer() {
        let cases = [
            (
                format!(r#"{{"result":{{"data":1,"b64data":"{}"}}}}"#, b64("2")),
                "result has both data and b64data",
            ),
            (
                r#"{"result":{"b64data":"%%%"}}"#.to_owned(),
                "result.b64data is not base64",
            ),
            (
                format!(r#"{{"result":{{"b64data":"{}"}}}}"#, b64("not json")),
                "not one JSON value",
            ),
            (
                r#"{"result":{"b64data":7}}"#.to_owned(),
                "result.b64data is not a string",
            ),
            (
                format!(
                    r#"{{"result":{{"subs":{{"c":{{"data":1,"b64data":"{}"}}}}}}}}"#,
                    b64("1")
                ),
                "result.subs.c has both",
            ),
        ];
        for (answer, why) in cases {
            let Err(ProxyError::BadAnswer(e)) = decode_answer(answer.clone().into_bytes()) else {
                panic!("{answer} was accepted");
            };
            assert!(e.contains(why), "{answer}: {e}");
        }
    }
}
