//! Fetching the batch after a cursor from the database: a lone consumer's read, growing while
//! reads come back full, and after a full batch the next ones read ahead while this one is
//! dispatched. (A member of a consumer
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

/// The size of a lone consumer's reads: `batch_size` when caught up, doubling while reads come
/// back full (a backlog: fewer round trips and commits per event), up to `max_batch_size`;
/// the first read that comes back short (caught up) returns it to `batch_size`. A crash
/// repeats at most the read batch being dispatched, so at most `max_batch_size` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadSize {
    /// The size when caught up, and the first of a catch-up.
    base: i64,
    /// The largest read.
    max: i64,
    /// The size of the next fresh read.
    next: i64,
}

impl ReadSize {
    /// Reads of `base`, growing up to `max` (raised to `base` if below it).
    pub fn new(base: i64, max: i64) -> Self {
        Self {
            base,
            max: max.max(base),
            next: base,
        }
    }

    /// The size of the next fresh read.
    pub fn next(&self) -> i64 {
        self.next
    }

    /// The read after a full one of `limit`: twice as large, up to the maximum.
    pub fn grown(&self, limit: i64) -> i64 {
        limit.saturating_mul(2).clamp(self.base, self.max)
    }

    /// A read of `limit` came back full: more is waiting, the next read is larger.
    pub fn full(&mut self, limit: i64) {
        self.next = self.grown(limit);
    }

    /// A read came back short: caught up, back to the base size.
    pub fn caught_up(&mut self) {
        self.next = self.base;
    }
}

/// One batch read ahead, on a task of its own; dropping it aborts the read.
struct AheadRead {
    /// The cursor it reads after.
    after: i64,
    /// How many events it asks for.
    limit: i64,
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

/// A lone consumer's read state: the size of its reads and the batches it has read ahead, in
/// cursor order; dropping it aborts them (and starts the next catch-up at the base size).
///
/// After a full batch ending at `n` the next read is after `n`. The one after that is read
/// after `n + limit` of the first: sequences are dense and retained above the cursor, so a
/// full batch after `n` ends exactly there. Each read ahead asks for twice the one before it
/// ([`ReadSize::grown`]). A read whose cursor turns out not to be the consumer's (the batch
/// before it was short, or a failure or a reconciliation came between) is dropped unused, so
/// a wrong guess costs one read and never an event.
pub(crate) struct Prefetch {
    size: ReadSize,
    reads: std::collections::VecDeque<AheadRead>,
}

impl Prefetch {
    /// Nothing read ahead; reads of `base` growing up to `max`.
    fn new(base: i64, max: i64) -> Self {
        Self {
            size: ReadSize::new(base, max),
            reads: std::collections::VecDeque::new(),
        }
    }

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

    /// Caught up: nothing read ahead is kept, and reads return to the base size.
    fn caught_up(&mut self) {
        self.reads.clear();
        self.size.caught_up();
    }

    /// Keeps `READ_AHEAD` reads in flight after a full batch of `limit` that ended at `last`.
    fn extend(&mut self, last: i64, limit: i64, read: impl Fn(i64, i64) -> BoxedRead) {
        self.size.full(limit);
        if self.reads.front().is_some_and(|r| r.after != last) {
            self.reads.clear();
        }
        let (mut after, mut size) = match self.reads.back() {
            Some(r) => (r.after + r.limit, self.size.grown(r.limit)),
            None => (last, self.size.next()),
        };
        while self.reads.len() < READ_AHEAD {
            self.reads.push_back(AheadRead {
                after,
                limit: size,
                handle: tokio_util::task::AbortOnDropHandle::new(tokio::spawn(read(after, size))),
            });
            after += size;
            size = self.size.grown(size);
        }
    }
}

/// A read of one batch, ready to run on a task of its own.
type BoxedRead = std::pin::Pin<Box<dyn Future<Output = Result<Batch, ConsumerError>> + Send>>;

/// A lone consumer's read after `read.cursor`: the batch read ahead if it was read after this
/// cursor and found something, else a fresh read; after a full batch the next ones are read
/// ahead into `ahead`, each larger than the one before up to the maximum read.
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
    let (project, consumer) = (&config.project_id, &config.consumer_id);
    let state = ahead.get_or_insert_with(|| {
        Prefetch::new(config.delivery.batch_size, config.delivery.max_batch_size)
    });
    let mut read_ahead = false;
    // Nothing read after this cursor: whatever was read ahead is dropped (aborted) by `take`.
    let (batch, limit) = match state.take(cursor) {
        Some(prefetch) => {
            let limit = prefetch.limit;
            let batch = prefetch.result().await?;
            if batch.events.is_empty() {
                // Nothing was there then; something may be now.
                state.caught_up();
                let limit = state.size.next();
                let fresh = after(pool, statements, project, consumer, cursor, limit);
                (fresh.await?, limit)
            } else {
                read_ahead = true;
                (batch, limit)
            }
        }
        None => {
            let limit = state.size.next();
            let fresh = after(pool, statements, project, consumer, cursor, limit);
            (fresh.await?, limit)
        }
    };
    // A full batch: read the next ones while this one is dispatched and acknowledged. Events
    // never change once numbered, and the retention floor never passes this consumer's
    // cursor, so the copies cannot go stale.
    match batch.events.last() {
        Some((last, _)) if batch.full => {
            state.extend(last.sequence, limit, |after_cursor, size| {
                Box::pin(after(
                    pool,
                    statements,
                    project,
                    consumer,
                    after_cursor,
                    size,
                ))
            });
        }
        _ => state.caught_up(),
    }
    Ok(Fetched { batch, read_ahead })
}

/// One batch after `cursor`, as a future that owns what it needs, so that it can also run
/// ahead as a [`Prefetch`].
pub(super) fn after(
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

    /// The reads made: the cursor each read after and its size.
    type Seen = Arc<Mutex<Vec<(i64, i64)>>>;

    /// A read-ahead whose reads record the cursor they read after and their size, and return
    /// nothing.
    fn recorder() -> (Seen, impl Fn(i64, i64) -> BoxedRead) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let read = move |after: i64, limit: i64| -> BoxedRead {
            record.lock().unwrap().push((after, limit));
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

    fn cursors(ahead: &Prefetch) -> Vec<(i64, i64)> {
        ahead.reads.iter().map(|r| (r.after, r.limit)).collect()
    }

    #[test]
    fn reads_double_while_full_and_return_to_the_base_when_caught_up() {
        let mut size = ReadSize::new(500, 4000);
        let mut seen = vec![size.next()];
        for _ in 0..5 {
            size.full(size.next());
            seen.push(size.next());
        }
        assert_eq!(seen, [500, 1000, 2000, 4000, 4000, 4000]);
        size.caught_up();
        assert_eq!(size.next(), 500);
        // A maximum that is not a power-of-two multiple of the base caps the last step.
        let mut size = ReadSize::new(3, 10);
        size.full(3);
        size.full(size.next());
        assert_eq!(size.next(), 10);
        // Maximum equal to the base: every read is the base size, as with fixed batches.
        let mut fixed = ReadSize::new(50, 50);
        fixed.full(50);
        assert_eq!(fixed.next(), 50);
        assert_eq!(fixed.grown(50), 50);
        // A maximum below the base is raised to it.
        assert_eq!(ReadSize::new(7, 1).grown(7), 7);
    }

    #[tokio::test]
    async fn keeps_two_reads_ahead_each_a_full_batch_apart_and_each_larger() {
        let (seen, read) = recorder();
        let mut ahead = Prefetch::new(500, 4000);
        ahead.extend(500, 500, &read);
        assert_eq!(cursors(&ahead), [(500, 1000), (1500, 2000)]);
        // The batch after 500 is taken; it was full and ended at 1500: the read after 1500
        // stays, one more goes out, at the maximum.
        assert!(ahead.take(500).is_some_and(|r| r.after == 500));
        ahead.extend(1500, 1000, &read);
        assert_eq!(cursors(&ahead), [(1500, 2000), (3500, 4000)]);
        assert!(ahead.take(1500).is_some());
        ahead.extend(3500, 2000, &read);
        assert_eq!(cursors(&ahead), [(3500, 4000), (7500, 4000)]);
        assert_eq!(
            *seen.lock().unwrap(),
            [(500, 1000), (1500, 2000), (3500, 4000), (7500, 4000)]
        );
        // Caught up: nothing kept, the next fresh read is the base size.
        ahead.caught_up();
        assert!(ahead.reads.is_empty());
        assert_eq!(ahead.size.next(), 500);
    }

    #[tokio::test]
    async fn fixed_batches_read_ahead_as_before() {
        let (seen, read) = recorder();
        let mut ahead = Prefetch::new(500, 500);
        ahead.extend(500, 500, &read);
        assert_eq!(cursors(&ahead), [(500, 500), (1000, 500)]);
        assert!(ahead.take(500).is_some());
        ahead.extend(1000, 500, &read);
        assert_eq!(cursors(&ahead), [(1000, 500), (1500, 500)]);
        assert_eq!(
            *seen.lock().unwrap(),
            [(500, 500), (1000, 500), (1500, 500)]
        );
    }

    #[tokio::test]
    async fn a_wrong_guess_drops_every_read() {
        let (seen, read) = recorder();
        let mut ahead = Prefetch::new(500, 500);
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
        assert_eq!(cursors(&ahead), [(990, 500), (1490, 500)]);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (500, 500),
                (1000, 500),
                (500, 500),
                (1000, 500),
                (990, 500),
                (1490, 500)
            ]
        );
    }
}
