//! Argument groups several commands share (clap `#[command(flatten)]`), so that the same
//! option reads and validates the same way everywhere.

use clap::Args;
use outbox_core::admin::Reason;
use outbox_core::{ConsumerId, OperatorName, ProjectId};

/// Which consumer a command is about: `--project` and `--consumer-id`.
#[derive(Debug, Clone, Args)]
pub struct ConsumerRef {
    /// The consumer's project.
    #[arg(long)]
    pub project: ProjectId,
    /// The consumer's explicit, stable ID (never generated).
    #[arg(long)]
    pub consumer_id: ConsumerId,
}

/// Optional narrowing of a listing to one project and one consumer.
#[derive(Debug, Clone, Args)]
pub struct ConsumerFilter {
    /// Only this project.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Only this consumer.
    #[arg(long)]
    pub consumer_id: Option<ConsumerId>,
}

/// Who performs an audited repair and why: `--by` and `--reason`.
#[derive(Debug, Clone, Args)]
pub struct Operator {
    /// Who acts (recorded in the audit trail): A-Z a-z 0-9 . _ : @ -, at most 64.
    #[arg(long, value_name = "OPERATOR")]
    pub by: OperatorName,
    /// Why (one line, at most 200 characters; kept on the row it explains, not in the audit).
    #[arg(long)]
    pub reason: Reason,
}
