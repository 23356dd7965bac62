//! How a command fails: a message for the operator and the exit code scripts rely on.

use std::fmt;
use std::sync::OnceLock;

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

impl Failure {
    /// Prints the final line on stderr: `error: MESSAGE`, or under `--log-format json` one
    /// JSON object shaped like the log lines before it (`timestamp`, `level`, `fields` with
    /// `message` and `exit_code`, `target`), so a log collector parses the last line too.
    pub fn report(&self, json: bool) {
        match json {
            false => eprintln!("error: {self}"),
            true => eprintln!(
                "{}",
                serde_json::json!({
                    "timestamp": chrono::Utc::now()
                        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                    "level": "ERROR",
                    "fields": {"message": self.message, "exit_code": self.code as u8},
                    "target": "outbox",
                })
            ),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Who this process connects as, what the command does and whether it changes what every
/// project shares, for permission errors.
static PERMISSION_CONTEXT: OnceLock<(String, &'static str, bool)> = OnceLock::new();

/// Records the connecting role and the command's action (once, before the command runs), so
/// that a refused privilege (SQLSTATE 42501) reads "permission denied: role R may not ...".
/// `spans_projects`: the command changes what every project shares (the contract registry),
/// so row security lets only a role bound to every project (`*`) run it.
pub fn set_permission_context(role: String, action: &'static str, spans_projects: bool) {
    let _ = PERMISSION_CONTEXT.set((role, action, spans_projects));
}

/// The permission-denied failure for `e`, if a statement was refused for lack of a privilege
/// (SQLSTATE 42501) anywhere in its chain of causes.
pub fn permission_denied(e: &(dyn std::error::Error + 'static)) -> Option<Failure> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = current {
        let refused = error
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|e| e.as_db_error())
            .filter(|db| db.code() == &tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE);
        if let Some(db) = refused {
            let (role, action, spans_projects) = PERMISSION_CONTEXT
                .get()
                .map(|(r, a, s)| (r.as_str(), *a, *s))
                .unwrap_or(("(this role)", "do this", false));
            // Row security refuses with the same SQLSTATE: there the role has its privileges,
            // and what it lacks is a binding to the project (or, for what every project
            // shares, to all of them: its audit row belongs to no one project).
            if db.message().contains("row-level security") && spans_projects {
                return Some(Failure::runtime(format!(
                    "permission denied: role {role} may not {action} ({}): event contracts \
                     are shared by every project, so under row security only a role bound to \
                     every project changes them; add a row (role_name, project_id) = \
                     ('{role}', '*') to the schema's lifecycle_role_projects table, or run it \
                     as an operator bound to '*' (see docs/src/deploying.md, Binding roles to \
                     projects)",
                    db.message()
                )));
            }
            if db.message().contains("row-level security") {
                return Some(Failure::runtime(format!(
                    "permission denied: role {role} may not {action} for this project ({}): \
                     row security binds each role to the projects listed for it; add a row \
                     (role_name, project_id) = ('{role}', 'PROJECT') to the schema's \
                     lifecycle_role_projects table (see docs/src/deploying.md, Binding roles to projects)",
                    db.message()
                )));
            }
            return Some(Failure::runtime(format!(
                "permission denied: role {role} may not {action} ({}); grant it the role \
                 this process needs (see docs/src/deploying.md, Roles)",
                db.message()
            )));
        }
        current = error.source();
    }
    None
}

impl From<outbox_core::Error> for Failure {
    fn from(e: outbox_core::Error) -> Self {
        if let Some(denied) = permission_denied(&e) {
            return denied;
        }
        match e {
            outbox_core::Error::Validation(_) => Failure::usage(e.to_string()),
            _ => Failure::runtime(e.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(denied) = permission_denied(&e) {
            return denied;
        }
        Failure::runtime(format!(
            "database error: {}",
            outbox_core::error::describe(&e)
        ))
    }
}

impl From<outbox_core::admin::AdminError> for Failure {
    fn from(e: outbox_core::admin::AdminError) -> Self {
        use outbox_core::admin::AdminError;
        if let Some(denied) = permission_denied(&e) {
            return denied;
        }
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
