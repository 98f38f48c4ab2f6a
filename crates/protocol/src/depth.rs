//! How deeply a JSON payload nests, checked before it is stored.
//!
//! Publication `data` is kept as raw JSON and forwarded as it is, so a payload nested deeper than
//! a JSON parser's recursion limit would be stored and then break every reader that parses it
//! (serde_json stops at 128 levels). Payloads deeper than [`MAX_DATA_DEPTH`] are refused on the
//! way in.

/// The deepest nesting of arrays and objects accepted in publication data.
pub const MAX_DATA_DEPTH: usize = 64;

/// The nesting depth of valid JSON text: `1` for `[]` or `{}`, `0` for a scalar.
pub fn json_depth(json: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut in_string = false;
    let mut escaped = false;
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_nesting_outside_strings() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#""[[[""#), 0);
        assert_eq!(json_depth(r#"{"a":[1,{"b":"]\"["}]}"#), 3);
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(json_depth(&deep), 200);
    }
}
