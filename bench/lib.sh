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

# bench_lock DIR: holds DIR.lock (descriptor 9) for the rest of the script, so two runs never
# share a cluster; exits when another run holds it.
bench_lock() {
    exec 9>"$1.lock"
    if ! flock -n 9; then
        log "another run is using $1; set OUTBOX_BENCH_PG_DIR and OUTBOX_BENCH_PG_PORT to use another cluster"
        exit 1
    fi
}

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

# median_of: the median of the numbers on stdin, one a line; "nan" when there are none.
median_of() {
    sort -g | awk '{ x[NR] = $1 } END {
        if (NR == 0) { print "nan"; exit }
        if (NR % 2) print x[(NR + 1) / 2]; else print (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}

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

# start_call NAME STATEMENT: runs a long procedure call in the background on its own session,
# named NAME (the PgQ ticker, a numbering prototype).
start_call() {
    PGAPPNAME=$1 sql -c "$2" >/dev/null 2>"$work/$1.err" &
    background_pid=$!
    sleep 0.3
}

# stop_call NAME: cancels it; anything but the cancellation in its output is a failure.
stop_call() {
    sql -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = '$1'" >/dev/null
    wait "$background_pid" 2>/dev/null || true
    background_pid=
    grep -q 'canceling statement' "$work/$1.err" || { cat "$work/$1.err" >&2; die "$1 failed"; }
}

# hold_start KIND: a session named `<bench>-hold` that holds an old snapshot (`snapshot`:
# REPEATABLE READ after one SELECT) or a transaction ID (`xid`: read committed, one INSERT into
# the bench's `bench_hold` table, then idle in transaction); hold_stop commits it.
hold_start() {
    mkfifo "$work/hold.fifo"
    PGAPPNAME=${bench_name%.sh}-hold psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 \
        <"$work/hold.fifo" >"$work/hold.out" 2>&1 &
    hold_pid=$!
    exec 8>"$work/hold.fifo"
    case "$1" in
        snapshot) echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox.lifecycle_projects;" >&8 ;;
        xid) echo "BEGIN; INSERT INTO bench_hold VALUES (1);" >&8 ;;
    esac
    local held=
    for _ in $(seq 1 100); do
        held=$(sql -c "SELECT coalesce(backend_xmin, backend_xid) FROM pg_stat_activity
                       WHERE application_name = '${bench_name%.sh}-hold' AND state = 'idle in transaction'")
        [ -n "$held" ] && break
        sleep 0.1
    done
    [ -n "$held" ] || { cat "$work/hold.out" >&2; die "the holding session did not start"; }
    log "holding $1 (xmin/xid $held)"
}
hold_stop() {
    echo "COMMIT;" >&8
    exec 8>&-
    wait "$hold_pid" || { cat "$work/hold.out" >&2; die "the holding session failed"; }
    hold_pid=
    rm -f "$work/hold.fifo"
}
