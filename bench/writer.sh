#!/usr/bin/env bash
# Writer-cost benchmark: what does recording `task:deleted` in the delete transaction cost?
#
#   bench/writer.sh                   full run: 10 s per pgbench run, 3 interleaved repetitions
#   BENCH_QUICK=1 bench/writer.sh     smoke run: 3 s per run, 1 repetition
#
# Environment:
#   BENCH_SECONDS          seconds per pgbench run (default 10; 3 with BENCH_QUICK=1)
#   BENCH_REPS             repetitions of each (a, b) pair (default 3; 1 with BENCH_QUICK=1)
#   BENCH_CLIENTS          client counts (default "1 8 32")
#   BENCH_TASKS            rows in the tasks table (default 1000000)
#   BENCH_BACKLOG          events in the sequencer backlog (default 1000000)
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54331)
#
# It resets its own disposable cluster (never the shared .pg one), so it can be run at any
# time. The markdown report goes to stdout and to bench/RESULTS-writer.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
    seconds=${BENCH_SECONDS:-3}
    reps=${BENCH_REPS:-1}
else
    seconds=${BENCH_SECONDS:-10}
    reps=${BENCH_REPS:-3}
fi
clients_list=${BENCH_CLIENTS:-"1 8 32"}
n_tasks=${BENCH_TASKS:-1000000}
n_backlog=${BENCH_BACKLOG:-1000000}
n_projects=64
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench}
pg_port=${OUTBOX_BENCH_PG_PORT:-54331}
results_file=$root/bench/RESULTS-writer.md
cores=$(nproc)

log() { echo "writer.sh: $*" >&2; }

pg() { OUTBOX_PG_DIR=$pg_dir OUTBOX_PG_PORT=$pg_port scripts/pg.sh "$@"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-writer-bench.XXXXXX")
sequencer_pid=
cleanup() {
    local status=$?
    if [ -n "$sequencer_pid" ]; then
        kill -INT "$sequencer_pid" 2>/dev/null || true
        wait "$sequencer_pid" 2>/dev/null || true
    fi
    pg down >/dev/null 2>&1 || log "could not stop the bench cluster in $pg_dir"
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- cluster and binary --------------------------------------------------------------------

log "building the CLI (release)"
cargo build --release -p outbox-cli >&2
outbox=$root/target/release/outbox

log "resetting the bench cluster in $pg_dir (port $pg_port)"
DATABASE_URL=$(pg reset)
export DATABASE_URL
# Quiet, unaligned, stop at the first error: results are read back by the script.
sql() { psql "$DATABASE_URL" -X -q -t -A -v ON_ERROR_STOP=1 "$@"; }

# --- data ----------------------------------------------------------------------------------

log "creating $n_tasks tasks over $n_projects projects"
# Round-robin projects, so any random id range touches all of them, as real deletes would.
# The primary key on id is the index the delete uses; deleted_at itself is deliberately not
# indexed, so a soft delete can stay a HOT update (the common shape of such a table).
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
SELECT 't' || n,
       'p' || (n % $n_projects),
       'Task number ' || n,
       (ARRAY['backlog', 'todo', 'doing', 'review', 'done'])[1 + n % 5],
       (ARRAY['open', 'blocked', 'closed'])[1 + n % 3]
FROM generate_series(1, $n_tasks) AS n;
SQL
sql -c 'VACUUM (ANALYZE) tasks'

log "migrating the outbox schema"
"$outbox" migrate >&2

# --- pgbench scripts -----------------------------------------------------------------------

# (a) The bare soft delete: three round trips, like an application's own transaction.
cat >"$work/bare.sql" <<SQL
\set n random(1, $n_tasks)
BEGIN;
UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n::text AND deleted_at IS NULL;
COMMIT;
SQL

# (b) The same delete plus the SQL writer, in the same transaction. The UPDATE's RETURNING is
# wrapped in an aggregate so it always yields one row: \gset aborts the client on zero rows,
# and a random id that was already deleted must stay a harmless no-op (as in (a)), not an
# event. One extra round trip (the writer call), as an application calling the function has.
cat >"$work/outbox.sql" <<SQL
\set n random(1, $n_tasks)
BEGIN;
WITH d AS (
    UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n::text AND deleted_at IS NULL
    RETURNING project_id, id, deleted_at, column_name, status)
SELECT count(*) AS hit, max(project_id) AS project_id, max(id) AS task_id,
       max(deleted_at) AS deleted_at, max(column_name) AS col, max(status) AS st
FROM d
\gset
\if :hit > 0
SELECT outbox.write_task_deleted(:project_id::text, :task_id::text, :deleted_at::timestamptz,
    'bench-writer', jsonb_build_object('column', :col::text, 'status', :st::text));
\endif
COMMIT;
SQL

# --- helpers for the runs ------------------------------------------------------------------

# Every run starts from the same state: all tasks live (so a random id almost always hits a
# live row: a run deletes a few percent of the table at most), an empty outbox, no dead
# tuples, and a fresh checkpoint (so each run pays the same full-page-write cost and no timed
# checkpoint lands inside a run: they are 5 min apart and every run restarts the clock).
reset_state() {
    sql -c 'TRUNCATE outbox.lifecycle_outbox, outbox.lifecycle_project_heads'
    sql -c 'UPDATE tasks SET deleted_at = NULL WHERE deleted_at IS NOT NULL'
    sql -c 'VACUUM (ANALYZE) tasks' -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' \
        -c 'VACUUM (ANALYZE) outbox.lifecycle_project_heads' -c 'CHECKPOINT'
}

start_sequencer() {
    OUTBOX_LOG=warn "$outbox" sequence --every 50ms >"$work/sequencer.out" 2>"$work/sequencer.err" &
    sequencer_pid=$!
    sleep 0.3
    if ! kill -0 "$sequencer_pid" 2>/dev/null; then
        cat "$work/sequencer.err" >&2
        log "the sequencer did not start"
        exit 1
    fi
}

# The sequencer exits cleanly on SIGINT (its ctrl-c path); anything else is a failure.
stop_sequencer() {
    kill -INT "$sequencer_pid"
    local status=0
    wait "$sequencer_pid" || status=$?
    sequencer_pid=
    if [ "$status" -ne 0 ]; then
        cat "$work/sequencer.err" >&2
        log "the sequencer failed (exit $status)"
        exit 1
    fi
}

# run VARIANT CLIENTS REP: one pgbench run; appends "variant clients rep tps latency_ms
# transactions deleted events unsequenced" to $work/runs.
run() {
    local variant=$1 clients=$2 rep=$3 script threads out
    threads=$(( clients < cores ? clients : cores ))
    case "$variant" in
        bare) script=$work/bare.sql ;;
        outbox) script=$work/outbox.sql ;;
    esac
    reset_state
    if [ "$variant" = outbox ]; then start_sequencer; fi
    out=$work/pgbench-$variant-$clients-$rep.log
    pgbench -n -M prepared -T "$seconds" -c "$clients" -j "$threads" -f "$script" \
        "$DATABASE_URL" >"$out" 2>&1 || { cat "$out" >&2; log "pgbench failed"; exit 1; }
    local unsequenced=0
    if [ "$variant" = outbox ]; then
        # What the sequencer had not numbered yet when the writers stopped: its lag.
        unsequenced=$(sql -c 'SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL')
        stop_sequencer
    fi
    local tps latency txns deleted events
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out")
    latency=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out")
    txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    deleted=$(sql -c 'SELECT count(*) FROM tasks WHERE deleted_at IS NOT NULL')
    events=$(sql -c 'SELECT count(*) FROM outbox.lifecycle_outbox')
    if [ -z "$tps" ] || [ -z "$latency" ] || [ -z "$txns" ]; then
        cat "$out" >&2
        log "could not parse pgbench output"
        exit 1
    fi
    # One event per effective delete, none for a no-op: the writer contract under load.
    if [ "$variant" = outbox ] && [ "$events" -ne "$deleted" ]; then
        log "FAIL: $deleted tasks deleted but $events events written"
        exit 1
    fi
    log "$(printf '%-6s c=%-2s rep %s: %9.1f tps  %7.3f ms  (%s txns, %s deleted, %s unsequenced at end)' \
        "$variant" "$clients" "$rep" "$tps" "$latency" "$txns" "$deleted" "$unsequenced")"
    echo "$variant $clients $rep $tps $latency $txns $deleted $events $unsequenced" >>"$work/runs"
}

# median VARIANT CLIENTS FIELD: median of a column of $work/runs (field 4 = tps, 5 = latency).
median() {
    awk -v v="$1" -v c="$2" -v f="$3" '$1 == v && $2 == c { print $f }' "$work/runs" \
        | sort -g | awk '{ x[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            if (NR % 2) print x[(NR + 1) / 2]; else print (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}

# --- writer cost ---------------------------------------------------------------------------

: >"$work/runs"
# Warm caches, plpgsql function caches and the table's HOT free space once, unrecorded.
log "warm-up (unrecorded)"
warm_seconds=$(( seconds < 3 ? seconds : 3 ))
max_clients=$(echo "$clients_list" | tr ' ' '\n' | sort -n | tail -n 1)
for variant in bare outbox; do
    reset_state
    if [ "$variant" = outbox ]; then start_sequencer; fi
    pgbench -n -M prepared -T "$warm_seconds" -c "$max_clients" \
        -j $(( max_clients < cores ? max_clients : cores )) -f "$work/$variant.sql" \
        "$DATABASE_URL" >"$work/warmup-$variant.log" 2>&1 \
        || { cat "$work/warmup-$variant.log" >&2; log "warm-up failed"; exit 1; }
    if [ "$variant" = outbox ]; then stop_sequencer; fi
done

# Interleaved a, b, a, b, ... per client count, so drift (cache, table state, noisy
# neighbours on the machine) hits both variants alike.
started=$(date +%s)
for clients in $clients_list; do
    for rep in $(seq 1 "$reps"); do
        run bare "$clients" "$rep"
        run outbox "$clients" "$rep"
    done
done
log "writer runs took $(( $(date +%s) - started )) s"

# --- sequencer throughput ------------------------------------------------------------------

log "writing a backlog of $n_backlog unsequenced events"
reset_state
# Direct INSERT with exactly the columns and event_id format the writer produces (1M plpgsql
# calls would only slow the setup); projects round-robin as in the tasks table, so every
# sequencer batch touches all projects, the worst case for its per-project bookkeeping.
sql <<SQL
INSERT INTO outbox.lifecycle_outbox
    (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
     payload_version, payload)
SELECT 'p' || (n % $n_projects), 'task:deleted',
       'task-deleted:b' || n || ':'
           || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       'b' || n, ts, 'bench-backlog', 1,
       jsonb_build_object('column', 'todo', 'status', 'open')
FROM generate_series(1, $n_backlog) AS n,
     LATERAL (SELECT timestamptz '2025-01-01 00:00:00+00' + n * interval '1 millisecond') AS t(ts);
SQL
# As autovacuum would have by the time a real backlog is drained: statistics and visibility.
sql -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' -c 'CHECKPOINT'

log "draining the backlog with: outbox sequence"
t0=$(date +%s.%N)
OUTBOX_LOG=warn "$outbox" sequence >"$work/drain.out" 2>"$work/drain.err" \
    || { cat "$work/drain.err" >&2; log "outbox sequence failed"; exit 1; }
t1=$(date +%s.%N)
drain_seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
drained=$(sed -n 's/^numbered \([0-9]*\) event.*/\1/p' "$work/drain.out")
events_per_second=$(awk -v n="$drained" -v s="$drain_seconds" 'BEGIN { printf "%.0f", n / s }')
log "numbered $drained events in $drain_seconds s ($events_per_second events/s)"

# Every row numbered; per project exactly 1..N in arrival (id) order; heads agree.
verify=$(sql <<SQL
WITH per_row AS (
    SELECT project_id, sequence,
           row_number() OVER (PARTITION BY project_id ORDER BY id) AS expected
    FROM outbox.lifecycle_outbox
), per_project AS (
    SELECT project_id, count(*) AS n, count(sequence) AS numbered,
           min(sequence) AS lo, max(sequence) AS hi,
           count(*) FILTER (WHERE sequence IS DISTINCT FROM expected) AS misplaced
    FROM per_row GROUP BY project_id
)
SELECT CASE WHEN count(*) = $n_projects
             AND sum(n) = sum(numbered)
             AND bool_and(lo = 1 AND hi = n AND misplaced = 0)
             AND bool_and(h.head_sequence = p.hi)
            THEN 'PASS' ELSE 'FAIL' END
       || format(' (%s events, %s numbered, %s projects, %s out of place, %s head mismatches)',
                 sum(n), sum(numbered), count(*), sum(misplaced),
                 count(*) FILTER (WHERE h.head_sequence IS DISTINCT FROM p.hi))
FROM per_project p LEFT JOIN outbox.lifecycle_project_heads h USING (project_id);
SQL
)
log "verification: $verify"

# --- report --------------------------------------------------------------------------------

pg_version=$(sql -c 'SHOW server_version')
settings=$(sql -c "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
                   FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit',
                   'full_page_writes', 'max_wal_size', 'autovacuum')")
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
memory=$(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB" }')

report() {
    echo "# Writer cost benchmark"
    echo
    echo "Generated by \`bench/writer.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC')$( [ "$quick" = 1 ] && echo ' (quick mode)')."
    echo
    echo "## Machine"
    echo
    echo "- CPU: ${cpu:-unknown}, nproc = $cores; memory ${memory:-unknown}"
    echo "- PostgreSQL $pg_version (disposable cluster from \`scripts/pg.sh\`, Unix socket): $settings"
    echo "- pgbench and the sequencer run on the same machine as the server"
    echo
    echo "## Method"
    echo
    echo "- \`tasks\`: $n_tasks rows over $n_projects projects, primary key on \`id\` (the index the delete uses), \`deleted_at\` not indexed."
    echo "- (a) bare: \`BEGIN; UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n AND deleted_at IS NULL; COMMIT\` with \`\\set n random(1, $n_tasks)\`."
    echo "- (b) with outbox: the same UPDATE with \`RETURNING\` into pgbench variables (\`\\gset\`, wrapped in an aggregate so an already-deleted id is a no-op), then \`SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'bench-writer', jsonb_build_object('column', column_name, 'status', status))\` in the same transaction; \`outbox sequence --every 50ms\` runs in the background for the whole run (started before, stopped after)."
    echo "- \`pgbench -n -M prepared -T $seconds -c C -j min(C, nproc)\`; per client count the runs are interleaved a, b, a, b, ... ($reps pair(s)); each cell is the median over the repetitions; ratio = median TPS (b) / median TPS (a). One unrecorded warm-up run of each variant first."
    echo "- Before every run: outbox and heads truncated, every task undeleted, \`VACUUM (ANALYZE)\` of \`tasks\` and the outbox tables, \`CHECKPOINT\`. So each run starts with all $n_tasks tasks live (random ids hit live rows: see hit rate below), no dead tuples, the same full-page-write cost, and no timed checkpoint inside the run. Autovacuum stays on (default settings)."
    echo "- After every (b) run the script checks that the outbox holds exactly one event per task actually deleted."
    echo
    echo "## Results"
    echo
    echo "| clients | bare TPS | bare latency ms | with-outbox TPS | with-outbox latency ms | ratio b/a |"
    echo "|---:|---:|---:|---:|---:|---:|"
    local clients ta la tb lb ratio
    for clients in $clients_list; do
        ta=$(median bare "$clients" 4)
        la=$(median bare "$clients" 5)
        tb=$(median outbox "$clients" 4)
        lb=$(median outbox "$clients" 5)
        ratio=$(awk -v a="$ta" -v b="$tb" 'BEGIN { printf "%.3f", b / a }')
        printf '| %s | %.0f | %.3f | %.0f | %.3f | %s |\n' "$clients" "$ta" "$la" "$tb" "$lb" "$ratio"
    done
    echo
    local min_hit max_lag
    min_hit=$(awk '{ h = $7 / $6; if (NR == 1 || h < m) m = h } END { printf "%.1f%%", 100 * m }' "$work/runs")
    max_lag=$(awk '$1 == "outbox" && $9 > m { m = $9 } END { print m + 0 }' "$work/runs")
    echo "Lowest hit rate (tasks actually deleted / transactions) of any run: $min_hit. Largest sequencer lag at the end of a (b) run: $max_lag unsequenced event(s)."
    echo
    echo "All runs (variant, clients, repetition, TPS, latency ms, transactions, tasks deleted, events, unsequenced at end):"
    echo
    echo '```'
    awk '{ printf "%-6s %3s %2s %10s %8s %8s %8s %8s %6s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' "$work/runs"
    echo '```'
    echo
    echo "## Sequencer throughput"
    echo
    echo "- Backlog: $n_backlog unsequenced events over $n_projects projects (round-robin), written by a direct \`INSERT ... SELECT\` with the writer's columns and event_id format, then \`VACUUM (ANALYZE)\` and \`CHECKPOINT\`."
    echo "- \`target/release/outbox sequence\` (drain once, default batch of 10000 events per transaction): $drained events in $drain_seconds s = **$events_per_second events/s** (wall clock, including process start and connect)."
    echo "- Verification (every row numbered; per project exactly 1..N in arrival order; heads equal to the last number): **$verify**"
    echo
    echo "## Goal"
    echo
    local ratio32
    ta=$(median bare 32 4)
    tb=$(median outbox 32 4)
    if [ "$ta" = nan ] || [ "$tb" = nan ]; then
        echo "Goal: b/a >= 0.95 at 32 clients. Not measured in this run (32 not in BENCH_CLIENTS)."
    else
        ratio32=$(awk -v a="$ta" -v b="$tb" 'BEGIN { printf "%.3f", b / a }')
        if awk -v r="$ratio32" 'BEGIN { exit !(r >= 0.95) }'; then
            echo "Goal: b/a >= 0.95 at 32 clients. Measured $ratio32: **met**."
        else
            echo "Goal: b/a >= 0.95 at 32 clients. Measured $ratio32: **not met**."
        fi
    fi
}

report | tee "$results_file"
log "report written to $results_file"
case "$verify" in
    PASS*) ;;
    *) exit 1 ;;
esac
