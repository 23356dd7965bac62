//! The `id:` of an SSE message, which a client sends back as `Last-Event-ID` (or `?after=`):
//! the sequence, and a short identity of the event there. A sequence alone cannot tell two
//! histories apart: after an asynchronous failover that lost a tail (or a restore from
//! backup) the database reaches the same numbers again with other events, and a client
//! resuming after a number from the lost history would be taken at its word and miss every
//! event of the new history up to it. With the identity, the server checks that the event at
//! the client's sequence is still the one the client saw.
//!
//! The form is `<sequence>:<tag>`, the tag being the first 64 bits of the SHA-256 of the
//! event ID in 16 lower-case hex digits: an event ID may be long and hold any character, a
//! header value may not, and a hash of it is short and fixed. A reconciliation's id names its
//! head the same way, or is the bare head when no retained event has that number (head 0). A
//! bare sequence, as older clients send, is still accepted; only the head can be checked then.

use std::fmt;

use sha2::{Digest, Sha256};

/// Hex digits of a tag.
const TAG_DIGITS: usize = 16;

/// A short, stable identity of an event: the first 64 bits of the SHA-256 of its event ID.
/// Two events with different IDs share a tag with a chance of 2^-64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag(u64);

impl Tag {
    /// The tag of the event with ID `event_id`.
    pub fn of(event_id: &str) -> Self {
        let digest = Sha256::digest(event_id.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Self(u64::from_be_bytes(first))
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A stream position as the `id:` field carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamId {
    /// The event's sequence (a reconciliation's head).
    pub sequence: i64,
    /// The tag of the event at `sequence`; `None` when no event is known there (head 0, a
    /// pruned head), or when an older client sent a bare sequence.
    pub tag: Option<Tag>,
}

impl StreamId {
    /// The position at `sequence`, standing on the event `event_id` when one is known.
    pub fn at(sequence: i64, event_id: Option<&str>) -> Self {
        Self {
            sequence,
            tag: event_id.map(Tag::of),
        }
    }

    /// Parses an id the stream sent (`<sequence>:<tag>`) or a bare sequence; surrounding
    /// spaces are ignored and the tag's hex digits may be in either case.
    pub fn parse(text: &str) -> Result<Self, MalformedId> {
        let text = text.trim();
        let (sequence, tag) = match text.split_once(':') {
            Some((sequence, tag)) => (sequence, Some(tag)),
            None => (text, None),
        };
        let sequence = parse_sequence(sequence).ok_or(MalformedId::Sequence)?;
        let tag = match tag {
            None => None,
            Some(tag) => Some(parse_tag(tag).ok_or(MalformedId::Tag)?),
        };
        Ok(Self { sequence, tag })
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag {
            Some(tag) => write!(f, "{}:{tag}", self.sequence),
            None => write!(f, "{}", self.sequence),
        }
    }
}

/// What is wrong with a resume position; the message completes "malformed Last-Event-ID
/// \"...\": ".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MalformedId {
    /// The part before `:` (or the whole) is not a non-negative integer.
    #[error(
        "expected a sequence (a non-negative integer), optionally followed by ':' and the \
         16 hex digits of the event's identity, as in the stream's id: fields"
    )]
    Sequence,
    /// The part after `:` is not 16 hex digits.
    #[error(
        "the identity after ':' must be 16 hex digits, as in the stream's id: fields \
         (<sequence>:<identity>)"
    )]
    Tag,
}

/// A non-negative integer that fits an `i64`.
fn parse_sequence(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Exactly [`TAG_DIGITS`] hex digits.
fn parse_tag(text: &str) -> Option<Tag> {
    if text.len() != TAG_DIGITS || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok().map(Tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in [
            StreamId::at(0, None),
            StreamId::at(42, None),
            StreamId::at(42, Some("task-deleted:FN-7:2026-12-01T06:26:12.439312Z")),
            StreamId::at(i64::MAX, Some("")),
            StreamId::at(7, Some("ünïcødé\n\"id\": with, everything")),
        ] {
            let text = id.to_string();
            assert_eq!(StreamId::parse(&text), Ok(id), "{text}");
            assert!(
                text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b':'),
                "{text}"
            );
        }
    }

    #[test]
    fn the_form_is_the_sequence_and_sixteen_hex_digits() {
        let id = StreamId::at(200, Some("lost-199")).to_string();
        let (sequence, tag) = id.split_once(':').unwrap();
        assert_eq!(sequence, "200");
        assert_eq!(tag.len(), 16);
        assert!(
            tag.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        // Stable: the same event always has the same tag; another event another.
        assert_eq!(Tag::of("lost-199"), Tag::of("lost-199"));
        assert_ne!(Tag::of("lost-199"), Tag::of("new-199"));
        assert_eq!(Tag::of("").to_string(), "e3b0c44298fc1c14");
    }

    #[test]
    fn bare_sequences_are_still_accepted() {
        assert_eq!(StreamId::parse("0"), Ok(StreamId::at(0, None)));
        assert_eq!(StreamId::parse(" 42 "), Ok(StreamId::at(42, None)));
        let upper = StreamId::parse("5:E3B0C44298FC1C14").unwrap();
        assert_eq!(upper, StreamId::at(5, Some("")));
    }

    #[test]
    fn malformed_ids_name_their_problem() {
        for bad in [
            "",
            "-1",
            "1.5",
            "abc",
            "1e3",
            "99999999999999999999",
            ":",
            ":e3b0c44298fc1c14",
        ] {
            assert_eq!(StreamId::parse(bad), Err(MalformedId::Sequence), "{bad:?}");
        }
        for bad in [
            "5:",
            "5:e3b0",
            "5:e3b0c44298fc1c14a",
            "5:g3b0c44298fc1c14",
            "5:e3b0c44298fc1c14:1",
            "5: e3b0c44298fc1c14",
            "5:+3b0c44298fc1c1",
        ] {
            assert_eq!(StreamId::parse(bad), Err(MalformedId::Tag), "{bad:?}");
        }
        assert!(MalformedId::Tag.to_string().contains("16 hex digits"));
    }
}
