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

/// A batch read ahead, on a task of its own; dropping it aborts the read.
pub(crate) struct Prefetch {
    /// The cursor it reads after.
    after: i64,
    handle: tokio_util::task::AbortOnDropHandle<Result<Batch, ConsumerError>>,
}

impl Prefetch {
    fn spawn(
        after: i64,
        read: impl Future<Output = Result<Batch, ConsumerError>> + Send + 'static,
    ) -> Self {
        Self {
            after,
            handle: tokio_util::task::AbortOnDropHandle::new(tokio::spawn(read)),
        }
    }

    /// The batch, or the read's error. The task is aborted only by dropping this, so a join
    /// error is a panic in the read, passed on as one.
    async fn result(self) -> Result<Batch, ConsumerError> {
        match self.handle.await {
            Ok(read) => read,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// A lone consumer's read after `read.cursor`: the batch read ahead if it was read after this
/// cursor and found something, else a fresh read; after a full batch the next one is read
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
    let batch = match ahead.take() {
        Some(prefetch) if prefetch.after == cursor => {
            let batch = prefetch.result().await?;
            if batch.events.is_empty() {
                // Nothing was there then; something may be now.
                after(pool, statements, project, consumer, cursor, limit).await?
            } else {
                read_ahead = true;
                batch
            }
        }
        // Read after another cursor (a failure or a reconciliation came between): dropped,
        // which aborts it.
        _ => after(pool, statements, project, consumer, cursor, limit).await?,
    };
    // A full batch: read the next one while this one is dispatched and acknowledged. Events
    // never change once numbered, and the retention floor never passes this consumer's
    // cursor, so the copy cannot go stale.
    if batch.full {
        if let Some((last, _)) = batch.events.last() {
            let next = after(pool, statements, project, consumer, last.sequence, limit);
            *ahead = Some(Prefetch::spawn(last.sequence, next));
        }
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
