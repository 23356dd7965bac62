//! How a command fails: a message for the operator and the exit code scripts rely on.

use std::fmt;

/// Exit codes, the same for every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// A runtime failure: database unreachable, statement failed.
    Runtime = 1,
    /// A usage or validation error: the command could never succeed as typed.
    Usage = 2,
    /// The named target does not exist.
    NotFound = 3,
    /// The target exists but is in a state that refuses the operation.
    Conflict = 4,
    /// `status --check`: some health code is not `ok`.
    Unhealthy = 5,
}

/// A failed command.
#[derive(Debug)]
pub struct Failure {
    /// Which exit code.
    pub code: ExitCode,
    /// What to tell the operator.
    pub message: String,
}

impl Failure {
    /// A usage or validation error.
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: ExitCode::Usage,
            message: message.into(),
        }
    }

    /// A runtime failure.
    pub fn runtime(message: impl Into<String>) -> Self {
        Self {
            code: ExitCode::Runtime,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<outbox_core::Error> for Failure {
    fn from(e: outbox_core::Error) -> Self {
        match e {
            outbox_core::Error::Validation(_) => Failure::usage(e.to_string()),
            _ => Failure::runtime(e.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::runtime(format!("database error: {}", outbox_core::describe(&e)))
    }
}

impl From<outbox_core::AdminError> for Failure {
    fn from(e: outbox_core::AdminError) -> Self {
        use outbox_core::AdminError;
        let code = match &e {
            AdminError::Invalid(_) => ExitCode::Usage,
            AdminError::NotFound { .. } => ExitCode::NotFound,
            AdminError::Conflict { .. } => ExitCode::Conflict,
            _ => ExitCode::Runtime,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}
