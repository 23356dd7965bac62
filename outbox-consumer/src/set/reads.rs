//! Reads shared by the consumers of one project: events never change once numbered, so the
//! batch one consumer of the set read from the database serves its siblings too.
//!
//! A project's ten consumers woken by one notification would otherwise send ten identical
//! reads. Here the first reads (the others wait for it on the project's lock) and the rest
//! are served from memory. The copy is trusted only while nothing has signalled the project
//! since it was read: every wake-up source (a notification, a head the poll saw move, a
//! listener reconnect) bumps the project's epoch first, so a consumer woken for newer events
//! never gets the older copy instead of a fresh read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use outbox_core::{ConsumerId, ProjectId};

use crate::error::ConsumerError;
use crate::store::{self, Batch, Decoded, Statements};

/// One project's shared state.
#[derive(Default)]
struct ProjectReads {
    /// Bumped by every wake-up of the project.
    epoch: AtomicU64,
    /// The last batch read, behind the lock that makes one read serve all waiting siblings.
    recent: tokio::sync::Mutex<Option<Recent>>,
}

/// A batch read from the database.
struct Recent {
    /// The project's epoch when the read began.
    epoch: u64,
    /// The cursor it was read after.
    from: i64,
    /// What it returned.
    events: Vec<Decoded>,
    /// Whether it returned fewer than it asked for: then it reached the head of the moment.
    complete: bool,
    /// When the connection it was read on was opened.
    connected_at: std::time::Instant,
}

impl Recent {
    /// Whether this copy answers a read after `cursor`: the cursor lies inside it, and, at
    /// its very end, only if the read reached the head.
    fn covers(&self, cursor: i64) -> bool {
        let last = self.events.last().map_or(self.from, |(e, _)| e.sequence);
        self.from <= cursor && (cursor < last || (cursor == last && self.complete))
    }
}

/// The set's shared reads, by project.
#[derive(Default)]
pub(crate) struct SharedReads {
    projects: Mutex<HashMap<String, Arc<ProjectReads>>>,
}

impl SharedReads {
    fn project(&self, project: &str) -> Arc<ProjectReads> {
        self.projects
            .lock()
            .expect("reads lock")
            .entry(project.to_owned())
            .or_default()
            .clone()
    }

    /// Something new may have been numbered in `project`: copies read before now are stale.
    pub fn signal(&self, project: &str) {
        self.project(project).epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Every project may have changed (the listener reconnected).
    pub fn signal_all(&self) {
        for reads in self.projects.lock().expect("reads lock").values() {
            reads.epoch.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Up to `limit` events of `project` after `cursor`, for `consumer`: from the shared copy
    /// when it is current and covers the cursor, else read from the database (and shared).
    pub async fn read(
        &self,
        pool: &Pool,
        statements: &Statements,
        project: &ProjectId,
        consumer: &ConsumerId,
        cursor: i64,
        limit: i64,
    ) -> Result<Batch, ConsumerError> {
        let reads = self.project(project.as_str());
        let mut recent = reads.recent.lock().await;
        let current = recent
            .as_ref()
            .is_some_and(|r| r.epoch == reads.epoch.load(Ordering::SeqCst) && r.covers(cursor));
        if !current {
            let epoch = reads.epoch.load(Ordering::SeqCst);
            let (rows, connected_at) = {
                // Prepared once per pooled connection where that is safe: this read runs on
                // every wake-up.
                let client = pool.get().await?;
                let connected_at = deadpool_postgres::Object::metrics(&client).created;
                let rows = store::query_hot(
                    &client,
                    statements.cached,
                    &statements.read_batch,
                    &[&project.as_str(), &cursor, &limit],
                )
                .await?;
                (rows, connected_at)
            };
            let events = rows
                .iter()
                .map(|row| store::decode(row, project, consumer, false, 1))
                .collect::<Result<Vec<_>, _>>()?;
            *recent = Some(Recent {
                epoch,
                from: cursor,
                complete: (events.len() as i64) < limit,
                events,
                connected_at,
            });
        }
        let recent = recent.as_ref().expect("filled above");
        let events: Vec<Decoded> = recent
            .events
            .iter()
            .filter(|(e, _)| e.sequence > cursor)
            .take(limit.max(0) as usize)
            .map(|(e, class)| {
                let mut event = e.clone();
                event.consumer_id = consumer.clone();
                (event, class.clone())
            })
            .collect();
        let full = events.len() as i64 == limit || !recent.complete;
        Ok(Batch {
            events,
            full,
            connected_at: recent.connected_at,
        })
    }
}
