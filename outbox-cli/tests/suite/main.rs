//! The integration tests of lifecycle-outbox, one module per subject, in one test binary.
//!
//! One binary links once and migrates one template database per run (the kit in `tests/src`,
//! package `outbox-tests`, makes every test a database of its own from it), where a binary per
//! file linked 45 times. Tests of different modules now run at the same time in one process, so
//! a test must not rely on running alone: it makes its own databases, ports, roles (named after
//! its database) and clusters, and sets no environment variable of the process. Run one module
//! with `cargo test -p outbox-cli --test suite -- relay::`.
//!
//! The suite belongs to `outbox-cli`, the package of the `outbox` binary that many of its tests
//! run as a process: Cargo builds a package's binaries before it runs its integration tests, so
//! those tests always run the binary of the sources as they are, and the kit finds it beside
//! this test binary (`outbox_tests::process_kit::outbox_binary`).

mod adaptive_batch;
mod audit_trail;
mod cheap_failures;
mod completions;
mod consume_cli;
mod consume_set_cli;
mod consumer;
mod consumer_set;
mod contracts;
mod cursor_positions;
mod dashboard_browser;
mod deployment;
mod embedding;
mod failover;
mod faults;
mod first_hour;
mod lanes;
mod lanes_transactional;
mod lanes_tx_consumer;
mod lease_renewals;
mod migrate;
mod multi_host;
mod operations;
mod ops_kit;
mod partial_ack;
mod pgbouncer;
mod relay;
mod relay_auth;
mod relay_cluster;
mod relay_order;
mod relay_types;
mod relay_zombie;
mod restart;
mod restart_storm;
mod retention;
mod roles;
mod row_security;
mod sequencer;
mod sequencer_election;
mod sequencer_frontier;
mod serve;
mod sharp_edges;
mod shutdown;
mod sql_files;
mod tls;
mod upgrade;
mod verify;
mod writer;

/// The binary the kit runs is the one Cargo built for this suite.
#[test]
fn the_kit_runs_the_outbox_binary_cargo_built_for_this_suite() {
    let canonical = |path: std::path::PathBuf| {
        std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    assert_eq!(
        canonical(outbox_tests::process_kit::outbox_binary()),
        canonical(env!("CARGO_BIN_EXE_outbox").into())
    );
}
