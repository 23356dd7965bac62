//! `outbox sequence`: run the sequencer on its own.
//!
//! `--every` makes the process a candidate in the sequencer election, like every consumer's
//! embedded sequencer: a dedicated sequencer process beside consumers does not add a second
//! poller, and when it dies a consumer takes over. A single drain (no `--every`) takes no part
//! in the election: it numbers what is pending and exits, safe beside a running leader.
//!
//! With `--every` an unavailable database is waited for, at the start as later (see
//! `db::connect_waiting`); a single drain fails at once, like every one-shot command.

use std::time::Duration;

use outbox_core::internal::owner_token;
use outbox_core::sequencer::{ElectedSequencer, MIN_SEQUENCER_LEASE_TTL, Sequencer};
use serde::Serialize;

use crate::cli::{Global, SequenceArgs};
use crate::db::connect_waiting;
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
    if args.every.is_some() && args.lease_ttl < MIN_SEQUENCER_LEASE_TTL {
        return Err(Failure::usage(format!(
            "{} is too short: the sequencer lease lasts at least {}",
            crate::cli::flag_value("lease_ttl", &crate::cli::human(args.lease_ttl)),
            crate::cli::human(MIN_SEQUENCER_LEASE_TTL)
        )));
    }
    if let Some(every) = args.every {
        crate::cli::check_min_tick_pause(args.min_tick_pause, "every", every)
            .map_err(Failure::usage)?;
    }
    let database = global.database()?;
    let sequencer = Sequencer::new(&global.schema).with_batch(args.batch_size);
    let Some(every) = args.every else {
        let mut client = database.connect().await?;
        let numbered = sequencer.drain(&mut client).await?;
        return print(args.output, &Drained { numbered });
    };
    let shutdown = Shutdown::install()?;
    let availability = outbox_consumer::outage::Availability::new();
    availability.set_give_up_after(args.give_up_after);
    let Some(mut client) = connect_waiting(&database, &availability, &shutdown.token()).await?
    else {
        return Ok(());
    };
    let mut elected = ElectedSequencer::new(
        sequencer,
        &global.schema,
        owner_token(),
        args.lease_ttl,
        every,
    )
    .with_max_tick_pause(args.max_tick_pause)
    .with_min_tick_pause(args.min_tick_pause);
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
                // An unavailable database is said once (and may end the wait with
                // --give-up-after); the reconnect below waits it out.
                if e.is_outage() {
                    availability
                        .unreachable(&e)
                        .map_err(|gave_up| Failure::runtime(gave_up.to_string()))?;
                } else {
                    tracing::warn!(error = %e, "sequencer step failed; reconnecting");
                }
                match connect_waiting(&database, &availability, &shutdown.token()).await? {
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
