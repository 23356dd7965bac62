//! The admin token: admin actions (replay, resolve, retire) exist only when the server has
//! one; it travels in the `Authorization: Bearer` header, never in a cookie or a URL, and the
//! actions are credited to the operator name configured with it.

use outbox_core::OperatorName;
use sha2::Digest;
use subtle::ConstantTimeEq;

/// Admin actions' credentials: the token clients must present, and whom to credit.
pub struct AdminAuth {
    /// SHA-256 of the token: presented tokens are compared by digest, so the comparison
    /// takes the same time whatever their length.
    token_digest: [u8; 32],
    /// Recorded as the actor of replay requests, resolutions and retirements.
    pub operator: OperatorName,
}

impl AdminAuth {
    /// Credentials for `token`, credited to `operator`.
    pub fn new(token: &str, operator: OperatorName) -> Self {
        Self {
            token_digest: digest(token),
            operator,
        }
    }

    /// Whether `presented` is the token, compared in constant time.
    pub(crate) fn accepts(&self, presented: &str) -> bool {
        digest(presented).ct_eq(&self.token_digest).into()
    }
}

fn digest(text: &str) -> [u8; 32] {
    sha2::Sha256::digest(text.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        let auth = AdminAuth::new("s3cret", OperatorName::new("alice").unwrap());
        assert!(auth.accepts("s3cret"));
        assert!(!auth.accepts("s3cret "));
        assert!(!auth.accepts(""));
    }
}
