//! Fetching the batch after a cursor from the database: a lone consumer's read, and after a
//! full batch the next one read ahead while this one is dispatched. (A member of a consumer
//! set fetches through the set's shared reads instead.)

use deadpool_postgres::Pool;
use outbox_core::{ConsumerId, ProjectId};

use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::store::{self, Batch, Statements};

/// A read of the batch after a cursor.
pub(crate) struct ReadAfter<'a> {
    /// The consumer's pool.
    pub pool: &'a Pool,
    /// The run's statements.
    pub statements: &'a Statements,
    /// The consumer's project, ID and batch size.
    pub config: &'a ConsumerConfig,
    /// The cursor the batch follows.
    pub cursor: i64,
}

/// What a read returned.
pub(crate) struct Fetched {
    /// The batch.
    pub batch: Batch,
    /// Whether it was read ahead, and so may predate events numbered since.
    pub read_ahead: bool,
}

/// How many batches a lone consumer keeps read ahead while it dispatches one. Two: reading a
/// batch (the server's scan and row output, then the decoding) takes longer than dispatching
/// and acknowledging one with a light handler, so with one read in flight a catch-up waits
/// on every read (about half a millisecond of each 500-event batch on a 2-core host); with
/// two, each read has two batches' time.
const READ_AHEAD: usize = 2;

/// One batch read ahead, on a task of its own; dropping it aborts the read.
struct AheadRead {
    /// The cursor it reads after.
    after: i64,
    handle: tokio_util::task::AbortOnDropHandle<Result<Batch, ConsumerError>>,
}

impl AheadRead {
    /// The batch, or the read's error. The task is aborted only by dropping this, so a join
    /// error is a panic in the read, passed on as one.
    async fn result(self) -> Result<Batch, ConsumerError> {
        match self.handle.await {
            Ok(read) => read,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// The batches a lone consumer has read ahead, in cursor order; dropping it aborts them.
///
/// After a full batch ending at `n` the next read is after `n`. The one after that is read
/// after `n + batch`: sequences are dense and retained above the cursor, so a full batch
/// after `n` ends exactly there. A read whose cursor turns out not to be the consumer's
/// (the batch before it was short, or a failure or a reconciliation came between) is
/// dropped unused, so a wrong guess costs one read and never an event.
#[derive(Default)]
pub(crate) struct Prefetch {
    reads: std::collections::VecDeque<AheadRead>,
}

impl Prefetch {
    /// The read after `cursor` when it is the first waiting (those behind it stay);
    /// otherwise every read is dropped.
    fn take(&mut self, cursor: i64) -> Option<AheadRead> {
        match self.reads.front() {
            Some(read) if read.after == cursor => self.reads.pop_front(),
            _ => {
                self.reads.clear();
                None
            }
        }
    }

    /// Keeps `READ_AHEAD` reads in flight after a full batch that ended at `last`.
    fn extend(&mut self, last: i64, limit: i64, read: impl Fn(i64) -> BoxedRead) {
        if self.reads.front().is_some_and(|r| r.after != last) {
            self.reads.clear();
        }
        let mut after = self.reads.back().map_or(last, |r| r.after + limit);
        while self.reads.len() < READ_AHEAD {
            self.reads.push_back(AheadRead {
                after,
                handle: tokio_util::task::AbortOnDropHandle::new(tokio::spawn(read(after))),
            });
            after += limit;
        }
    }
}

/// A read of one batch, ready to run on a task of its own.
type BoxedRead = std::pin::Pin<Box<dyn Future<Output = Result<Batch, ConsumerError>> + Send>>;

/// A lone consumer's read after `read.cursor`: the batch read ahead if it was read after this
/// cursor and found something, else a fresh read; after a full batch the next ones are read
/// ahead into `ahead`.
pub(super) async fn alone(
    read: ReadAfter<'_>,
    ahead: &mut Option<Prefetch>,
) -> Result<Fetched, ConsumerError> {
    let ReadAfter {
        pool,
        statements,
        config,
        cursor,
    } = read;
    let (project, consumer, limit) = (
        &config.project_id,
        &config.consumer_id,
        config.delivery.batch_size,
    );
    let mut read_ahead = false;
    let batch = match ahead.as_mut().and_then(|reads| reads.take(cursor)) {
        Some(prefetch) => {
            let batch = prefetch.result().await?;
            if batch.events.is_empty() {
                // Nothing was there then; something may be now.
                *ahead = None;
                after(pool, statements, project, consumer, cursor, limit).await?
            } else {
                read_ahead = true;
                batch
            }
        }
        // Nothing read after this cursor: whatever was read ahead is dropped (aborted).
        None => {
            *ahead = None;
            after(pool, statements, project, consumer, cursor, limit).await?
        }
    };
    // A full batch: read the next ones while this one is dispatched and acknowledged. Events
    // never change once numbered, and the retention floor never passes this consumer's
    // cursor, so the copies cannot go stale.
    if batch.full {
        if let Some((last, _)) = batch.events.last() {
            ahead
                .get_or_insert_default()
                .extend(last.sequence, limit, |after_cursor| {
                    Box::pin(after(
                        pool,
                        statements,
                        project,
                        consumer,
                        after_cursor,
                        limit,
                    ))
                });
        }
    } else {
        *ahead = None;
    }
    Ok(Fetched { batch, read_ahead })
}

/// One batch after `cursor`, as a future that owns what it needs, so that it can also run
/// ahead as a [`Prefetch`].
fn after(
    pool: &Pool,
    statements: &Statements,
    project: &ProjectId,
    consumer: &ConsumerId,
    cursor: i64,
    limit: i64,
) -> impl Future<Output = Result<Batch, ConsumerError>> + Send + 'static {
    let (read_batch, cached) = (statements.read_batch.clone(), statements.cached);
    let pool = pool.clone();
    let (project, consumer) = (project.clone(), consumer.clone());
    async move {
        let client = pool.get().await?;
        let connected_at = deadpool_postgres::Object::metrics(&client).created;
        let rows = store::query_hot(
            &client,
            cached,
            &read_batch,
            &[&project.as_str(), &cursor, &limit],
        )
        .await?;
        drop(client);
        let events = rows
            .iter()
            .map(|row| store::decode(row, &project, &consumer, false, 1))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Batch {
            full: events.len() as i64 == limit,
            events,
            connected_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A read-ahead whose reads record the cursor they read after and return nothing.
    fn recorder() -> (Arc<Mutex<Vec<i64>>>, impl Fn(i64) -> BoxedRead) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let read = move |after: i64| -> BoxedRead {
            record.lock().unwrap().push(after);
            Box::pin(async {
                Ok(Batch {
                    events: Vec::new(),
                    full: false,
                    connected_at: std::time::Instant::now(),
                })
            })
        };
        (seen, read)
    }

    fn cursors(ahead: &Prefetch) -> Vec<i64> {
        ahead.reads.iter().map(|r| r.after).collect()
    }

    #[tokio::test]
    async fn keeps_two_reads_ahead_each_a_full_batch_apart() {
        let (seen, read) = recorder();
        let mut ahead = Prefetch::default();
        ahead.extend(500, 500, &read);
        assert_eq!(cursors(&ahead), [500, 1000]);
        // The batch after 500 is taken; it was full and ended at 1000: the read after 1000
        // stays, one more goes out.
        assert!(ahead.take(500).is_some_and(|r| r.after == 500));
        ahead.extend(1000, 500, &read);
        assert_eq!(cursors(&ahead), [1000, 1500]);
        assert_eq!(*seen.lock().unwrap(), [500, 1000, 1500]);
    }

    #[tokio::test]
    async fn a_wrong_guess_drops_every_read() {
        let (seen, read) = recorder();
        let mut ahead = Prefetch::default();
        ahead.extend(500, 500, &read);
        // The cursor is elsewhere (a batch with a failure, a reconciliation): nothing read
        // ahead is used.
        assert!(ahead.take(700).is_none());
        assert!(ahead.reads.is_empty());
        // A full batch that did not end where the guess said (a gap): the reads restart
        // from its end.
        ahead.extend(500, 500, &read);
        assert!(ahead.take(500).is_some());
        ahead.extend(990, 500, &read);
        assert_eq!(cursors(&ahead), [990, 1490]);
        assert_eq!(*seen.lock().unwrap(), [500, 1000, 500, 1000, 990, 1490]);
    }
}
