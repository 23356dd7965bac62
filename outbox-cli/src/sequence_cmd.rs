//! `outbox sequence`: run the sequencer on its own.
//!
//! `--every` makes the process a candidate in the sequencer election, like every consumer's
//! embedded sequencer: a dedicated sequencer process beside consumers does not add a second
//! poller, and when it dies a consumer takes over. A single drain (no `--every`) takes no part
//! in the election: it numbers what is pending and exits, safe beside a running leader.

use std::time::Duration;

use outbox_core::{ElectedSequencer, MIN_SEQUENCER_LEASE_TTL, Sequencer, owner_token};
use serde::Serialize;

use crate::cli::{Global, SequenceArgs};
use crate::db::DatabaseUrl;
use crate::failure::Failure;
use crate::output::{Render, print};
use crate::shutdown::Shutdown;

/// What one drain numbered.
#[derive(Debug, Serialize)]
struct Drained {
    /// Events numbered.
    numbered: u64,
}

impl Render for Drained {
    fn table(&self) -> String {
        format!("numbered {} event(s)\n", self.numbered)
    }

    fn json(&self) -> impl Serialize + '_ {
        self
    }
}

pub async fn run(global: &Global, args: SequenceArgs) -> Result<(), Failure> {
    let database = global.database()?;
    let sequencer = Sequencer::new(&global.schema)
        .with_batch(args.batch_size)
        .with_session_plan(database.settings.pooler == outbox_core::Pooler::None);
    let Some(every) = args.every else {
        let mut client = database.connect().await?;
        let numbered = sequencer.drain(&mut client).await?;
        return print(args.output, &Drained { numbered });
    };
    if args.lease_ttl < MIN_SEQUENCER_LEASE_TTL {
        return Err(Failure::usage(format!(
            "--lease-ttl {:?} is below the minimum of {MIN_SEQUENCER_LEASE_TTL:?}",
            args.lease_ttl
        )));
    }
    let shutdown = Shutdown::install()?;
    let Some(mut client) = connect(&database, every, &shutdown, true).await? else {
        return Ok(());
    };
    // A paused leader inside its tick is cut off by the server within the lease TTL.
    let sequencer =
        sequencer.with_idle_timeout(args.lease_ttl.min(outbox_core::DEFAULT_IDLE_TIMEOUT));
    let mut elected = ElectedSequencer::new(
        sequencer,
        &global.schema,
        owner_token(),
        args.lease_ttl,
        every,
    );
    let mut delay = Duration::ZERO;
    loop {
        tokio::select! {
            _ = shutdown.requested() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        let result = tokio::select! {
            _ = shutdown.requested() => break,
            result = elected.step(&mut client) => result,
        };
        match result {
            Ok(next) => delay = next,
            Err(e) if !e.is_retryable() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "sequencer step failed; reconnecting");
                match connect(&database, every, &shutdown, false).await? {
                    Some(reconnected) => client = reconnected,
                    None => return Ok(()),
                }
                delay = Duration::ZERO;
            }
        }
    }
    // Hand over at once rather than after the lease runs out.
    elected.release(&client).await;
    Ok(())
}

/// Connects, and while the database is unreachable tries again every `every` (at least every
/// 500 ms) until it answers or shutdown is requested (`None`). The `first` connection fails
/// at once instead, naming the database, so a wrong URL is not retried forever.
async fn connect(
    database: &DatabaseUrl,
    every: Duration,
    shutdown: &Shutdown,
    first: bool,
) -> Result<Option<tokio_postgres::Client>, Failure> {
    loop {
        let attempt = tokio::select! {
            _ = shutdown.requested() => return Ok(None),
            attempt = database.connect() => attempt,
        };
        match attempt {
            Ok(client) => return Ok(Some(client)),
            Err(e) if first => return Err(e),
            Err(_) => {}
        }
        tokio::select! {
            _ = shutdown.requested() => return Ok(None),
            _ = tokio::time::sleep(every.max(Duration::from_millis(500))) => {}
        }
    }
}
