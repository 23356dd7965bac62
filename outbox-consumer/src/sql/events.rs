//! Reads of the events (`lifecycle_outbox`), the projects' heads and floors
//! (`lifecycle_project_heads`) and the registered contracts: batches, ranges for followers,
//! the unsequenced backlog, a set's poll and the gauges.

/// Whether project `$1` has committed events still waiting for a number, read from the
/// sequencer's frontier (migration 0010): what it has not numbered yet, however old the
/// oldest snapshot is.
///
/// The frontier's work is read in its `(xid, id)` order, which only the frontier index yields
/// without a sort, and the project is matched outside that subquery (`OFFSET 0` keeps the
/// filter from being pushed into it). Statistics taken during a backlog make
/// `sequence IS NULL` look common; with both conditions on the table, the planner then answers
/// with a sequential scan of the whole table (for a project holding most of it) or a walk of
/// the project's whole history through the `(project_id, event_id)` key (for a small one),
/// even when nothing waits. During a real backlog this reads the work up to the project's
/// first waiting event.
pub const HAS_UNSEQUENCED: &str = "
SELECT EXISTS (SELECT FROM (SELECT project_id FROM {{schema}}.lifecycle_outbox_unsequenced
                            OFFSET 0) AS work
               WHERE project_id = $1) AS waiting";

/// The project's head and retention floor (zero for a project with no events yet).
pub const PROJECT_BOUNDS: &str = "
SELECT COALESCE(max(head_sequence), 0) AS head_sequence,
       COALESCE(max(pruned_through), 0) AS pruned_through
FROM {{schema}}.lifecycle_project_heads
WHERE project_id = $1";

/// Every registered contract's type and major (a consumer's declared types are checked
/// against them at its start).
pub const CONTRACTS: &str = "
SELECT event_type, major FROM {{schema}}.lifecycle_event_contracts";

/// Up to `$3` sequenced events after cursor `$2`, in order.
pub const READ_BATCH: &str = concat!(
    "
SELECT ",
    event_columns!(),
    "
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2
ORDER BY o.sequence
LIMIT $3"
);

/// A consumer set's fallback poll, one statement for all its consumers: the head of every
/// project in `$1` (every project with a head when `$1` is NULL, which is how a set following
/// all projects discovers new ones), with the consumers among `$2` that have a dead letter
/// waiting for replay.
pub const POLL_SET: &str = "
SELECT h.project_id, h.head_sequence,
       ARRAY(SELECT DISTINCT d.consumer_id
             FROM {{schema}}.lifecycle_deliveries AS d
             WHERE d.project_id = h.project_id AND d.consumer_id = ANY($2::text[])
               AND d.state = 'replay_requested') AS replay_requested
FROM {{schema}}.lifecycle_project_heads AS h
WHERE $1::text[] IS NULL OR h.project_id = ANY($1::text[])";

/// Retained events `$2 < sequence <= $3`, at most `$4`, in order: read-only history for
/// ephemeral followers (SSE clients), which own no cursor. Events consumer `$5` parked
/// without handling them (dead, waiting for a replay, or resolved by hand) are left out: the
/// followers see what that consumer handled.
pub const READ_RANGE: &str = concat!(
    "
SELECT ",
    event_columns!(),
    "
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2 AND o.sequence <= $3
  AND NOT EXISTS (
      SELECT 1 FROM {{schema}}.lifecycle_deliveries AS d
      WHERE d.project_id = o.project_id AND d.consumer_id = $5 AND d.event_id = o.event_id
        AND d.state IN ('dead', 'replay_requested', 'resolved'))
ORDER BY o.sequence
LIMIT $4"
);

/// The figures behind the runtime's gauges, in one round trip: head, this consumer's cursor,
/// its dead letters, and the unsequenced backlog of the whole outbox with the age of its
/// oldest event (the sequencer is shared by every project). Both come from one read of the
/// frontier's work (migration 0010), in the order only the frontier index yields without a
/// sort: a bare `count(*) ... WHERE sequence IS NULL` is answered with a sequential scan of
/// the whole table once statistics taken during a backlog make unsequenced rows look common,
/// even when nothing waits.
pub const GAUGES: &str = "
SELECT COALESCE((SELECT head_sequence FROM {{schema}}.lifecycle_project_heads
                 WHERE project_id = $1), 0) AS head,
       (SELECT last_acked_sequence FROM {{schema}}.lifecycle_consumer_cursors
        WHERE project_id = $1 AND consumer_id = $2) AS cursor,
       (SELECT count(*) FROM {{schema}}.lifecycle_deliveries
        WHERE project_id = $1 AND consumer_id = $2 AND state = 'dead') AS dead_letters,
       backlog.unsequenced, backlog.oldest_unsequenced
FROM (SELECT count(*) AS unsequenced,
             GREATEST(extract(epoch FROM now() - min(occurred_at)), 0)::float8
                 AS oldest_unsequenced
      FROM {{schema}}.lifecycle_outbox_unsequenced) AS backlog";

/// Where a follower that owns no cursor (an SSE client) may resume after sequence `$2`, in
/// one snapshot: the project's head and floor, and the identity of the retained event at `$2`
/// (NULL when none has that number), which the follower's ID is checked against.
pub const RESUME_POINT: &str = "
SELECT COALESCE(max(h.head_sequence), 0) AS head_sequence,
       COALESCE(max(h.pruned_through), 0) AS pruned_through,
       (SELECT o.event_id FROM {{schema}}.lifecycle_outbox AS o
        WHERE o.project_id = $1 AND o.sequence = $2) AS event_at_position
FROM {{schema}}.lifecycle_project_heads AS h
WHERE h.project_id = $1";

/// The identity of event `$2` of project `$1` (none when no retained event has that number).
pub const EVENT_AT: &str = "
SELECT event_id FROM {{schema}}.lifecycle_outbox WHERE project_id = $1 AND sequence = $2";
