//! `outbox sequence`: run the sequencer on its own.

use outbox_core::Sequencer;

use crate::cli::{Global, SequenceArgs};
use crate::failure::Failure;

pub async fn run(global: &Global, args: SequenceArgs) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let sequencer = Sequencer::new(&global.schema).with_batch(args.batch_size);
    let Some(every) = args.every else {
        let numbered = sequencer.drain(&mut client).await?;
        println!("numbered {numbered} event(s)");
        return Ok(());
    };
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = ticker.tick() => {
                sequencer.drain(&mut client).await?;
            }
        }
    }
}
