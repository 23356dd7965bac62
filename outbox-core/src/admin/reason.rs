//! Why an operator acted: the one piece of free text the operator surface accepts, checked so
//! that it stays one printable line wherever it is shown.

use std::fmt;

use serde::Serialize;

/// Longest accepted reason, in characters.
pub const MAX_REASON_LEN: usize = 200;

/// Why an operator acted: free text of 1 to [`MAX_REASON_LEN`] characters, not blank, without
/// control characters (no newlines or tabs: one line in every table) and without invisible or
/// bidirectional formatting characters (which could make it display as something else).
/// Stored on the row it explains, never in the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Reason(String);

/// A reason was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReasonError {
    /// The empty string.
    #[error("invalid reason: must not be empty")]
    Empty,
    /// Only whitespace.
    #[error("invalid reason: must not be blank")]
    Blank,
    /// Too long.
    #[error("invalid reason: {len} characters exceeds the limit of {max}")]
    TooLong {
        /// Its length in characters.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A control character (C0, DEL or C1), including newline and tab.
    #[error("invalid reason: control character at position {position}")]
    ControlCharacter {
        /// 1-based character position.
        position: usize,
    },
    /// An invisible or bidirectional formatting character.
    #[error(
        "invalid reason: invisible formatting character U+{code:04X} at position {position} \
         is not allowed"
    )]
    FormattingCharacter {
        /// The character's code point.
        code: u32,
        /// 1-based character position.
        position: usize,
    },
}

/// Zero-width, bidirectional-override and similar characters that change how text displays.
fn is_formatting(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

impl Reason {
    /// Validates a reason.
    pub fn new(value: impl Into<String>) -> Result<Self, ReasonError> {
        let value = value.into();
        if value.is_empty() {
            return Err(ReasonError::Empty);
        }
        let len = value.chars().count();
        if len > MAX_REASON_LEN {
            return Err(ReasonError::TooLong {
                len,
                max: MAX_REASON_LEN,
            });
        }
        for (index, c) in value.chars().enumerate() {
            let position = index + 1;
            if c.is_control() {
                return Err(ReasonError::ControlCharacter { position });
            }
            if is_formatting(c) {
                return Err(ReasonError::FormattingCharacter {
                    code: u32::from(c),
                    position,
                });
            }
        }
        if value.trim().is_empty() {
            return Err(ReasonError::Blank);
        }
        Ok(Self(value))
    }

    /// The reason as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Reason {
    type Err = ReasonError;
    fn from_str(value: &str) -> Result<Self, ReasonError> {
        Self::new(value)
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reasons_are_one_printable_line() {
        assert_eq!(
            Reason::new("duplicate of FN-2").unwrap().as_str(),
            "duplicate of FN-2"
        );
        Reason::new("x".repeat(MAX_REASON_LEN)).unwrap();
        Reason::new("réparé à la main ✓").unwrap();
        assert_eq!(
            Reason::new("").unwrap_err().to_string(),
            "invalid reason: must not be empty"
        );
        assert_eq!(
            Reason::new("   ").unwrap_err().to_string(),
            "invalid reason: must not be blank"
        );
        assert_eq!(
            Reason::new("x".repeat(201)).unwrap_err().to_string(),
            "invalid reason: 201 characters exceeds the limit of 200"
        );
        assert_eq!(
            Reason::new("two\nlines").unwrap_err().to_string(),
            "invalid reason: control character at position 4"
        );
        assert_eq!(
            Reason::new("tab\there").unwrap_err(),
            ReasonError::ControlCharacter { position: 4 }
        );
        assert_eq!(
            Reason::new("ab\u{202E}cd").unwrap_err().to_string(),
            "invalid reason: invisible formatting character U+202E at position 3 is not allowed"
        );
        assert!(Reason::new("zero\u{200B}width").is_err());
        assert!(Reason::new("esc\u{1b}[31m").is_err());
    }

    proptest! {
        #[test]
        fn reason_accepted_iff_printable_nonblank_and_short(s in "\\PC{0,210}|[ -~\\n\\t]{0,20}") {
            let expected = !s.trim().is_empty()
                && s.chars().count() <= MAX_REASON_LEN
                && !s.chars().any(|c| c.is_control() || is_formatting(c));
            prop_assert_eq!(Reason::new(s.clone()).is_ok(), expected);
        }
    }
}
