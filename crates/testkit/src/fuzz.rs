//! Fuzzing helpers for proptest harnesses that drive the real binary.

use proptest::prelude::*;
use proptest::sample::{select, Index};

/// One of `seeds` with up to five random byte edits (each an insert or an overwrite).
pub fn edited_seed(seeds: &'static [&'static str]) -> impl Strategy<Value = String> {
    let edit = (any::<Index>(), any::<u8>(), any::<bool>());
    (select(seeds), prop::collection::vec(edit, 0..6)).prop_map(|(seed, edits)| {
        let mut b = seed.as_bytes().to_vec();
        for (at, byte, insert) in edits {
            let i = at.index(b.len() + 1);
            if insert {
                b.insert(i, byte);
            } else if i < b.len() {
                b[i] = byte;
            }
        }
        String::from_utf8_lossy(&b).into_owned()
    })
}
