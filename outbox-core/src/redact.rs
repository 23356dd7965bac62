//! Passwords out of connection strings before they are printed.
//!
//! Both forms libpq accepts are parsed, not pattern-matched: a URL (`user:secret@host`, or a
//! `password=` query parameter) and the key=value form, whose values may be single-quoted and
//! contain backslash escapes (`password='hunter 2'`, `password=it\'s`). Text that does not
//! parse is redacted conservatively: everything from the first `password` on is dropped.

use percent_encoding::percent_decode_str;

/// What replaces a password.
const MASK: &str = "***";

/// The connection string with every password replaced by `***`, safe to print.
pub fn redact_connection_string(text: &str) -> String {
    let parsed = if starts_with_scheme(text) {
        redact_url(text)
    } else {
        redact_key_values(text)
    };
    parsed.unwrap_or_else(|| conservative(text))
}

/// Whether `text` is a URL: it opens with a scheme (`postgresql://`, or any other, so that a
/// mistyped `postgress://user:secret@...` is still read as one). A `://` later on, inside a
/// key=value string's quoted password for instance, does not make it one.
fn starts_with_scheme(text: &str) -> bool {
    let Some(end) = text.find("://") else {
        return false;
    };
    let mut scheme = text[..end].chars();
    scheme.next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
}

/// Keeps what precedes the first mention of a password, drops the rest.
fn conservative(text: &str) -> String {
    match text.to_ascii_lowercase().find("password") {
        Some(at) => format!("{}password={MASK} (rest hidden)", &text[..at]),
        None => text.to_owned(),
    }
}

fn redact_url(text: &str) -> Option<String> {
    let scheme_end = text.find("://")? + 3;
    let rest = &text[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..scheme_end]);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push(':');
                    out.push_str(MASK);
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[authority_end..];
    match tail.find('?') {
        None => out.push_str(tail),
        Some(q) => {
            out.push_str(&tail[..=q]);
            let pairs: Vec<String> = tail[q + 1..]
                .split('&')
                .map(|pair| {
                    let key = pair.split('=').next().unwrap_or("");
                    if percent_decode_str(key)
                        .decode_utf8_lossy()
                        .eq_ignore_ascii_case("password")
                    {
                        format!("{key}={MASK}")
                    } else {
                        pair.to_owned()
                    }
                })
                .collect();
            out.push_str(&pairs.join("&"));
        }
    }
    Some(out)
}

/// The key=value form, as libpq parses it: `key = value` pairs separated by whitespace; a
/// value is either single-quoted (with `\'` and `\\` escapes) or runs to the next whitespace
/// (with backslash escapes). `None` when the text does not parse.
fn redact_key_values(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start();
        out.push_str(&rest[..rest.len() - trimmed.len()]);
        rest = trimmed;
        if rest.is_empty() {
            return Some(out);
        }
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let key = &rest[..key_end];
        if key.is_empty() {
            return None;
        }
        out.push_str(key);
        rest = &rest[key_end..];
        let before_eq = rest.trim_start();
        let eq_ws = &rest[..rest.len() - before_eq.len()];
        let after_eq = before_eq.strip_prefix('=')?;
        out.push_str(eq_ws);
        out.push('=');
        let value_start = after_eq.trim_start();
        out.push_str(&after_eq[..after_eq.len() - value_start.len()]);
        let value_len = value_length(value_start)?;
        if key.eq_ignore_ascii_case("password") {
            out.push_str(MASK);
        } else {
            out.push_str(&value_start[..value_len]);
        }
        rest = &value_start[value_len..];
    }
}

/// Length in bytes of the value at the start of `text`, quotes and escapes included; `None`
/// for an unterminated quote or a dangling backslash.
fn value_length(text: &str) -> Option<usize> {
    let mut chars = text.char_indices();
    if text.starts_with('\'') {
        chars.next();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next()?;
                }
                '\'' => return Some(i + 1),
                _ => {}
            }
        }
        return None;
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next()?;
            }
            c if c.is_whitespace() => return Some(i),
            _ => {}
        }
    }
    Some(text.len())
}

#[cfg(test)]
mod tests {
    use super::redact_connection_string as redact;
    use proptest::prelude::*;

    #[test]
    fn urls() {
        assert_eq!(
            redact("postgresql://app:s3cret@db:5432/x"),
            "postgresql://app:***@db:5432/x"
        );
        assert_eq!(redact("postgresql://app@db/x"), "postgresql://app@db/x");
        assert_eq!(
            redact("postgresql:///x?user=a&password=p&host=/tmp"),
            "postgresql:///x?user=a&password=***&host=/tmp"
        );
        assert_eq!(
            redact("postgres://h/x?pass%77ord=p"),
            "postgres://h/x?pass%77ord=***"
        );
    }

    #[test]
    fn key_values_with_quotes_and_escapes() {
        assert_eq!(
            redact("host=db password=p user=a"),
            "host=db password=*** user=a"
        );
        assert_eq!(
            redact("host=/tmp/x password='hunter 2' dbname=z"),
            "host=/tmp/x password=*** dbname=z"
        );
        assert_eq!(
            redact(r"password = 'it\'s \\ 2' user=a"),
            "password = *** user=a"
        );
        assert_eq!(redact(r"password=a\ b user=c"), "password=*** user=c");
        assert_eq!(redact("PASSWORD=x"), "PASSWORD=***");
        // A `://` inside a value does not make the string a URL (found by the property test).
        assert_eq!(redact("password='://A'"), "password=***");
        assert_eq!(redact("host=db password=a://b@c"), "host=db password=***");
        assert_eq!(
            redact("mysql://u:pw@db/x"),
            "mysql://u:***@db/x",
            "a URL of another scheme is still a URL"
        );
    }

    #[test]
    fn unparseable_text_hides_everything_after_password() {
        let out = redact("host=db password='never closed");
        assert!(!out.contains("never"), "{out}");
        assert!(out.starts_with("host=db "), "{out}");
    }

    /// Quotes `value` as libpq's key=value form requires.
    fn quoted(value: &str) -> String {
        format!("'{}'", value.replace('\\', r"\\").replace('\'', r"\'"))
    }

    proptest! {
        /// No password, however quoted or escaped, survives in the printed form.
        #[test]
        fn no_password_substring_is_ever_printed(
            password in "[ -~]{4,24}",
            before in prop::sample::select(vec!["", "host=/tmp/x ", "host = db  user=a "]),
            after in prop::sample::select(vec!["", " dbname=z", "  sslmode=disable port=5"]),
            form in 0..4u8,
        ) {
            let text = match form {
                0 => format!("{before}password={}{after}", quoted(&password)),
                1 => format!("{before}password = {}{after}", quoted(&password)),
                2 => {
                    let escaped: String = password
                        .chars()
                        .flat_map(|c| match c {
                            ' ' | '\\' | '\'' => vec!['\\', c],
                            c => vec![c],
                        })
                        .collect();
                    format!("{before}password={escaped}{after}")
                }
                _ => {
                    let encoded: String = password
                        .bytes()
                        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                        .collect();
                    format!("postgresql://user:{encoded}@db/x?application_name=a")
                }
            };
            let without = text.replacen(&password, "", 1);
            prop_assume!(!without.contains(&password) && !"***".contains(&password));
            let printed = redact(&text);
            prop_assert!(!printed.contains(&password), "{text:?} printed as {printed:?}");
        }
    }
}
