//! The metrics this crate records, each a name with its kind and help text, and [`describe`],
//! which gives the help text to the installed recorder. Prometheus tooling (`promtool check
//! metrics`, Grafana's metric browser) expects a `# HELP` line per metric; each crate names and
//! describes the metrics it records (`outbox_serve::metric`, `outbox_relay::metric` likewise),
//! so `/metrics`, the book's table and the rule files in `deploy/` read the same names.

/// What a metric counts: Prometheus' type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of observations, in buckets.
    Histogram,
}

/// A metric: its name, its kind and its help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The name recorded and exported.
    pub name: &'static str,
    /// Its Prometheus type.
    pub kind: Kind,
    /// The `# HELP` text.
    pub help: &'static str,
}

impl Metric {
    /// Gives this metric's help text to the installed recorder (a description given before
    /// one is installed goes nowhere).
    pub fn describe(&self) {
        match self.kind {
            Kind::Counter => metrics::describe_counter!(self.name, self.help),
            Kind::Gauge => metrics::describe_gauge!(self.name, self.help),
            Kind::Histogram => metrics::describe_histogram!(self.name, self.help),
        }
    }
}

/// `outbox_events_delivered_total`.
pub const EVENTS_DELIVERED: Metric = Metric {
    name: "outbox_events_delivered_total",
    kind: Kind::Counter,
    help: "Events a consumer acknowledged, in sequence order.",
};

/// `outbox_delivery_failures_total`.
pub const DELIVERY_FAILURES: Metric = Metric {
    name: "outbox_delivery_failures_total",
    kind: Kind::Counter,
    help: "Failed delivery attempts, by the handler's failure class.",
};

/// `outbox_dead_letters_parked_total`.
pub const DEAD_LETTERS_PARKED: Metric = Metric {
    name: "outbox_dead_letters_parked_total",
    kind: Kind::Counter,
    help: "Events parked as dead letters after their last attempt.",
};

/// `outbox_events_skipped_total`.
pub const EVENTS_SKIPPED: Metric = Metric {
    name: "outbox_events_skipped_total",
    kind: Kind::Counter,
    help: "Events of types the consumer did not declare (--event-types), passed without a handler call.",
};

/// `outbox_history_divergences_total`.
pub const HISTORY_DIVERGENCES: Metric = Metric {
    name: "outbox_history_divergences_total",
    kind: Kind::Counter,
    help: "Times a consumer found its position missing from the database's history (a failover \
         lost a tail, a backup was restored) and reconciled.",
};

/// `outbox_dead_letters`.
pub const DEAD_LETTERS: Metric = Metric {
    name: "outbox_dead_letters",
    kind: Kind::Gauge,
    help: "Unresolved dead letters of a consumer (sampled by the lease holder).",
};

/// `outbox_consumer_lag_events`.
pub const CONSUMER_LAG: Metric = Metric {
    name: "outbox_consumer_lag_events",
    kind: Kind::Gauge,
    help: "Project head minus the consumer's cursor (sampled by the lease holder).",
};

/// `outbox_consumer_cursor`.
pub const CONSUMER_CURSOR: Metric = Metric {
    name: "outbox_consumer_cursor",
    kind: Kind::Gauge,
    help: "The last sequence the consumer acknowledged.",
};

/// `outbox_lanes_busy`.
pub const LANES_BUSY: Metric = Metric {
    name: "outbox_lanes_busy",
    kind: Kind::Gauge,
    help: "Lanes whose handler is running (consumers with more than one lane).",
};

/// `outbox_events_ahead_of_cursor`.
pub const EVENTS_AHEAD_OF_CURSOR: Metric = Metric {
    name: "outbox_events_ahead_of_cursor",
    kind: Kind::Gauge,
    help: "Events handled or parked beyond the cursor and not yet acknowledged (lanes).",
};

/// `outbox_commit_to_dispatch_seconds`.
pub const COMMIT_TO_DISPATCH: Metric = Metric {
    name: "outbox_commit_to_dispatch_seconds",
    kind: Kind::Histogram,
    help: "Seconds from the writer's transaction start to an event's first dispatch.",
};

/// `outbox_unsequenced_events`.
pub const UNSEQUENCED_EVENTS: Metric = Metric {
    name: "outbox_unsequenced_events",
    kind: Kind::Gauge,
    help: "Committed events not numbered yet, in the whole outbox (sampled by a lease holder).",
};

/// `outbox_oldest_unsequenced_seconds`.
pub const OLDEST_UNSEQUENCED: Metric = Metric {
    name: "outbox_oldest_unsequenced_seconds",
    kind: Kind::Gauge,
    help: "Age of the oldest committed event not numbered yet, 0 when none (sampled).",
};

/// `outbox_database_up`.
pub const DATABASE_UP: Metric = Metric {
    name: "outbox_database_up",
    kind: Kind::Gauge,
    help: "1 while this process reaches its database, 0 while it waits for it to come back.",
};

/// `outbox_lease_held`.
pub const LEASE_HELD: Metric = Metric {
    name: "outbox_lease_held",
    kind: Kind::Gauge,
    help: "1 while this process holds the consumer's lease, 0 once it lost or released it.",
};

/// `outbox_lease_generation`.
pub const LEASE_GENERATION: Metric = Metric {
    name: "outbox_lease_generation",
    kind: Kind::Gauge,
    help: "Generation of the consumer's lease this process holds or last held.",
};

/// `outbox_pruned_events_total`.
pub const PRUNED_EVENTS: Metric = Metric {
    name: "outbox_pruned_events_total",
    kind: Kind::Counter,
    help: "Events removed by this process's retention sweeps.",
};

/// `outbox_pruned_dead_letters_total`.
pub const PRUNED_DEAD_LETTERS: Metric = Metric {
    name: "outbox_pruned_dead_letters_total",
    kind: Kind::Counter,
    help: "Settled dead letters removed by this process's retention sweeps.",
};

/// `outbox_retention_floor`.
pub const RETENTION_FLOOR: Metric = Metric {
    name: "outbox_retention_floor",
    kind: Kind::Gauge,
    help: "The project's retention floor after this process's last sweep: every event at or below it is gone.",
};

/// Every metric this crate records.
pub const ALL: &[Metric] = &[
    EVENTS_DELIVERED,
    DELIVERY_FAILURES,
    DEAD_LETTERS_PARKED,
    EVENTS_SKIPPED,
    HISTORY_DIVERGENCES,
    DEAD_LETTERS,
    CONSUMER_LAG,
    CONSUMER_CURSOR,
    LANES_BUSY,
    EVENTS_AHEAD_OF_CURSOR,
    COMMIT_TO_DISPATCH,
    UNSEQUENCED_EVENTS,
    OLDEST_UNSEQUENCED,
    DATABASE_UP,
    LEASE_HELD,
    LEASE_GENERATION,
    PRUNED_EVENTS,
    PRUNED_DEAD_LETTERS,
    RETENTION_FLOOR,
];

/// Describes every metric of [`ALL`] to the installed recorder; call it once a recorder is
/// installed.
pub fn describe() {
    for metric in ALL {
        metric.describe();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prometheus_shaped() {
        let mut names = std::collections::BTreeSet::new();
        for metric in ALL {
            assert!(names.insert(metric.name), "{} twice", metric.name);
            assert!(metric.name.starts_with("outbox_"), "{}", metric.name);
            assert_eq!(
                metric.kind == Kind::Counter,
                metric.name.ends_with("_total"),
                "{}",
                metric.name
            );
            assert!(!metric.help.is_empty());
        }
    }
}
