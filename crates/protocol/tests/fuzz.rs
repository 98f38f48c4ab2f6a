//! Fuzz harness for the client protocol parser (property-based, on the stable toolchain): any
//! text a client can send, and valid commands with random edits, must parse or be refused with
//! a one-line reason, never panic. `scripts/fuzz.sh` runs
//! it for longer (`PROPTEST_CASES`).

use herald_protocol::command::parse_frame;
use proptest::prelude::*;
use proptest::sample::{select, Index};

/// Valid messages of every kind: the seeds random edits start from.
const SEEDS: &[&str] = &[
    r#"{"id":1,"connect":{"token":"a.b.c","name":"n","subs":{"a":{"since":{"epoch":"e","offset":3}},"b":{"token":"t"}}}}"#,
    r#"{"id":2,"subscribe":{"channel":"news","since":{"epoch":"3fa9","offset":18446744073709551615}}}"#,
    r#"{"id":3,"publish":{"channel":"chat:room","data":{"a":[1,2.5,"x",null,true]},"idempotency_key":"k"}}"#,
    r#"{"id":4,"unsubscribe":{"channel":"c"}}"#,
    r#"{"id":5,"history":{"channel":"c","limit":10,"since":{"epoch":"e","offset":1}}}"#,
    r#"{"id":6,"presence":{"channel":"c"}}"#,
    r#"{"id":7,"refresh":{"token":"t"}}"#,
    r#"{"id":8,"sub_refresh":{"channel":"c","token":"t"}}"#,
    "{}",
    "{\"id\":9,\"publish\":{\"channel\":\"c\",\"data\":\"\\u00e9\\n\"}}\n{}",
];

/// A seed with up to 8 byte insertions, deletions or replacements.
fn mutated() -> impl Strategy<Value = String> {
    let edit = (any::<Index>(), any::<u8>(), 0..3u8);
    (select(SEEDS), prop::collection::vec(edit, 0..8)).prop_map(|(seed, edits)| {
        let mut b = seed.as_bytes().to_vec();
        for (at, byte, op) in edits {
            let i = at.index(b.len() + 1);
            match op {
                0 => b.insert(i, byte),
                1 if i < b.len() => {
                    b.remove(i);
                }
                _ if i < b.len() => b[i] = byte,
                _ => {}
            }
        }
        String::from_utf8_lossy(&b).into_owned()
    })
}

/// Refusals are one short line: a fixed sentence, at most quoting a name from the input.
fn check(text: &str) {
    for parsed in parse_frame(text) {
        if let Err(malformed) = parsed {
            let m = malformed.0.as_str();
            assert!(!m.is_empty() && m.len() <= 200 + text.len(), "{m}");
            assert!(!m.contains('\n'), "{m:?}");
        }
    }
}

proptest! {
    #[test]
    fn any_text_is_parsed_or_refused(text in any::<String>()) {
        check(&text);
    }

    #[test]
    fn edited_commands_are_parsed_or_refused(text in mutated()) {
        check(&text);
    }

    #[test]
    fn deep_nesting_is_refused_without_overflowing_the_stack(depth in 0usize..5000, open in select(&["[", "{\"a\":"][..])) {
        let close = if open == "[" { "]" } else { "}" };
        let data = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        check(&format!(r#"{{"id":1,"publish":{{"channel":"c","data":{data}}}}}"#));
    }

    #[test]
    fn many_messages_in_one_frame(n in 0usize..300, sep in select(&["\n", "\n\n", "\r\n"][..])) {
        let frame = vec![r#"{"id":1,"presence":{"channel":"c"}}"#; n].join(sep);
        check(&frame);
    }
}
