//! A consumer of project `p` with a transactional handler in lanes, for the kill -9 test of
//! `lanes_transactional.rs`: each event's effect is a row of `lane_effects`, written in
//! the handler's transaction after a random 0-3 ms (so a kill lands inside transactions).
//!
//! Arguments: `URL LANES MAX_AHEAD [--exit-when-caught-up]`, one a line in [`ARGS`]; it runs
//! until it is killed, or until it has caught up with the flag. Its process is this test
//! binary started again for the ignored test [`TEST`] alone: a binary target of its own would
//! be a binary of `outbox-cli`.

use std::time::Duration;

use outbox_consumer::{Consumer, HandlerFailure, ObservedEvent, TransactionalHandler};
use outbox_core::connect::ConnectSettings;
use outbox_tests::consumer_kit::{Recorder, fast_config};

/// Writes the event's effect in the handler's transaction.
struct Effects;

impl TransactionalHandler for Effects {
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        event: &ObservedEvent,
    ) -> Result<(), HandlerFailure> {
        let ms = rand::random::<u64>() % 4;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        tx.execute(
            "INSERT INTO lane_effects (sequence, task_id) VALUES ($1, $2)",
            &[&event.sequence, &event.task_id],
        )
        .await
        .map_err(|_| HandlerFailure::new(outbox_consumer::FailureClass::handler_error()))?;
        Ok(())
    }
}

/// The variable that carries the arguments, one a line (libtest reads the command line).
pub const ARGS: &str = "OUTBOX_LANES_TX_CONSUMER_ARGS";

/// The consumer's test, as the command that starts its process names it.
pub const TEST: &str = "lanes_tx_consumer::consumer_process";

/// The consumer, in a process started with [`ARGS`] set; nothing in any other run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the consumer process of lanes_transactional's kill -9 test, started by it"]
async fn consumer_process() {
    let Ok(args) = std::env::var(ARGS) else {
        return;
    };
    let args: Vec<&str> = args.lines().collect();
    let url = args[0];
    let config: tokio_postgres::Config = url.parse().expect("a database URL");
    let mut consumer_config = fast_config("p", "c");
    consumer_config.delivery.lanes = args[1].parse().expect("lanes");
    consumer_config.delivery.max_ahead = args[2].parse().expect("max-ahead");
    consumer_config.delivery.batch_size = 50;
    consumer_config.delivery.max_batch_size = 200;
    consumer_config.delivery.exit_when_caught_up = args.get(3).is_some();
    let lanes = consumer_config.delivery.lanes;
    let pool = ConnectSettings::from_config(config.clone())
        .pool(lanes + 4)
        .expect("pool builds");
    let consumer = Consumer::transactional(
        pool,
        Some(config),
        consumer_config,
        Effects,
        Recorder::default(),
    );
    match consumer
        .run(tokio_util::sync::CancellationToken::new())
        .await
    {
        Ok(_) => {}
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(1);
        }
    }
}
