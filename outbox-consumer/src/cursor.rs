//! A cursor as the logs show it.

use std::fmt::Display;

/// A cursor as logs show it: its sequence number, or `none` before the consumer has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShownCursor(pub Option<i64>);

impl Display for ShownCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(sequence) => write!(f, "{sequence}"),
            None => f.write_str("none"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_shows_as_its_number_or_none() {
        assert_eq!(ShownCursor(Some(8)).to_string(), "8");
        assert_eq!(ShownCursor(None).to_string(), "none");
    }
}
