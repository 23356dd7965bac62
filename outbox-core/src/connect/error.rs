//! [`ConnectError`]: why settings could not be used or a connection could not be made.

/// Why settings could not be used or a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The settings themselves are wrong (a bad `sslmode`, a malformed URL): retrying cannot
    /// help.
    #[error("{0}")]
    Invalid(String),
    /// A certificate or key file is missing, unreadable or holds no usable PEM data.
    #[error("{0}")]
    File(String),
    /// Connecting failed; the message names the cause where it is known.
    #[error("{message}")]
    Connect {
        /// What went wrong, for the operator.
        message: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}
