//! The help text of every metric the `outbox` binaries export. Prometheus tooling (`promtool
//! check metrics`, Grafana's metric browser) expects a `# HELP` line per metric; the names are
//! recorded where things happen (the runtime, the sweep, `outbox serve`, the relay), and this
//! one list describes them all, so `/metrics`, the README's table and the rule files in
//! `deploy/` read the same names.

/// Describes every metric to the installed recorder; call it once, right after installing
/// one (a description given before that goes nowhere).
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "outbox_events_delivered_total",
        "Events a consumer acknowledged, in sequence order."
    );
    describe_counter!(
        "outbox_delivery_failures_total",
        "Failed delivery attempts, by the handler's failure class."
    );
    describe_counter!(
        "outbox_dead_letters_parked_total",
        "Events parked as dead letters after their last attempt."
    );
    describe_counter!(
        "outbox_events_skipped_total",
        "Events of types the consumer did not declare (--event-types), passed without a handler call."
    );
    describe_counter!(
        "outbox_history_divergences_total",
        "Times a consumer found its position missing from the database's history (a failover \
         lost a tail, a backup was restored) and reconciled."
    );
    describe_gauge!(
        "outbox_dead_letters",
        "Unresolved dead letters of a consumer (sampled by the lease holder)."
    );
    describe_gauge!(
        "outbox_consumer_lag_events",
        "Project head minus the consumer's cursor (sampled by the lease holder)."
    );
    describe_gauge!(
        "outbox_consumer_cursor",
        "The last sequence the consumer acknowledged."
    );
    describe_gauge!(
        "outbox_lanes_busy",
        "Lanes whose handler is running (consumers with more than one lane)."
    );
    describe_gauge!(
        "outbox_events_ahead_of_cursor",
        "Events handled or parked beyond the cursor and not yet acknowledged (lanes)."
    );
    describe_histogram!(
        "outbox_commit_to_dispatch_seconds",
        "Seconds from the writer's transaction start to an event's first dispatch."
    );
    describe_gauge!(
        "outbox_unsequenced_events",
        "Committed events not numbered yet, in the whole outbox (sampled by a lease holder)."
    );
    describe_gauge!(
        "outbox_oldest_unsequenced_seconds",
        "Age of the oldest committed event not numbered yet, 0 when none (sampled)."
    );
    describe_gauge!(
        "outbox_database_up",
        "1 while this process reaches its database, 0 while it waits for it to come back."
    );
    describe_gauge!(
        "outbox_lease_held",
        "1 while this process holds the consumer's lease, 0 once it lost or released it."
    );
    describe_gauge!(
        "outbox_lease_generation",
        "Generation of the consumer's lease this process holds or last held."
    );
    describe_counter!(
        "outbox_pruned_events_total",
        "Events removed by this process's retention sweeps."
    );
    describe_counter!(
        "outbox_pruned_dead_letters_total",
        "Settled dead letters removed by this process's retention sweeps."
    );
    describe_gauge!(
        "outbox_retention_floor",
        "The project's retention floor after this process's last sweep: every event at or below it is gone."
    );
    describe_gauge!(
        "outbox_sse_clients",
        "Server-sent-event clients connected to the project's stream."
    );
    describe_counter!(
        "outbox_sse_dropped_total",
        "SSE clients disconnected because their queue overflowed (they resume on reconnect)."
    );
    describe_counter!(
        "outbox_relay_out_of_order_total",
        "Messages JetStream stored after a later one of the same project (logged at error level)."
    );
}
