//! `outbox sequence`: run the sequencer on its own.

use outbox_core::Sequencer;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{Global, SequenceArgs};
use crate::failure::Failure;

pub async fn run(global: &Global, args: SequenceArgs) -> Result<(), Failure> {
    let database = global.database()?;
    let mut client = database.connect().await?;
    let sequencer = Sequencer::new(&global.schema).with_batch(args.batch_size);
    let Some(every) = args.every else {
        let numbered = sequencer.drain(&mut client).await?;
        println!("numbered {numbered} event(s)");
        return Ok(());
    };
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Created once, before the loop, so a signal that arrives during a tick is not lost.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return Err(Failure::runtime("cannot install signal handlers"));
    };
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            _ = ticker.tick() => {
                if let Err(e) = sequencer.drain(&mut client).await {
                    if !e.is_retryable() {
                        return Err(e.into());
                    }
                    tracing::warn!(error = %e, "sequencer tick failed; reconnecting");
                    client = loop {
                        match database.connect().await {
                            Ok(client) => break client,
                            Err(_) => tokio::time::sleep(every.max(std::time::Duration::from_millis(500))).await,
                        }
                    };
                }
            }
        }
    }
}
