//! What every long-running lifecycle-outbox service shares, whether it prints events
//! (`outbox consume`), fans them out over HTTP (`outbox-serve`) or relays them to NATS
//! (`outbox-relay`): the JSON lines that describe events.

#![forbid(unsafe_code)]

pub mod lines;
