//! What a sweep did, or is doing: [`PruneReport`], [`ProjectPrune`], [`SweepProgress`].

use serde::Serialize;

use super::plan::HoldBack;

/// What a sweep did (or, in a dry run, would do) to one project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProjectPrune {
    /// The project.
    pub project_id: String,
    /// Its head when last looked at.
    pub head: i64,
    /// The retention floor before the sweep.
    pub floor_before: i64,
    /// The retention floor after the sweep (would-be floor in a dry run).
    pub floor: i64,
    /// Events removed (would be removed).
    pub events_pruned: u64,
    /// Delivery rows removed (would be removed): settled dead letters past retention and the
    /// rows of retired consumers.
    pub dead_letters_pruned: u64,
    /// Why the floor stops below the head; `None` when it reached the head (or the sweep
    /// stopped before deciding).
    pub held_by: Option<HoldBack>,
}

/// What a sweep did. See [`Pruner`](crate::retention::Pruner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Nothing was deleted; the figures say what would have been.
    pub dry_run: bool,
    /// The retention period, in seconds.
    pub retention_secs: u64,
    /// Events (or delivery rows) per batch.
    pub batch_size: i64,
    /// Every selected project was swept to the end (false when the sweep was stopped early).
    pub complete: bool,
    /// Events removed in all projects.
    pub events_pruned: u64,
    /// Delivery rows removed in all projects.
    pub dead_letters_pruned: u64,
    /// Per project, in project order; a project the sweep stopped inside is included.
    pub projects: Vec<ProjectPrune>,
}

/// Where a running sweep is, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepProgress {
    /// Projects finished.
    pub projects_done: usize,
    /// Projects selected (0 until listed).
    pub projects_total: usize,
    /// The project being swept, with its current floor and head.
    pub current: Option<(String, i64, i64)>,
    /// Events removed so far.
    pub events_pruned: u64,
    /// Delivery rows removed so far.
    pub dead_letters_pruned: u64,
}
