//! The retention sweep: prunes old, acknowledged events and settled dead letters in bounded
//! batches, keeping the retention floor exact.
//!
//! ## The rule
//! An event of a project is pruned only when all of these hold:
//! - it is older than the retention period (`occurred_at < now() - retention`, default 30 days);
//! - every non-retired consumer of the project has acknowledged it
//!   (`last_acked_sequence >= sequence`). A non-retired consumer with a missing (NULL) cursor
//!   holds back everything: it has not reconciled yet. A retired consumer holds back nothing.
//!   A project with no consumers at all is pruned by age alone: a consumer that appears later
//!   has no cursor and reconciles from the live task set, which needs no history (one started
//!   with `StartFrom::Earliest` falls back to reconciliation once the floor is above 0);
//! - no unresolved dead letter (`dead` or `replay_requested`) of a non-retired consumer refers
//!   to it: a replay needs the event row.
//!
//! Pruning is contiguous per project: a sweep removes sequences `pruned_through + 1 ..= N`
//! where N is the highest sequence such that it and every retained sequence below it satisfy
//! the rule. So an event held back (too young, not acknowledged, or a dead letter's) stops the
//! floor below it, and `lifecycle_project_heads.pruned_through` stays exact: every event at or
//! below it is gone, every event above it is retained.
//!
//! Delivery rows go as well: a `resolved` dead letter once `resolved_at` is older than the
//! retention period, a `replayed` one once its replay (`updated_at`) is (a replay settles a
//! dead letter as a resolution does), and every delivery row of a retired consumer at the
//! next sweep (retirement is the explicit, audited decision to stop caring about them; a
//! reactivated consumer reconciles anyway). Unresolved dead letters of non-retired consumers
//! are kept until they are resolved or their consumer is retired.
//!
//! ## Bounded and safe
//! Every batch (default 500 events, or delivery rows) is its own short transaction: it takes
//! the schema's transaction-level `prune` advisory lock, reads the project's floor, head and
//! cursors, deletes the batch and advances `pruned_through` in the same transaction, and adds
//! to this sweep's `lifecycle-observation:pruned` audit row. So two batches never run at the
//! same time. A second sweep *waits* for the lock (at most 5 s, `lock_timeout`) rather than
//! skipping: sweeps running side by side (the runtimes of a project's consumers, `outbox
//! prune`) interleave batch by batch and split the work, each batch deciding afresh from the
//! floor and cursors it reads under the lock, and every sweep finishes the projects it was
//! asked to sweep (a sweep that skipped on contention could be kept from other projects
//! indefinitely by sweeps of one project). A project (or its delivery rows) with nothing to
//! prune is passed over without taking the lock, so sweeps only meet where there is work.
//! Writers only insert unsequenced rows and the sequencer only numbers them, so neither ever
//! waits on a deleted row; the project-heads row the sequencer also updates is locked by the
//! batch only from its last statement to its commit.
//!
//! ## Modules
//! - [`plan`]: the options and the pure part of the rule: how far a batch may move the floor
//!   judging by head, batch size and cursors ([`plan`]'s `bound`), and what holds it back.
//! - `pruner`: [`Pruner`], the rule applied in the database: statements, the batch
//!   transaction and its lock, the next batch's plan, and the read-only look of `status`.
//! - `batches`: one batch of a project's events or delivery rows, or a dry run of it.
//! - [`sweep`]: [`Sweep`], one sweep in progress, stepped batch by batch.
//! - `report`: [`PruneReport`], [`ProjectPrune`], [`SweepProgress`].
//! - `sql`: the statements.

mod batches;
pub mod plan;
mod pruner;
mod report;
mod sql;
pub mod sweep;

pub use plan::{
    DEFAULT_PRUNE_ACTOR, DEFAULT_PRUNE_BATCH, DEFAULT_RETENTION, HoldBack, MAX_PRUNE_BATCH,
    MAX_RETENTION, PruneOptions, PruneOptionsError,
};
pub use sweep::{ProjectPrune, PruneReport, Pruner, Sweep, SweepProgress};
