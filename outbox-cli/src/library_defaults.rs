//! The CLI's defaults and ranges are the libraries': each command parsed with nothing but its
//! required options builds exactly the settings the library defaults to, and the ranges clap
//! accepts end where the library's ceilings are. A default changed on one side only fails
//! here.

use clap::Parser;
use outbox_consumer::{DeliverySettings, Duties};

use crate::command::{Cli, Command};

fn parse(args: &[&str]) -> Cli {
    let mut line = vec!["outbox"];
    line.extend_from_slice(args);
    Cli::try_parse_from(line).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn refused(args: &[&str]) -> bool {
    let mut line = vec!["outbox"];
    line.extend_from_slice(args);
    Cli::try_parse_from(line).is_err()
}

#[test]
fn a_consumer_run_with_no_options_is_the_library_default() {
    let cli = parse(&["consume", "--project", "p", "--consumer-id", "c"]);
    let Command::Consume(args) = cli.command else {
        panic!("consume")
    };
    let mut delivery = crate::consume_cmd::delivery_settings(&args.options).unwrap();
    args.lanes.apply(&mut delivery).unwrap();
    assert_eq!(
        format!("{delivery:?}"),
        format!("{:?}", DeliverySettings::default())
    );
    let duties = crate::consume_cmd::duties(&cli.global, &args.options).unwrap();
    assert_eq!(format!("{duties:?}"), format!("{:?}", Duties::default()));
}

#[test]
fn the_consumer_ranges_end_at_the_library_ceilings() {
    let consume = |option: &str, value: String| {
        refused(&[
            "consume",
            "--project",
            "p",
            "--consumer-id",
            "c",
            option,
            &value,
        ])
    };
    let ceilings = [
        (
            "--batch-size",
            outbox_consumer::config::MAX_BATCH_SIZE_CEILING,
        ),
        (
            "--max-batch-size",
            outbox_consumer::config::MAX_BATCH_SIZE_CEILING,
        ),
        ("--lanes", outbox_consumer::config::MAX_LANES as i64),
        (
            "--max-attempts",
            i64::from(outbox_consumer::retry::MAX_ATTEMPTS_CEILING),
        ),
    ];
    for (option, ceiling) in ceilings {
        assert!(!consume(option, ceiling.to_string()), "{option} {ceiling}");
        assert!(consume(option, (ceiling + 1).to_string()), "{option} above");
    }
    let floor = outbox_consumer::config::MIN_POOL_SIZE;
    assert!(!consume("--pool-size", floor.to_string()));
    assert!(consume("--pool-size", (floor - 1).to_string()));
}

#[test]
fn serve_with_no_options_is_the_library_default() {
    let cli = parse(&["serve", "--project", "p", "--consumer-id", "c"]);
    let Command::Serve(args) = cli.command else {
        panic!("serve")
    };
    let parsed = crate::serve::server_settings(&args, None);
    let library = outbox_serve::ServerSettings::new(args.consumer_id.clone());
    let figures = |s: &outbox_serve::ServerSettings| {
        (
            s.ring_size,
            s.client_queue,
            s.lagged_grace,
            s.max_clients,
            s.retry_after,
            s.keep_alive,
            s.client_write_interval,
            s.ready_max_poll_age,
            s.dashboard_refresh,
            s.drain_timeout,
            s.header_read_timeout,
            s.allowed_hosts.clone(),
        )
    };
    assert_eq!(figures(&parsed), figures(&library));
}

#[test]
fn status_prune_and_sequence_with_no_options_are_the_library_defaults() {
    let Command::Status(args) = parse(&["status"]).command else {
        panic!("status")
    };
    assert_eq!(
        crate::status_cmd::thresholds(&args),
        outbox_core::admin::HealthThresholds::default()
    );
    let Command::Prune(args) = parse(&["prune"]).command else {
        panic!("prune")
    };
    let library = outbox_core::retention::PruneOptions::default();
    assert_eq!(
        (args.retention, args.batch_size),
        (library.retention, library.batch_size)
    );
    let Command::Sequence(args) = parse(&["sequence", "--every", "50ms"]).command else {
        panic!("sequence")
    };
    assert_eq!(
        (args.lease_ttl, args.batch_size),
        (
            outbox_core::sequencer::DEFAULT_SEQUENCER_LEASE_TTL,
            outbox_core::sequencer::DEFAULT_BATCH
        )
    );
    assert_eq!(
        parse(&["status"]).global.schema,
        outbox_core::Schema::default()
    );
}
