//! The integration tests of lifecycle-outbox, one module per subject, in one test binary.
//!
//! One binary links once and migrates one template database per run (the kit in `tests/src`
//! makes every test a database of its own from it), where a binary per file linked 45 times.
//! Tests of different modules now run at the same time in one process, so a test must not
//! rely on running alone: it makes its own databases, ports, roles (named after its
//! database) and clusters, and sets no environment variable of the process. Run one module
//! with `cargo test -p outbox-tests --test suite -- relay::`.

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
