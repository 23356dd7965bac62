# Helpers the benchmark scripts share; sourced, never run. Before sourcing, set `bench_name`
# (the log prefix), `pg_dir` and `pg_port` (the disposable cluster), and, for the sequencer
# helpers and cleanup, `work` (a scratch directory). After it, `outbox` and `DATABASE_URL`
# come from `bench_cluster`.

log() { echo "$bench_name: $*" >&2; }
die() { log "$*"; exit 1; }

# pg ACTION: scripts/pg.sh on the benchmark's own cluster (never the shared .pg one).
pg() { OUTBOX_PG_DIR=$pg_dir OUTBOX_PG_PORT=$pg_port scripts/pg.sh "$@"; }

# Quiet, unaligned, stop at the first error: results are read back by the scripts.
sql() { psql "$DATABASE_URL" -X -q -t -A -v ON_ERROR_STOP=1 "$@"; }

# bench_cluster: builds the CLI (release) and resets the cluster; sets `outbox` and exports
# DATABASE_URL.
bench_cluster() {
    log "building the CLI (release)"
    cargo build --release -p outbox-cli >&2
    outbox=$root/target/release/outbox
    log "resetting the bench cluster in $pg_dir (port $pg_port)"
    DATABASE_URL=$(pg reset)
    export DATABASE_URL
}

# create_tasks N PROJECTS: the table the writer benchmarks delete from, N rows round-robin over
# PROJECTS projects (so any set of ids touches all of them, as real deletes would), analysed;
# and bench_event_id(), the writer's event ID format (pgbench cannot format timestamps). The
# primary key on id is the index the delete uses; deleted_at is deliberately not indexed, so
# the soft delete can stay a HOT update (the usual shape of such a table).
create_tasks() {
    log "creating $1 tasks over $2 projects"
    sql <<SQL
CREATE TABLE tasks (
    id          text PRIMARY KEY,
    project_id  text NOT NULL,
    title       text NOT NULL,
    column_name text NOT NULL,
    status      text NOT NULL,
    deleted_at  timestamptz
);
INSERT INTO tasks (id, project_id, title, column_name, status)
SELECT 't' || n, 'p' || (n % $2), 'Task number ' || n,
       (ARRAY['backlog', 'todo', 'doing', 'review', 'done'])[1 + n % 5],
       (ARRAY['open', 'blocked', 'closed'])[1 + n % 3]
FROM generate_series(1, $1) AS n;

CREATE FUNCTION bench_event_id(task_id text, deleted_at timestamptz) RETURNS text
LANGUAGE sql STABLE
AS \$\$ SELECT 'task-deleted:' || task_id || ':'
             || to_char(deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') \$\$;
SQL
    sql -c 'VACUUM (ANALYZE) tasks'
}

# The Rust writer's statement (outbox-core's WRITE_TASK_DELETED) as a pgbench command, with the
# event's fields from pgbench variables (project_id, event_type, event_id, task_id, deleted_at,
# payload): the one statement the database runs for a Rust writer, which validates the fields
# in the service.
rust_writer_insert="INSERT INTO outbox.lifecycle_outbox
    (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
     payload_version, payload)
VALUES (:project_id::text, :event_type::text, :event_id::text, :task_id::text,
        :deleted_at::timestamptz, 'bench-writer', 1, :payload::jsonb)
ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING
RETURNING id;"

# wal_flushed LSN: waits until the WAL is flushed up to LSN (the WAL writer does it within
# wal_writer_delay); pg_walinspect refuses to read beyond the flushed end.
wal_flushed() {
    sql -c "DO \$\$ BEGIN
                WHILE pg_current_wal_flush_lsn() < '$1'::pg_lsn LOOP PERFORM pg_sleep(0.02); END LOOP;
            END \$\$"
}

sequencer_pid=

# start_sequencer: `outbox sequence --every 50ms` in the background, output in $work.
start_sequencer() {
    OUTBOX_LOG=warn "$outbox" sequence --every 50ms >"$work/sequencer.out" 2>"$work/sequencer.err" &
    sequencer_pid=$!
    # Give it time to install its signal handlers (before that, SIGINT would kill it).
    sleep 0.5
    kill -0 "$sequencer_pid" 2>/dev/null || { cat "$work/sequencer.err" >&2; die "the sequencer did not start"; }
}

# stop_sequencer: SIGINT, which `outbox sequence --every` honours at any moment (between ticks,
# inside one, or while reconnecting) with exit 0; anything else is a failure.
stop_sequencer() {
    local status=0
    kill -INT "$sequencer_pid" 2>/dev/null || true
    wait "$sequencer_pid" || status=$?
    sequencer_pid=
    [ "$status" -eq 0 ] || { cat "$work/sequencer.err" >&2; die "the sequencer failed (exit $status)"; }
}

# bench_cleanup: the EXIT trap. Runs `bench_cleanup_extra` first when the script defines it,
# then stops the sequencer and the cluster and removes $work; keeps the exit status.
bench_cleanup() {
    local status=$?
    if declare -F bench_cleanup_extra >/dev/null; then bench_cleanup_extra; fi
    if [ -n "$sequencer_pid" ]; then
        kill -TERM "$sequencer_pid" 2>/dev/null || true
        wait "$sequencer_pid" 2>/dev/null || true
    fi
    pg down >/dev/null 2>&1 || log "could not stop the bench cluster in $pg_dir"
    [ -z "${work:-}" ] || rm -rf "$work"
    exit "$status"
}
