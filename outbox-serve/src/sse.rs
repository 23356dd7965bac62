//! The Server-Sent Events wire format, written in one place: a message (an optional `id:`
//! line, an `event:` line, `data:` lines and the blank line that ends it) and a comment (a
//! line starting with `:`, which clients ignore: the stream's open, keep-alive and end).

use std::fmt::Display;

use bytes::Bytes;

/// A message of type `event` carrying `data` (one `data:` line per line of it), with `id` as
/// its `id:` field when given: what a client resumes from with `Last-Event-ID`.
pub(crate) fn message(id: Option<&dyn Display>, event: &str, data: &dyn Display) -> Bytes {
    let mut text = String::new();
    if let Some(id) = id {
        text.push_str(&format!("id: {id}\n"));
    }
    text.push_str(&format!("event: {event}\n"));
    for line in data.to_string().split('\n') {
        text.push_str("data: ");
        text.push_str(line);
        text.push('\n');
    }
    text.push('\n');
    Bytes::from(text)
}

/// A comment line saying `text` (its line breaks folded into spaces, so it stays one).
pub(crate) fn comment(text: &str) -> Bytes {
    Bytes::from(format!(": {}\n\n", text.replace('\n', " ")))
}

/// `message` without its `id:` line: for a feed that does not resume.
pub(crate) fn without_id(message: &[u8]) -> &[u8] {
    match message.strip_prefix(b"id: ") {
        Some(rest) => rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(message, |end| &rest[end + 1..]),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_has_its_id_event_and_data_and_ends_with_a_blank_line() {
        assert_eq!(
            message(Some(&"4:abc"), "task:deleted", &r#"{"a":1}"#),
            Bytes::from_static(b"id: 4:abc\nevent: task:deleted\ndata: {\"a\":1}\n\n")
        );
        assert_eq!(
            message(None, "lagged", &"{}"),
            Bytes::from_static(b"event: lagged\ndata: {}\n\n")
        );
        // Every line of the data is a data line of its own.
        assert_eq!(
            message(None, "x", &"one\ntwo"),
            Bytes::from_static(b"event: x\ndata: one\ndata: two\n\n")
        );
    }

    #[test]
    fn a_comment_stays_one_line() {
        assert_eq!(
            comment("keep-alive"),
            Bytes::from_static(b": keep-alive\n\n")
        );
        assert_eq!(comment("a\nb"), Bytes::from_static(b": a b\n\n"));
    }

    #[test]
    fn the_id_line_is_dropped() {
        assert_eq!(
            without_id(b"id: 4:abc\nevent: x\ndata: {}\n\n"),
            b"event: x\ndata: {}\n\n"
        );
        assert_eq!(without_id(b"event: x\n\n"), b"event: x\n\n");
    }
}
