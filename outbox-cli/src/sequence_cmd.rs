//! `outbox sequence`: run the sequencer on its own.

use std::time::Duration;

use outbox_core::Sequencer;
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
    let sequencer = Sequencer::new(&global.schema).with_batch(args.batch_size);
    let Some(every) = args.every else {
        let mut client = database.connect().await?;
        let numbered = sequencer.drain(&mut client).await?;
        return print(args.output, &Drained { numbered });
    };
    let shutdown = Shutdown::install()?;
    let Some(mut client) = connect(&database, every, &shutdown, true).await? else {
        return Ok(());
    };
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.requested() => return Ok(()),
            _ = ticker.tick() => {}
        }
        let result = tokio::select! {
            _ = shutdown.requested() => return Ok(()),
            result = sequencer.drain(&mut client) => result,
        };
        if let Err(e) = result {
            if !e.is_retryable() {
                return Err(e.into());
            }
            tracing::warn!(error = %e, "sequencer tick failed; reconnecting");
            match connect(&database, every, &shutdown, false).await? {
                Some(reconnected) => client = reconnected,
                None => return Ok(()),
            }
        }
    }
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
