//! The PostgreSQL schema that holds the outbox tables.

use std::fmt;

/// Default schema name.
pub const DEFAULT_SCHEMA: &str = "outbox";

/// A validated schema name; every statement quotes it.
///
/// Restricted to lower-case identifiers so the name is the same quoted or not, and so that
/// derived names (the NOTIFY channel) stay within PostgreSQL's 63-byte identifier limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema {
    name: String,
}

/// A schema name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid schema name {name:?}: use 1 to 40 characters from a-z, 0-9 and _, \
     starting with a letter or _"
)]
pub struct SchemaNameError {
    /// The refused name.
    pub name: String,
}

impl Schema {
    /// Validates a schema name.
    pub fn new(name: impl Into<String>) -> Result<Self, SchemaNameError> {
        let name = name.into();
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if first_ok && rest_ok && name.len() <= 40 {
            Ok(Self { name })
        } else {
            Err(SchemaNameError { name })
        }
    }

    /// The bare name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted identifier, for SQL text.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.name)
    }

    /// The channel the sequencer notifies; its payload is the project ID.
    pub fn channel(&self) -> String {
        format!("{}_lifecycle", self.name)
    }

    /// Replaces `{{schema}}` in an SQL template with the quoted schema name.
    pub fn render(&self, template: &str) -> String {
        template.replace("{{schema}}", &self.quoted())
    }

    /// A stable advisory-lock key for `purpose` within this schema (FNV-1a, 64 bit), so that
    /// two deployments in different schemas of one database never contend.
    pub fn lock_key(&self, purpose: &str) -> i64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self
            .name
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(purpose.bytes())
        {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        i64::from_ne_bytes(hash.to_ne_bytes())
    }
}

impl Default for Schema {
    fn default() -> Self {
        Self {
            name: DEFAULT_SCHEMA.to_owned(),
        }
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl std::str::FromStr for Schema {
    type Err = SchemaNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_names() {
        assert!(Schema::new("outbox").is_ok());
        assert!(Schema::new("_t_123").is_ok());
        for bad in ["", "Outbox", "1abc", "a-b", "a\"b", &"a".repeat(41)] {
            assert!(Schema::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn renders_and_keys() {
        let s = Schema::new("o2").unwrap();
        assert_eq!(
            s.render("SELECT 1 FROM {{schema}}.t"),
            "SELECT 1 FROM \"o2\".t"
        );
        assert_ne!(s.lock_key("migrate"), s.lock_key("sequence"));
        assert_ne!(s.lock_key("migrate"), Schema::default().lock_key("migrate"));
        assert_eq!(s.lock_key("migrate"), s.lock_key("migrate"));
    }
}
