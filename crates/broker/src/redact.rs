//! Secrets out of text meant for people: the one rule every log line, error message and admin
//! view applies to connection URLs (broker, database, hook URLs).
//!
//! It lives here because every crate that holds such a URL (the server, each broker) depends on
//! this one.

/// What a hidden secret is replaced by.
pub const HIDDEN: &str = "***";

/// `text` with the password of every URL in it hidden: `scheme://user:password@host` becomes
/// `scheme://user:***@host`, `scheme://secret@host` (a Redis password or NATS token without a
/// user) becomes `scheme://***@host`, and a `password=`, `pass=`, `token=` or `secret=` query
/// parameter keeps only its name. Comma-separated lists (`rediss://u:p@h:1,rediss://u:p@h:2`,
/// `redis+cluster://u:p@h1,h2`) and URLs inside longer messages are covered; so is a password
/// field as `Debug` prints one (`password: Some("…")`), as client libraries log their URLs.
pub fn redact_url(text: &str) -> String {
    if !text.contains("://") && !text.contains("password") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = url_end(tail);
        out.push_str(&redact_authority(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_debug_passwords(&out)
}

/// Where the URL that starts at `tail` (just after `://`) ends: at white space, a quote or
/// bracket that encloses it, or where the next URL of a comma-separated list starts.
fn url_end(tail: &str) -> usize {
    let stop = tail
        .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
        .unwrap_or(tail.len());
    let Some(next) = tail[..stop].find("://") else {
        return stop;
    };
    // Back over the next URL's scheme (`rediss`, `redis+cluster`) to the separator before it.
    tail[..next]
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .map_or(0, |j| j + 1)
}

/// One URL without its scheme: the user info before the last `@` (a raw `@` in a password stays
/// hidden too), then secret query parameters.
fn redact_authority(url: &str) -> String {
    let (userinfo, after) = match url.rfind('@') {
        Some(at) => (Some(&url[..at]), &url[at + 1..]),
        None => (None, url),
    };
    let mut out = match userinfo {
        Some(info) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:{HIDDEN}@"),
            None if info.is_empty() => "@".to_owned(),
            None => format!("{HIDDEN}@"),
        },
        None => String::new(),
    };
    match after.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if is_secret_param(k) => format!("{k}={HIDDEN}"),
                    _ => kv.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(after),
    }
    out
}

fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "pass",
        "passwd",
        "token",
        "secret",
        "sslpassword",
    ]
    .contains(&name.as_str())
}

/// The value of a password field as `Debug` prints one (`password: Some("x")`, `password: "x"`),
/// also inside a JSON log line where its quotes are escaped (`\"`), hidden; and a parsed URL's
/// user name when it has no password (`username: "x", password: None`: a token).
fn redact_debug_passwords(text: &str) -> String {
    if !text.contains("password: ") {
        return text.to_owned();
    }
    let text = hide_quoted_after(text, "password: Some(");
    let text = hide_quoted_after(&text, "password: ");
    hide_token_user(&text)
}

/// Every quoted value (`"…"` or `\"…\"`) that directly follows `key`, hidden.
fn hide_quoted_after(text: &str, key: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(key) {
        let (head, tail) = rest.split_at(i + key.len());
        out.push_str(head);
        rest = tail;
        let quote = if tail.starts_with("\\\"") {
            "\\\""
        } else if tail.starts_with('"') {
            "\""
        } else {
            continue;
        };
        let value = &tail[quote.len()..];
        let Some(end) = closing_quote(value, quote) else {
            continue;
        };
        out.push_str(quote);
        out.push_str(HIDDEN);
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

/// Where `quote` (`"` or `\"`) closes a value: the first one not escaped by a backslash.
fn closing_quote(value: &str, quote: &str) -> Option<usize> {
    if quote != "\"" {
        return value.find(quote);
    }
    let mut escaped = false;
    for (j, c) in value.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(j),
            _ => escaped = false,
        }
    }
    None
}

/// `username: "x", password: None` (with either quoting) → `username: "***", password: None`.
fn hide_token_user(text: &str) -> String {
    let mut out = text.to_owned();
    for quote in ["\\\"", "\""] {
        let key = format!("username: {quote}");
        let tail_mark = format!("{quote}, password: None");
        let mut from = 0;
        while let Some(i) = out[from..].find(&key) {
            let value_at = from + i + key.len();
            let Some(end) = out[value_at..].find(&tail_mark) else {
                break;
            };
            let value_end = value_at + end;
            if end > 0 && !out[value_at..value_end].contains(quote) {
                out.replace_range(value_at..value_end, HIDDEN);
                from = value_at + HIDDEN.len();
            } else {
                from = value_at;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_in_urls_are_hidden() {
        let cases = [
            ("memory", "memory"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            (
                "redis://:s3cret@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "rediss://app:s3cret@h:1,rediss://app:s3cret@h:2",
                "rediss://app:***@h:1,rediss://app:***@h:2",
            ),
            (
                "redis+cluster://u:s3cret@h1:1,h2:2",
                "redis+cluster://u:***@h1:1,h2:2",
            ),
            (
                "redis+sentinel://:s3cret@s1:26379,s2:26379/mymaster",
                "redis+sentinel://:***@s1:26379,s2:26379/mymaster",
            ),
            ("nats://token@h:4222", "nats://***@h:4222"),
            ("nats://bob:s3cret@h:4222", "nats://bob:***@h:4222"),
            ("redis://:p@ss@h:1", "redis://:***@h:1"),
            ("redis://:a,b@h:1", "redis://:***@h:1"),
            (
                "postgres://h/db?sslmode=require&password=s3cret",
                "postgres://h/db?sslmode=require&password=***",
            ),
            (
                "Error: connecting to Redis at redis://:s3cret@h:1: bad URL \"redis://:s3cret@h:1\"",
                "Error: connecting to Redis at redis://:***@h:1: bad URL \"redis://:***@h:1\"",
            ),
            (
                "server=Url { username: \"u\", password: Some(\"s3cret\"), port: Some(1) }",
                "server=Url { username: \"u\", password: Some(\"***\"), port: Some(1) }",
            ),
            ("{ password: \"s3\\\"cret\" }", "{ password: \"***\" }"),
            (
                r#"{"server":"Url { username: \"u\", password: Some(\"s3cret\") }"}"#,
                r#"{"server":"Url { username: \"u\", password: Some(\"***\") }"}"#,
            ),
            (
                "Url { username: \"tok3n\", password: None, port: None }",
                "Url { username: \"***\", password: None, port: None }",
            ),
            (
                r#""Url { username: \"tok3n\", password: None }""#,
                r#""Url { username: \"***\", password: None }""#,
            ),
        ];
        for (given, want) in cases {
            assert_eq!(redact_url(given), want, "{given}");
        }
    }
}
