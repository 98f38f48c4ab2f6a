//! The crate's layering, checked: every top-level module belongs to one layer of [`LAYERS`],
//! and a module may use (`crate::x`) modules of its own layer or of a layer below, never one
//! above; within a layer the uses form no cycle. So the node's state knows no protocol, the
//! engine knows no transport, and only the route table and the accept loop know them all.
//!
//! The test reads the sources: every `crate::x` path in code (comments and string literals left
//! out, `use crate::{a, b::c}` groups included, tests included). Modules reach one another
//! through `crate::` (a `super::` out of a top-level module would go unseen). `main.rs` is the
//! binary, above everything, and is not checked.

/// The layers, lowest first: (name, its top-level modules).
pub(crate) const LAYERS: &[(&str, &[&str])] = &[
    // Utilities and services that know no `App`: responses, guards, TLS, settings, brokers,
    // the publish command, what nodes share through the broker, the tracing exporter.
    (
        "foundations",
        &[
            "response",
            "guard",
            "compression",
            "tls",
            "token",
            "brokers",
            "jwks",
            "proxy",
            "settings",
            "reload",
            "publishing",
            "batch",
            "cluster",
            "otel",
            "lifecycle",
        ],
    ),
    // The node's state (`App`): the hub, config, counters, the drain.
    ("state", &["state"]),
    // The connection engine (driver, policies, Herald's protocol and timers) and the WebSocket
    // handshake both WebSocket endpoints share.
    ("engine", &["engine", "handshake"]),
    // Protocols, transports and handlers: each one's endpoints and its own state.
    (
        "protocols",
        &[
            "ws",
            "pusher",
            "uni",
            "emulation",
            "api",
            "admin",
            "consumers",
            "centrifugo",
        ],
    ),
    // The route table and `http::Node`, which holds each protocol's state.
    ("router", &["http"]),
    // The accept loop: assembles the node, serves connections.
    ("node", &["serve"]),
];

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use super::LAYERS;

    /// The source with comments and the contents of string and char literals removed.
    fn code_only(src: &str) -> String {
        let c: Vec<char> = src.chars().collect();
        let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
        let mut out = String::with_capacity(src.len());
        let mut i = 0;
        while i < c.len() {
            let next = c.get(i + 1).copied();
            match c[i] {
                '/' if next == Some('/') => {
                    while i < c.len() && c[i] != '\n' {
                        i += 1;
                    }
                }
                '/' if next == Some('*') => {
                    let mut depth = 0;
                    while i < c.len() {
                        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                            depth += 1;
                            i += 2;
                        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                            depth -= 1;
                            i += 2;
                            if depth == 0 {
                                break;
                            }
                        } else {
                            i += 1;
                        }
                    }
                }
                'r' if (next == Some('"') || next == Some('#'))
                    && (i == 0
                        || !ident(c[i - 1])
                        || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2])))) =>
                {
                    // A raw string: r"…", r#"…"#.
                    let mut j = i + 1;
                    let mut hashes = 0;
                    while c.get(j) == Some(&'#') {
                        hashes += 1;
                        j += 1;
                    }
                    if c.get(j) != Some(&'"') {
                        out.push(c[i]);
                        i += 1;
                        continue;
                    }
                    j += 1;
                    while j < c.len() {
                        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                            j += 1 + hashes;
                            break;
                        }
                        j += 1;
                    }
                    out.push_str("\"\"");
                    i = j;
                }
                '"' => {
                    i += 1;
                    while i < c.len() {
                        match c[i] {
                            '\\' => i += 2,
                            '"' => {
                                i += 1;
                                break;
                            }
                            _ => i += 1,
                        }
                    }
                    out.push_str("\"\"");
                }
                '\'' if next == Some('\\') => {
                    // An escaped char literal: '\n', '\'', '\u{…}'.
                    i += 2;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                    out.push_str("' '");
                }
                '\'' if c.get(i + 2) == Some(&'\'') => {
                    i += 3;
                    out.push_str("' '");
                }
                ch => {
                    out.push(ch);
                    i += 1;
                }
            }
        }
        out
    }

    /// The top-level modules a piece of code names through `crate::`.
    fn references(code: &str) -> BTreeSet<String> {
        let c: Vec<char> = code.chars().collect();
        let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
        let read_ident = |mut j: usize| {
            while c.get(j).is_some_and(|ch| ch.is_whitespace()) {
                j += 1;
            }
            let start = j;
            while c.get(j).is_some_and(|&ch| ident(ch)) {
                j += 1;
            }
            (c[start..j].iter().collect::<String>(), j)
        };
        let mut found = BTreeSet::new();
        let pattern: Vec<char> = "crate::".chars().collect();
        let mut i = 0;
        while i + pattern.len() <= c.len() {
            let hit = c[i..i + pattern.len()] == pattern[..]
                && (i == 0 || !(ident(c[i - 1]) || c[i - 1] == '$'));
            if !hit {
                i += 1;
                continue;
            }
            let mut j = i + pattern.len();
            while c.get(j).is_some_and(|ch| ch.is_whitespace()) {
                j += 1;
            }
            if c.get(j) == Some(&'{') {
                // A group: the first name of each item at its top level.
                let mut depth = 0;
                let mut item_start = true;
                while j < c.len() {
                    match c[j] {
                        '{' => {
                            depth += 1;
                            item_start = depth == 1;
                            j += 1;
                        }
                        '}' => {
                            depth -= 1;
                            j += 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ',' => {
                            item_start = depth == 1;
                            j += 1;
                        }
                        ch if ch.is_whitespace() => j += 1,
                        _ if item_start => {
                            let (name, end) = read_ident(j);
                            if !name.is_empty() && name != "self" {
                                found.insert(name);
                            }
                            item_start = false;
                            j = end.max(j + 1);
                        }
                        _ => j += 1,
                    }
                }
            } else {
                let (name, end) = read_ident(j);
                if !name.is_empty() {
                    found.insert(name);
                }
                j = end;
            }
            i = j.max(i + 1);
        }
        found
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Each top-level module's uses of the others: (from, to) → the files.
    fn uses(src: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut all = BTreeMap::new();
        for file in files {
            let rel = file.strip_prefix(src).expect("under src");
            let first = rel.components().next().expect("a path");
            let first = first.as_os_str().to_str().expect("UTF-8 path");
            let module = first.strip_suffix(".rs").unwrap_or(first).to_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            let code = code_only(&std::fs::read_to_string(&file).expect("read source"));
            for to in references(&code) {
                if to != module {
                    all.entry((module.clone(), to))
                        .or_insert_with(BTreeSet::new)
                        .insert(rel.display().to_string());
                }
            }
        }
        all
    }

    fn layer_of(module: &str) -> Option<usize> {
        LAYERS.iter().position(|(_, mods)| mods.contains(&module))
    }

    #[test]
    fn the_reader_sees_code_only() {
        let src = r##"
            use crate::{a::{b, c}, d, self};
            use crate::e::f; // crate::commented
            /* crate::block /* nested crate::x */ */
            let s = "crate::in_string \" crate::still";
            let r = r#"crate::raw " crate::raw2"#;
            let q = '"'; let l: &'static str = crate::g::h();
            pub(crate) fn x() -> $crate::macro_only {}
            crate :: spaced
        "##;
        let found = references(&code_only(src));
        let expected: BTreeSet<String> = ["a", "d", "e", "g"].map(String::from).into();
        assert_eq!(found, expected);
    }

    #[test]
    fn every_module_has_a_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut modules = BTreeSet::new();
        for entry in std::fs::read_dir(&src).expect("read src") {
            let path = entry.expect("dir entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).expect("name");
            let module = match name.strip_suffix(".rs") {
                Some(m) if m != "lib" && m != "main" => m,
                Some(_) => continue,
                None if path.is_dir() => name,
                None => continue,
            };
            modules.insert(module.to_owned());
        }
        // This module checks the others and uses none.
        modules.remove("layers");
        let declared: BTreeSet<String> = LAYERS
            .iter()
            .flat_map(|(_, mods)| mods.iter().map(|m| m.to_string()))
            .collect();
        assert_eq!(
            modules, declared,
            "every top-level module of src/ in exactly one layer of LAYERS (layers.rs)"
        );
        let listed: usize = LAYERS.iter().map(|(_, mods)| mods.len()).sum();
        assert_eq!(listed, declared.len(), "a module listed twice in LAYERS");
    }

    #[test]
    fn no_use_points_up_and_none_loops() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let uses = uses(&src);
        let mut up = Vec::new();
        let mut same: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for ((from, to), files) in &uses {
            let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
                continue; // not a module of the crate (an extern crate's name), or unlisted
            };
            if lt > lf {
                up.push(format!(
                    "{from} ({}) uses {to} ({}) in {}",
                    LAYERS[lf].0,
                    LAYERS[lt].0,
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            } else if lt == lf {
                same.entry(from.clone()).or_default().insert(to.clone());
            }
        }
        assert!(
            up.is_empty(),
            "uses that point up a layer (move the item down to where both can reach it):\n{}",
            up.join("\n")
        );
        // Within a layer: no cycle (depth-first search for a back edge).
        fn visit(
            m: &str,
            same: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|p| p == m) {
                let mut cycle = path[at..].to_vec();
                cycle.push(m.to_owned());
                return Some(cycle);
            }
            if done.contains(m) {
                return None;
            }
            path.push(m.to_owned());
            for next in same.get(m).into_iter().flatten() {
                if let Some(cycle) = visit(next, same, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(m.to_owned());
            None
        }
        let mut done = BTreeSet::new();
        for m in same.keys() {
            if let Some(cycle) = visit(m, &same, &mut Vec::new(), &mut done) {
                panic!(
                    "modules of one layer use each other in a cycle: {}",
                    cycle.join(" -> ")
                );
            }
        }
    }
}
