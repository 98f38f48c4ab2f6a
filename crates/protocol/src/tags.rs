//! Publication tags and the subscription tag filters that select publications by them.
//!
//! A publication may carry `tags`, a small string→string map set by the publisher (HTTP API,
//! consumers). A subscription may carry a tag filter (`tf`, Centrifugo's shape): a tree whose
//! leaves compare one tag (`key`, `cmp`, `val`/`vals`) and whose inner nodes combine
//! (`op`: `and`, `or`, `not`, with `nodes`). The node evaluates it at fan-out; a subscriber whose
//! filter does not match does not get the publication.
//!
//! Both are bounded (see the constants) so that a publisher cannot make every node hold large
//! maps, and a subscriber cannot make each fan-out evaluate a large tree.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A publication's tags. Ordered, so that every encoding of the same tags is the same bytes.
pub type Tags = BTreeMap<String, String>;

/// At most this many tags per publication.
pub const MAX_TAGS: usize = 32;
/// The most bytes of one tag key.
pub const MAX_TAG_KEY_BYTES: usize = 64;
/// The most bytes of all tags' keys and values together.
pub const MAX_TAGS_BYTES: usize = 4096;
/// The deepest a filter tree may nest (a leaf alone is depth 1).
pub const MAX_FILTER_DEPTH: usize = 8;
/// At most this many nodes (leaves and operators) in one filter.
pub const MAX_FILTER_NODES: usize = 64;
/// At most this many values in all `vals` of one filter together.
pub const MAX_FILTER_VALUES: usize = 256;
/// The most bytes of one `key`, `val` or `vals` entry of a filter.
pub const MAX_FILTER_STRING_BYTES: usize = 256;

/// Check a publication's tags against the bounds; the error says which one failed.
pub fn check_tags(tags: &Tags) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!(
            "tags: {} tags, at most {MAX_TAGS} allowed",
            tags.len()
        ));
    }
    let mut bytes = 0;
    for (k, v) in tags {
        if k.is_empty() || k.len() > MAX_TAG_KEY_BYTES {
            return Err(format!(
                "tags: a key must be 1 to {MAX_TAG_KEY_BYTES} bytes"
            ));
        }
        bytes += k.len() + v.len();
    }
    if bytes > MAX_TAGS_BYTES {
        return Err(format!(
            "tags: {bytes} bytes of keys and values, at most {MAX_TAGS_BYTES} allowed"
        ));
    }
    Ok(())
}

/// A filter as the client sends it (`subscribe.tf`), before [`TagFilter::from_spec`] checks it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSpec {
    /// `and`, `or`, `not` for an inner node; absent or `""` for a leaf.
    #[serde(default)]
    pub op: String,
    /// A leaf's tag key.
    #[serde(default)]
    pub key: String,
    /// A leaf's comparison.
    #[serde(default)]
    pub cmp: String,
    /// A leaf's value (`eq`, `neq`, `starts`, `ends`, `contains`, `lt`, `lte`, `gt`, `gte`).
    #[serde(default)]
    pub val: String,
    /// A leaf's values (`in`, `nin`).
    #[serde(default)]
    pub vals: Vec<String>,
    /// An inner node's children.
    #[serde(default)]
    pub nodes: Vec<FilterSpec>,
}

/// How a leaf compares its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// The tag equals `val`.
    Eq,
    /// The tag is absent or differs from `val`.
    Neq,
    /// The tag equals one of `vals`.
    In,
    /// The tag is absent or equals none of `vals`.
    Nin,
    /// The tag is present.
    Exists,
    /// The tag is absent.
    NotExists,
    /// The tag starts with `val`.
    Starts,
    /// The tag ends with `val`.
    Ends,
    /// The tag contains `val`.
    Contains,
    /// The tag, as a number, is below `val`.
    Lt,
    /// … at most `val`.
    Lte,
    /// … above `val`.
    Gt,
    /// … at least `val`.
    Gte,
}

impl Cmp {
    /// The comparison by its name; Centrifugo's short names `sw`, `ew`, `ct` are accepted too.
    fn parse(name: &str) -> Option<Cmp> {
        Some(match name {
            "eq" => Cmp::Eq,
            "neq" => Cmp::Neq,
            "in" => Cmp::In,
            "nin" => Cmp::Nin,
            "ex" => Cmp::Exists,
            "nex" => Cmp::NotExists,
            "starts" | "sw" => Cmp::Starts,
            "ends" | "ew" => Cmp::Ends,
            "contains" | "ct" => Cmp::Contains,
            "lt" => Cmp::Lt,
            "lte" => Cmp::Lte,
            "gt" => Cmp::Gt,
            "gte" => Cmp::Gte,
            _ => return None,
        })
    }

    fn numeric(self) -> bool {
        matches!(self, Cmp::Lt | Cmp::Lte | Cmp::Gt | Cmp::Gte)
    }
}

/// A checked filter tree, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub enum TagFilter {
    /// Compare one tag.
    Leaf {
        /// The tag's key.
        key: String,
        /// How.
        cmp: Cmp,
        /// Against what (`val`, or `vals` for `in`/`nin`).
        vals: Vec<String>,
        /// `val` as a number, for `lt`/`lte`/`gt`/`gte`.
        number: f64,
    },
    /// Every child matches.
    And(Vec<TagFilter>),
    /// Some child matches.
    Or(Vec<TagFilter>),
    /// The one child does not match.
    Not(Box<TagFilter>),
}

/// What [`TagFilter::from_spec`] counts while it walks a tree.
#[derive(Default)]
struct Budget {
    nodes: usize,
    values: usize,
}

impl TagFilter {
    /// Check a client's filter: known `op` and `cmp`, the fields each needs, and the bounds.
    /// The error says what is wrong and where.
    pub fn from_spec(spec: &FilterSpec) -> Result<TagFilter, String> {
        Self::build(spec, 1, &mut Budget::default())
    }

    fn build(spec: &FilterSpec, depth: usize, budget: &mut Budget) -> Result<TagFilter, String> {
        if depth > MAX_FILTER_DEPTH {
            return Err(format!(
                "tags filter: nested deeper than {MAX_FILTER_DEPTH}"
            ));
        }
        budget.nodes += 1;
        if budget.nodes > MAX_FILTER_NODES {
            return Err(format!("tags filter: more than {MAX_FILTER_NODES} nodes"));
        }
        let long = |s: &str| s.len() > MAX_FILTER_STRING_BYTES;
        match spec.op.as_str() {
            "" => {
                if !spec.nodes.is_empty() {
                    return Err("tags filter: a leaf (no \"op\") has no \"nodes\"".into());
                }
                let cmp = Cmp::parse(&spec.cmp).ok_or_else(|| {
                    format!(
                        "tags filter: unknown cmp {:?} (eq, neq, in, nin, ex, nex, starts, ends, \
                         contains, lt, lte, gt, gte)",
                        spec.cmp
                    )
                })?;
                if spec.key.is_empty() || long(&spec.key) {
                    return Err(format!(
                        "tags filter: \"key\" must be 1 to {MAX_FILTER_STRING_BYTES} bytes"
                    ));
                }
                let vals = match cmp {
                    Cmp::In | Cmp::Nin => {
                        if spec.vals.is_empty() || !spec.val.is_empty() {
                            return Err(format!(
                                "tags filter: {:?} takes \"vals\" (not \"val\")",
                                spec.cmp
                            ));
                        }
                        spec.vals.clone()
                    }
                    Cmp::Exists | Cmp::NotExists => {
                        if !spec.vals.is_empty() || !spec.val.is_empty() {
                            return Err(format!(
                                "tags filter: {:?} takes no \"val\" or \"vals\"",
                                spec.cmp
                            ));
                        }
                        Vec::new()
                    }
                    _ => {
                        if !spec.vals.is_empty() {
                            return Err(format!(
                                "tags filter: {:?} takes \"val\" (not \"vals\")",
                                spec.cmp
                            ));
                        }
                        vec![spec.val.clone()]
                    }
                };
                budget.values += vals.len();
                if budget.values > MAX_FILTER_VALUES {
                    return Err(format!("tags filter: more than {MAX_FILTER_VALUES} values"));
                }
                if vals.iter().any(|v| long(v)) {
                    return Err(format!(
                        "tags filter: a value is longer than {MAX_FILTER_STRING_BYTES} bytes"
                    ));
                }
                let number = if cmp.numeric() {
                    parse_number(&spec.val).ok_or_else(|| {
                        format!("tags filter: {:?} needs a number as \"val\"", spec.cmp)
                    })?
                } else {
                    0.0
                };
                Ok(TagFilter::Leaf {
                    key: spec.key.clone(),
                    cmp,
                    vals,
                    number,
                })
            }
            op @ ("and" | "or" | "not") => {
                if !spec.key.is_empty()
                    || !spec.cmp.is_empty()
                    || !spec.val.is_empty()
                    || !spec.vals.is_empty()
                {
                    return Err(format!(
                        "tags filter: {op:?} takes only \"nodes\" (key, cmp, val, vals are a \
                         leaf's)"
                    ));
                }
                if spec.nodes.is_empty() || (op == "not" && spec.nodes.len() != 1) {
                    return Err(format!(
                        "tags filter: {op:?} needs {} in \"nodes\"",
                        if op == "not" {
                            "exactly one node"
                        } else {
                            "at least one node"
                        }
                    ));
                }
                let mut children = Vec::with_capacity(spec.nodes.len());
                for n in &spec.nodes {
                    children.push(Self::build(n, depth + 1, budget)?);
                }
                Ok(match op {
                    "and" => TagFilter::And(children),
                    "or" => TagFilter::Or(children),
                    _ => TagFilter::Not(Box::new(children.pop().expect("one node"))),
                })
            }
            other => Err(format!(
                "tags filter: unknown op {other:?} (and, or, not, or none for a leaf)"
            )),
        }
    }

    /// Whether a publication with `tags` passes this filter.
    pub fn matches(&self, tags: &Tags) -> bool {
        match self {
            TagFilter::And(nodes) => nodes.iter().all(|n| n.matches(tags)),
            TagFilter::Or(nodes) => nodes.iter().any(|n| n.matches(tags)),
            TagFilter::Not(node) => !node.matches(tags),
            TagFilter::Leaf {
                key,
                cmp,
                vals,
                number,
            } => {
                let tag = tags.get(key).map(String::as_str);
                let val = vals.first().map(String::as_str).unwrap_or_default();
                match (cmp, tag) {
                    (Cmp::Exists, t) => t.is_some(),
                    (Cmp::NotExists, t) => t.is_none(),
                    (Cmp::Neq, t) => t != Some(val),
                    (Cmp::Nin, t) => t.is_none_or(|t| !vals.iter().any(|v| v == t)),
                    (_, None) => false,
                    (Cmp::Eq, Some(t)) => t == val,
                    (Cmp::In, Some(t)) => vals.iter().any(|v| v == t),
                    (Cmp::Starts, Some(t)) => t.starts_with(val),
                    (Cmp::Ends, Some(t)) => t.ends_with(val),
                    (Cmp::Contains, Some(t)) => t.contains(val),
                    (Cmp::Lt | Cmp::Lte | Cmp::Gt | Cmp::Gte, Some(t)) => {
                        // A tag that is not a number matches no numeric comparison.
                        parse_number(t).is_some_and(|t| match cmp {
                            Cmp::Lt => t < *number,
                            Cmp::Lte => t <= *number,
                            Cmp::Gt => t > *number,
                            _ => t >= *number,
                        })
                    }
                }
            }
        }
    }
}

/// A finite number written as decimal text (`"42"`, `"-1.5"`); anything else is not a number.
fn parse_number(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|n| n.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn filter(json: &str) -> Result<TagFilter, String> {
        let spec: FilterSpec = serde_json::from_str(json).map_err(|e| e.to_string())?;
        TagFilter::from_spec(&spec)
    }

    #[test]
    fn every_comparison_matches_what_it_says() {
        let t = tags(&[("kind", "goal"), ("team", "home-red"), ("minute", "42")]);
        let cases = [
            (r#"{"key":"kind","cmp":"eq","val":"goal"}"#, true),
            (r#"{"key":"kind","cmp":"eq","val":"card"}"#, false),
            (r#"{"key":"kind","cmp":"neq","val":"card"}"#, true),
            (r#"{"key":"nope","cmp":"neq","val":"card"}"#, true),
            (r#"{"key":"kind","cmp":"in","vals":["card","goal"]}"#, true),
            (
                r#"{"key":"kind","cmp":"nin","vals":["card","goal"]}"#,
                false,
            ),
            (r#"{"key":"nope","cmp":"nin","vals":["x"]}"#, true),
            (r#"{"key":"kind","cmp":"ex"}"#, true),
            (r#"{"key":"nope","cmp":"ex"}"#, false),
            (r#"{"key":"nope","cmp":"nex"}"#, true),
            (r#"{"key":"team","cmp":"starts","val":"home"}"#, true),
            (r#"{"key":"team","cmp":"sw","val":"away"}"#, false),
            (r#"{"key":"team","cmp":"ends","val":"red"}"#, true),
            (r#"{"key":"team","cmp":"contains","val":"e-r"}"#, true),
            (r#"{"key":"minute","cmp":"lt","val":"45"}"#, true),
            (r#"{"key":"minute","cmp":"lte","val":"42"}"#, true),
            (r#"{"key":"minute","cmp":"gt","val":"42"}"#, false),
            (r#"{"key":"minute","cmp":"gte","val":"41.5"}"#, true),
            (r#"{"key":"team","cmp":"gt","val":"1"}"#, false),
            (r#"{"key":"nope","cmp":"lt","val":"1"}"#, false),
        ];
        for (json, want) in cases {
            assert_eq!(filter(json).unwrap().matches(&t), want, "{json}");
        }
    }

    #[test]
    fn operators_combine_their_nodes() {
        let t = tags(&[("kind", "goal"), ("team", "home")]);
        let f = filter(
            r#"{"op":"and","nodes":[
                {"key":"kind","cmp":"eq","val":"goal"},
                {"op":"not","nodes":[{"key":"team","cmp":"eq","val":"away"}]},
                {"op":"or","nodes":[{"key":"x","cmp":"ex"},{"key":"team","cmp":"eq","val":"home"}]}
            ]}"#,
        )
        .unwrap();
        assert!(f.matches(&t));
        assert!(!f.matches(&tags(&[("kind", "goal"), ("team", "away")])));
        assert!(!f.matches(&Tags::new()));
    }

    #[test]
    fn malformed_filters_are_refused_with_the_reason() {
        let cases = [
            (r#"{"key":"k","cmp":"like","val":"x"}"#, "unknown cmp"),
            (r#"{"op":"xor","nodes":[]}"#, "unknown op"),
            (r#"{"key":"","cmp":"eq","val":"x"}"#, "\"key\""),
            (r#"{"key":"k","cmp":"in","val":"x"}"#, "takes \"vals\""),
            (r#"{"key":"k","cmp":"eq","vals":["x"]}"#, "takes \"val\""),
            (r#"{"key":"k","cmp":"ex","val":"x"}"#, "takes no"),
            (r#"{"key":"k","cmp":"lt","val":"ten"}"#, "needs a number"),
            (r#"{"op":"and","nodes":[]}"#, "at least one node"),
            (
                r#"{"op":"not","nodes":[{"key":"k","cmp":"ex"},{"key":"k","cmp":"ex"}]}"#,
                "exactly one",
            ),
            (
                r#"{"op":"and","key":"k","nodes":[{"key":"k","cmp":"ex"}]}"#,
                "takes only",
            ),
            (
                r#"{"key":"k","cmp":"ex","nodes":[{"key":"k","cmp":"ex"}]}"#,
                "no \"nodes\"",
            ),
            (r#"{"key":"k","cmp":"ex","weird":1}"#, "unknown field"),
        ];
        for (json, want) in cases {
            let e = filter(json).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }

    #[test]
    fn filters_and_tags_are_bounded() {
        let mut deep = r#"{"key":"k","cmp":"ex"}"#.to_string();
        for _ in 0..MAX_FILTER_DEPTH {
            deep = format!(r#"{{"op":"not","nodes":[{deep}]}}"#);
        }
        assert!(filter(&deep).unwrap_err().contains("deeper"));
        let leaf = r#"{"key":"k","cmp":"ex"}"#;
        let wide = format!(
            r#"{{"op":"or","nodes":[{}]}}"#,
            vec![leaf; MAX_FILTER_NODES].join(",")
        );
        assert!(filter(&wide).unwrap_err().contains("nodes"));

        let many: Tags = (0..=MAX_TAGS)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(check_tags(&many).unwrap_err().contains("at most"));
        let big = tags(&[("k", &"x".repeat(MAX_TAGS_BYTES))]);
        assert!(check_tags(&big).unwrap_err().contains("bytes"));
        assert!(check_tags(&tags(&[("", "x")])).unwrap_err().contains("key"));
        assert!(check_tags(&tags(&[("k", "v")])).is_ok());
    }
}
