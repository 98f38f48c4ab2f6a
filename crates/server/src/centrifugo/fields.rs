//! A Centrifugo request body, field by field: what Herald reads is taken out, and whatever is
//! left must be a field Centrifugo knows left at its zero value (`""`, `0`, `false`, `{}`, `[]`,
//! `null`): such a field means "not used", as in Centrifugo's own decoder. A field Herald cannot
//! honour that is set is refused with error 107 naming it, and a field Centrifugo does not know
//! either is refused as unknown. Nothing is dropped silently.

use herald_protocol::command::json_error_reason;
use herald_protocol::ErrorCode;
use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::publishing::PublishError;

/// A request body's fields, each as the JSON text the body had (so publication data reaches
/// subscribers as it was sent, numbers and all).
pub struct Fields {
    method: &'static str,
    map: BTreeMap<String, Box<RawValue>>,
}

impl Fields {
    /// The fields of `body` for `method`; a body that is not a JSON object is error 107.
    pub fn parse(method: &'static str, body: &[u8]) -> Result<Fields, PublishError> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_some_and(|b| *b != b'{') {
            return Err(bad(format!("bad JSON body: {method} takes a JSON object")));
        }
        let map = serde_json::from_slice(body)
            .map_err(|e| bad(format!("bad JSON body: {}", json_error_reason(&e))))?;
        Ok(Fields { method, map })
    }

    /// A field Herald reads, absent or `null` as `None`.
    pub fn take<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<T>, PublishError> {
        match self.map.remove(name) {
            None => Ok(None),
            Some(v) if v.get() == "null" => Ok(None),
            Some(v) => serde_json::from_str(v.get())
                .map(Some)
                .map_err(|e| bad(format!("bad JSON body: field {name:?}: {e}"))),
        }
    }

    /// A field Herald reads, as its JSON text (`None` when absent; `null` is kept).
    pub fn take_raw(&mut self, name: &str) -> Option<Box<RawValue>> {
        self.map.remove(name)
    }

    /// A field that must be present and not empty.
    pub fn required<T: DeserializeOwned>(&mut self, name: &str) -> Result<T, PublishError> {
        let value: Option<Value> = self.take(name)?;
        match value {
            Some(v) if !is_zero(&v) => serde_json::from_value(v)
                .map_err(|e| bad(format!("bad JSON body: field {name:?}: {e}"))),
            _ => Err(bad(format!("bad JSON body: missing field {name:?}"))),
        }
    }

    /// A string field, `""` when absent.
    pub fn string(&mut self, name: &str) -> Result<String, PublishError> {
        Ok(self.take::<String>(name)?.unwrap_or_default())
    }

    /// What is left must be fields of `known` (Centrifugo's fields that Herald does not
    /// implement) at their zero value.
    pub fn finish(self, known: &[&str]) -> Result<(), PublishError> {
        let method = self.method;
        for (name, value) in self.map {
            if !known.contains(&name.as_str()) {
                return Err(bad(format!("bad JSON body: unknown field {name:?}")));
            }
            let value: Value = serde_json::from_str(value.get()).unwrap_or(Value::Bool(true));
            if !is_zero(&value) {
                return Err(bad(format!(
                    "{method}: field {name:?} is not supported by Herald \
                     (docs/migrating-from-centrifugo.md)"
                )));
            }
        }
        Ok(())
    }
}

/// Whether `v` is the zero value of its type, as Centrifugo's decoder leaves an absent field.
pub fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn bad(message: String) -> PublishError {
    PublishError::refused(ErrorCode::BadRequest, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_valued_known_fields_pass_and_others_are_named() {
        let mut f = Fields::parse("x", br#"{"a":"v","b":"","c":0,"d":{}}"#).unwrap();
        assert_eq!(f.string("a").unwrap(), "v");
        assert!(f.finish(&["b", "c", "d"]).is_ok());
        let f = Fields::parse("x", br#"{"b":"set"}"#).unwrap();
        let e = f.finish(&["b"]).unwrap_err();
        assert!(e.message().contains("\"b\" is not supported"), "{e}");
        let f = Fields::parse("x", br#"{"zz":1}"#).unwrap();
        let e = f.finish(&["b"]).unwrap_err();
        assert!(e.message().contains("unknown field \"zz\""), "{e}");
        let mut f = Fields::parse("x", br#"{"a":""}"#).unwrap();
        assert!(f.required::<String>("a").is_err());
        assert!(Fields::parse("x", b"[1]").is_err());
        assert!(Fields::parse("x", b"{").is_err());
    }
}
