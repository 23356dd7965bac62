#!/usr/bin/env bash
# Peers benchmark: this project's writer and consumer against the one-insert outbox floor and
# PgQ, on one cluster, in one run, side by side.
#
#   bench/peers.sh                  full run (~30 min): 60,000 transactions per pgbench run,
#                                   3 repetitions, 1M-event drains
#   BENCH_QUICK=1 bench/peers.sh    smoke run (~7 min): 15,000 transactions per run, 1 repetition,
#                                   200k events
#
# Writer side (pgbench, 8 and 32 clients): every variant runs the same first statement, the
# soft delete with RETURNING, then:
#   bare      nothing more (the delete alone)
#   floor     one INSERT into a minimal outbox (bigserial PK + unique (project_id, event_id))
#   ours      SELECT outbox.write_task_deleted(...) (the SQL writer), no sequencer
#   ours+seq  the same while `outbox sequence --every 50ms` runs (the elected sequencer with the
#             adaptive tick, as production runs it)
#   rust      the Rust writer's statement (one INSERT ... ON CONFLICT DO NOTHING RETURNING id;
#             the Rust writer validates in the service), no sequencer
#   rust+seq  the same while `outbox sequence --every 50ms` runs
#   pgq       SELECT pgq.insert_event(...) while pgq.ticker() is called 100 times a second
#   rust+apart  a prototype, not the product (bench/numbering-apart.sql): the Rust writer's
#             statement into a schema whose tick stores the numbers apart, by the events'
#             addresses, instead of rewriting the event rows; with a read of 500 events by
#             address against the read of the sequence index (BENCH_PROTOTYPES=0 leaves it out)
# Consumer side: a backlog drained by our consumer runtime (outbox-bench catch-up-worker) and
# by a PgQ batch-API consumer (outbox-bench pgq-drain), interleaved.
#
# Environment:
#   BENCH_TXNS             transactions per pgbench run (default 60000; 15000 with BENCH_QUICK=1):
#                          every variant deletes as many tasks, so the full-page images of
#                          the tasks table weigh the same per transaction in each
#   BENCH_PROTOTYPES       1 (default) to run the rust+apart prototype as well, 0 not to
#   BENCH_REPS             repetitions (default 3; 1 with BENCH_QUICK=1)
#   BENCH_CLIENTS          client counts (default "8 32")
#   BENCH_TASKS            rows in the tasks table (default 1000000)
#   BENCH_DRAIN_EVENTS     events in each drain backlog (default 1000000; 200000 quick)
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-peers)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54371)
#
# PgQ comes from Debian's postgresql-<major>-pgq3 (scripts/pgq.sh ensure installs it as root).
# The markdown report goes to stdout and bench/RESULTS-peers.md; progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
    txns_per_run=${BENCH_TXNS:-15000}
    reps=${BENCH_REPS:-1}
    n_drain=${BENCH_DRAIN_EVENTS:-200000}
    read_seconds=3
else
    txns_per_run=${BENCH_TXNS:-60000}
    reps=${BENCH_REPS:-3}
    n_drain=${BENCH_DRAIN_EVENTS:-1000000}
    read_seconds=10
fi
prototypes=${BENCH_PROTOTYPES:-1}
clients_list=${BENCH_CLIENTS:-"8 32"}
n_tasks=${BENCH_TASKS:-1000000}
n_projects=64
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-peers}
pg_port=${OUTBOX_BENCH_PG_PORT:-54371}
results_file=$root/bench/RESULTS-peers.md
cores=$(nproc)
clk=$(getconf CLK_TCK)
variants="bare floor ours ours+seq rust rust+seq pgq"
[ "$prototypes" = 1 ] && variants="$variants rust+apart"

bench_name=peers.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-peers-bench.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

background_pid=
bench_cleanup_extra() {
    if [ -n "$background_pid" ]; then
        kill -TERM "$background_pid" 2>/dev/null || true
        wait "$background_pid" 2>/dev/null || true
    fi
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

log "checking for PgQ"
scripts/pgq.sh ensure >/dev/null || die "PgQ is not installed and could not be installed (run scripts/pgq.sh ensure as root)"

# --- cluster and binaries ------------------------------------------------------------------

bench_cluster
log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2
bench_bin=$root/target/release/outbox-bench
postmaster_pid=$(head -n 1 "$(sql -c 'SHOW data_directory')/postmaster.pid")
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

cluster_ticks() {
    {
        awk '{ print $14 + $15 + $16 + $17 }' "/proc/$postmaster_pid/stat"
        for child in $(ps -o pid= --ppid "$postmaster_pid"); do
            awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || true
        done
    } | awk '{ t += $1 } END { print t + 0 }'
}
wal_lsn() { sql -c 'SELECT pg_current_wal_insert_lsn()'; }

# --- data ----------------------------------------------------------------------------------

log "creating the tasks, the floor table, PgQ and the outbox schema"
create_tasks "$n_tasks" "$n_projects"
sql <<SQL
-- The one-insert floor: what any transactional outbox must at least do (an arrival order, an
-- idempotency key, the event's fields).
CREATE TABLE bench_floor (
    id         bigserial PRIMARY KEY,
    project_id text NOT NULL,
    event_id   text NOT NULL,
    task_id    text NOT NULL,
    deleted_at timestamptz NOT NULL,
    payload    jsonb NOT NULL,
    UNIQUE (project_id, event_id)
);

CREATE EXTENSION pgq;
CREATE EXTENSION pg_walinspect;

-- PgQ's ticker, as pgqd would run it: pgq.ticker() every 10 ms, each in its own transaction.
-- (pgq.ticker() itself only makes a tick after 500 events or 3 s, PgQ's queue defaults.)
CREATE PROCEDURE bench_pgq_ticker(iterations int) LANGUAGE plpgsql AS \$\$
BEGIN
    FOR i IN 1..iterations LOOP
        PERFORM pgq.ticker();
        COMMIT;
        PERFORM pg_sleep(0.01);
        COMMIT;
    END LOOP;
END \$\$;
SQL
"$outbox" migrate >&2
if [ "$prototypes" = 1 ]; then
    OUTBOX_SCHEMA=apart "$outbox" migrate >&2
    sed 's/{{schema}}/apart/g' bench/numbering-apart.sql | sql >/dev/null
fi
pgq_version=$(sql -c "SELECT extversion FROM pg_extension WHERE extname = 'pgq'")

# --- pgbench scripts -----------------------------------------------------------------------

pick_task='\set k :k + 1
\set n 1 + permute((:client_id + (:k - 1) * :clients) % '"$n_tasks"', '"$n_tasks"')'

# The first statement of every variant: the soft delete, its RETURNING folded into one row
# (\gset needs exactly one), with the event's fields the second statements use.
first_statement="$pick_task
BEGIN;
WITH d AS (
    UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n::text AND deleted_at IS NULL
    RETURNING project_id, id, deleted_at, column_name, status)
SELECT count(*) AS hit, max(project_id) AS project_id, max(id) AS task_id,
       max(deleted_at) AS deleted_at, bench_event_id(max(id), max(deleted_at)) AS event_id,
       jsonb_build_object('column', max(column_name), 'status', max(status)) AS payload
FROM d
\\gset"

printf '%s\nCOMMIT;\n' "$first_statement" >"$work/bare.sql"
cat >"$work/floor.sql" <<SQL
$first_statement
\if :hit > 0
INSERT INTO bench_floor (project_id, event_id, task_id, deleted_at, payload)
VALUES (:project_id::text, :event_id::text, :task_id::text, :deleted_at::timestamptz, :payload::jsonb)
ON CONFLICT (project_id, event_id) DO NOTHING;
\endif
COMMIT;
SQL
cat >"$work/ours.sql" <<SQL
$first_statement
\if :hit > 0
SELECT outbox.write_task_deleted(:project_id::text, :task_id::text, :deleted_at::timestamptz,
    'bench-writer', :payload::jsonb);
\endif
COMMIT;
SQL
cat >"$work/rust.sql" <<SQL
$first_statement
\if :hit > 0
$rust_writer_insert
\endif
COMMIT;
SQL
cat >"$work/apart.sql" <<SQL
$first_statement
\if :hit > 0
${rust_writer_insert//outbox.lifecycle_outbox/apart.lifecycle_outbox}
\endif
COMMIT;
SQL
cat >"$work/pgq.sql" <<SQL
$first_statement
\if :hit > 0
SELECT pgq.insert_event('bench_q', :event_type::text, :payload::text, :project_id::text,
    :event_id::text, :task_id::text, :deleted_at::text);
\endif
COMMIT;
SQL

# --- one writer run ------------------------------------------------------------------------

reset_state() {
    local apart_tables='' apart_vacuum=()
    if [ "$prototypes" = 1 ]; then
        apart_tables=', apart.lifecycle_outbox, apart.lifecycle_projects,
                       apart.lifecycle_sequencer_frontier, apart.lifecycle_event_numbers'
        apart_vacuum=(-c 'VACUUM (ANALYZE) apart.lifecycle_outbox'
                      -c 'VACUUM (ANALYZE) apart.lifecycle_event_numbers')
    fi
    sql -c "TRUNCATE outbox.lifecycle_outbox, outbox.lifecycle_projects,
                     outbox.lifecycle_sequencer_frontier, bench_floor $apart_tables" \
        -c 'UPDATE tasks SET deleted_at = NULL WHERE deleted_at IS NOT NULL' \
        -c "SELECT pgq.drop_queue('bench_q') FROM pgq.queue WHERE queue_name = 'bench_q'" \
        -c "SELECT pgq.create_queue('bench_q')" >/dev/null
    sql -c 'VACUUM (ANALYZE) tasks' -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' \
        -c 'VACUUM (ANALYZE) outbox.lifecycle_projects' -c 'VACUUM (ANALYZE) bench_floor' \
        "${apart_vacuum[@]}" \
        -c 'VACUUM (ANALYZE) pgq.queue' -c 'VACUUM (ANALYZE) pgq.tick' -c 'CHECKPOINT'
}

# The schema a variant's sequencer numbers in.
schema_of() { case "$1" in *+apart) echo apart ;; *) echo outbox ;; esac; }

# Ticks that numbered something so far in SCHEMA (each stores one frontier row, numbered by
# the table's identity).
productive_ticks() {
    sql -c "SELECT coalesce(last_value, 0) FROM pg_sequences
            WHERE schemaname = '$1' AND sequencename = 'lifecycle_sequencer_frontier_tick_seq'"
}

# apart_check: every event of the apart schema numbered exactly once, densely from 1 in each
# project (the prototype's frontier is exact only for ticks that take all they find).
apart_check() {
    local bad
    bad=$(sql -c "SELECT (SELECT count(*) FROM apart.lifecycle_outbox AS o
                          WHERE NOT EXISTS (SELECT FROM apart.lifecycle_event_numbers AS n
                                            WHERE n.row_id = o.ctid AND n.arrival = o.id))
                       + (SELECT count(*) - count(DISTINCT (row_id, arrival)) FROM apart.lifecycle_event_numbers)
                       + (SELECT count(*) FROM (SELECT project_id FROM apart.lifecycle_event_numbers
                                                GROUP BY project_id
                                                HAVING min(sequence) <> 1 OR max(sequence) <> count(*)) AS p)")
    [ "$bad" = 0 ] || die "the apart prototype numbered wrongly ($bad unnumbered, repeated or misplaced)"
}

# Events a variant wrote (tasks deleted for bare).
events_written() {
    case "$1" in
        bare) sql -c 'SELECT count(*) FROM tasks WHERE deleted_at IS NOT NULL' ;;
        floor) sql -c 'SELECT count(*) FROM bench_floor' ;;
        ours|ours+seq|rust|rust+seq) sql -c 'SELECT count(*) FROM outbox.lifecycle_outbox' ;;
        rust+apart) sql -c 'SELECT count(*) FROM apart.lifecycle_outbox' ;;
        pgq) sql -c "SELECT count(*) FROM pgq.event_$(sql -c "SELECT queue_id FROM pgq.queue WHERE queue_name = 'bench_q'")" ;;
    esac
}

# run VARIANT CLIENTS REP [SECONDS]: $txns_per_run transactions, or SECONDS of them (the
# unrecorded warm-up); appends to $work/runs:
# variant clients rep tps latency_ms txns deleted events lag cpu_us wal_b ticks
# record_b fpi_b heap_updates hot_updates btree_inserts (the last five per transaction)
# (ticks: PgQ's ticks, or the sequencer's ticks that numbered something)
run() {
    local variant=$1 clients=$2 rep=$3 span script threads out schema
    span="-t $(( txns_per_run / clients ))"
    [ -n "${4:-}" ] && span="-T $4"
    threads=$(( clients < cores ? clients : cores ))
    script=${variant%%+*}
    [ "$variant" = rust+apart ] && script=apart
    schema=$(schema_of "$variant")
    reset_state
    case "$variant" in
        *+seq|*+apart) OUTBOX_SCHEMA=$schema start_sequencer ;;
        pgq) start_call bench-pgq-ticker "CALL bench_pgq_ticker(60000)" ;;
    esac
    out=$work/pgbench-$variant-$clients-$rep.log
    local lsn0 lsn1 c0 c1 ticks0 ticks=0
    case "$variant" in
        pgq) ticks0=$(sql -c 'SELECT count(*) FROM pgq.tick') ;;
        *) ticks0=$(productive_ticks "$schema") ;;
    esac
    lsn0=$(wal_lsn); c0=$(cluster_ticks)
    # shellcheck disable=SC2086 # $span is two words on purpose
    pgbench -n -M prepared $span -c "$clients" -j "$threads" \
        -D k=0 -D clients="$clients" -D event_type=task:deleted \
        -f "$work/$script.sql" "$DATABASE_URL" >"$out" 2>&1 \
        || { cat "$out" >&2; die "pgbench failed ($variant, $clients clients)"; }
    local unsequenced=0
    case "$variant" in
        *+seq|*+apart)
            unsequenced=$(sql -c "SELECT count(*) FROM $schema.lifecycle_outbox_unsequenced")
            ticks=$(( $(productive_ticks "$schema") - ticks0 ))
            stop_sequencer ;;
        pgq)
            ticks=$(( $(sql -c 'SELECT count(*) FROM pgq.tick') - ticks0 ))
            stop_call bench-pgq-ticker ;;
    esac
    sleep 0.3
    c1=$(cluster_ticks); lsn1=$(wal_lsn)

    local tps latency txns deleted events wal
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out")
    latency=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out")
    txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    [ -n "$tps" ] && [ -n "$latency" ] && [ -n "$txns" ] && [ "$txns" -gt 0 ] \
        || { cat "$out" >&2; die "could not parse pgbench output"; }
    deleted=$(sql -c 'SELECT count(*) FROM tasks WHERE deleted_at IS NOT NULL')
    events=$(events_written "$variant")
    wal=$(sql -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
    # What the WAL is made of, per transaction: bytes without and with full-page images, heap
    # updates that are not HOT (every index gets a new entry), HOT updates, b-tree leaf inserts.
    local anatomy
    wal_flushed "$lsn1"
    anatomy=$(sql -F ' ' -c "SELECT round(sum(record_size)::numeric / $txns), round(sum(fpi_size)::numeric / $txns),
        round(coalesce(sum(count) FILTER (WHERE \"resource_manager/record_type\" LIKE 'Heap/UPDATE%'), 0)::numeric / $txns, 2),
        round(coalesce(sum(count) FILTER (WHERE \"resource_manager/record_type\" LIKE 'Heap/HOT_UPDATE%'), 0)::numeric / $txns, 2),
        round(coalesce(sum(count) FILTER (WHERE \"resource_manager/record_type\" = 'Btree/INSERT_LEAF'), 0)::numeric / $txns, 2)
        FROM pg_get_wal_stats('$lsn0', '$lsn1', true)")
    [ "$events" -eq "$deleted" ] || die "$variant: $deleted tasks deleted but $events events written"
    if [ "$variant" = rust+apart ]; then
        OUTBOX_SCHEMA=apart "$outbox" sequence >/dev/null 2>"$work/apart-drain.err" \
            || { cat "$work/apart-drain.err" >&2; die "the apart prototype's last drain failed"; }
        apart_check
    fi

    local line
    line=$(awk -v v="$variant" -v c="$clients" -v r="$rep" -v tps="$tps" -v lat="$latency" \
        -v n="$txns" -v d="$deleted" -v e="$events" -v u="$unsequenced" -v clk="$clk" \
        -v ct=$((c1 - c0)) -v wal="$wal" -v ticks="$ticks" -v anatomy="$anatomy" 'BEGIN {
            printf "%s %s %s %.1f %.3f %d %d %d %d %.0f %.0f %d %s\n", v, c, r, tps, lat, n, d, e, u,
                ct / clk * 1e6 / n, wal / n, ticks, anatomy }')
    echo "$line" >>"$work/runs"
    log "$(echo "$line" | awk '{ printf "%-8s c=%-2s rep %s: %8.1f tps %7.3f ms  server %4d us/txn  wal %5d B/txn (%d records, %d FPI)  upd %s hot %s btree %s  lag %d  ticks %d", $1, $2, $3, $4, $5, $10, $11, $13, $14, $15, $16, $17, $9, $12 }')"
}

median() {
    awk -v v="$1" -v c="$2" -v f="$3" '$1 == v && $2 == c && $3 ~ /^[0-9]/ { print $f }' "$work/runs" \
        | median_of
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.3f", a / b; else print "nan" }'; }

# --- writer side ---------------------------------------------------------------------------

: >"$work/runs"
log "warm-up (unrecorded)"
for variant in $variants; do
    run "$variant" 32 warm 3
done
: >"$work/runs"
started=$(date +%s)
for clients in $clients_list; do
    for rep in $(seq 1 "$reps"); do
        for variant in $variants; do
            run "$variant" "$clients" "$rep"
        done
    done
done
writer_seconds=$(( $(date +%s) - started ))
log "pgbench runs took $writer_seconds s"

# --- consumer side -------------------------------------------------------------------------
#
# Two backlogs of $n_drain events with the same fields: ours already numbered (1..N in one
# project, as the writer plus the sequencer leave it: outbox-bench's catch-up backlog), PgQ's
# written with pgq.insert_event in transactions of 500 events, each followed by a tick (PgQ's
# default of at most 500 events per tick under load), so every PgQ batch holds 500 events, the
# size of our consumer's batches. The PgQ consumers are registered before the events exist.

log "writing the drain backlogs ($n_drain events each)"
reset_state
sql -c "SELECT pgq.create_queue('drain_q')" >/dev/null
for rep in $(seq 1 "$reps"); do
    sql -c "SELECT pgq.register_consumer('drain_q', 'pgq-$rep')" >/dev/null
done
backlog_started=$(date +%s.%N)
sql <<SQL
INSERT INTO outbox.lifecycle_outbox
    (project_id, sequence, event_type, event_id, task_id, deleted_at,
     writer_process_id, occurred_at, payload_version, payload, sequenced_at)
SELECT 'drain', n, 'task:deleted', bench_event_id('b' || n, ts), 'b' || n, ts, 'bench-backlog',
       now(), 1,
       jsonb_build_object('column', (ARRAY['backlog', 'todo', 'doing', 'review', 'done'])[1 + n % 5],
                          'status', (ARRAY['open', 'blocked', 'closed'])[1 + n % 3]),
       now()
FROM generate_series(1, $n_drain) AS n,
     LATERAL (SELECT now() - interval '1 hour' + n * interval '1 microsecond') AS t(ts)
ORDER BY n;
INSERT INTO outbox.lifecycle_projects (project_id) VALUES ('drain');

CREATE PROCEDURE bench_pgq_backlog(total bigint, chunk int) LANGUAGE plpgsql AS \$\$
DECLARE i bigint := 0;
BEGIN
    WHILE i < total LOOP
        PERFORM pgq.insert_event('drain_q', 'task:deleted',
                    jsonb_build_object('column', (ARRAY['backlog', 'todo', 'doing', 'review', 'done'])[1 + n % 5],
                                       'status', (ARRAY['open', 'blocked', 'closed'])[1 + n % 3])::text,
                    'drain', bench_event_id('b' || n, ts), 'b' || n, ts::text)
        FROM generate_series(i + 1, least(i + chunk, total)) AS n,
             LATERAL (SELECT now() - interval '1 hour' + n * interval '1 microsecond') AS t(ts);
        COMMIT;
        PERFORM pgq.ticker('drain_q');
        COMMIT;
        i := i + chunk;
    END LOOP;
END \$\$;
CALL bench_pgq_backlog($n_drain, 500);
SQL
sql -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' -c 'VACUUM (ANALYZE) outbox.lifecycle_projects' \
    -c 'VACUUM (ANALYZE) pgq.tick' -c 'VACUUM (ANALYZE) pgq.subscription' -c 'CHECKPOINT'
for t in $(sql -c "SELECT 'pgq.' || c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = 'pgq' AND c.relname LIKE 'event\_%' AND c.relkind = 'r'"); do
    sql -c "VACUUM (ANALYZE) $t"
done
sql -c 'CHECKPOINT'
log "backlogs written in $(awk -v a="$backlog_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s"

json_field() { sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p"; }

: >"$work/drains"
for rep in $(seq 1 "$reps"); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    report=$("$bench_bin" catch-up-worker --database-url "$DATABASE_URL" --project drain \
        --consumer-id "ours-$rep" --expect "$n_drain" </dev/null) || die "our catch-up failed"
    secs=$(echo "$report" | json_field seconds)
    echo "ours $rep $secs $(awk -v n="$n_drain" -v s="$secs" 'BEGIN { printf "%.0f", n / s }') $load" >>"$work/drains"
    log "rep $rep: ours drained $n_drain events in $secs s"

    load=$(cut -d' ' -f1 /proc/loadavg)
    report=$("$bench_bin" pgq-drain --database-url "$DATABASE_URL" --queue drain_q \
        --consumer "pgq-$rep" --expect "$n_drain") || die "the PgQ drain failed"
    secs=$(echo "$report" | json_field seconds)
    batches=$(echo "$report" | json_field batches)
    echo "pgq $rep $secs $(awk -v n="$n_drain" -v s="$secs" 'BEGIN { printf "%.0f", n / s }') $load $batches" >>"$work/drains"
    log "rep $rep: PgQ drained $n_drain events in $secs s ($batches batches)"
done
drain_median() {
    awk -v v="$1" '$1 == v { print $4 }' "$work/drains" | median_of
}

# --- prototype: a batch read by address ----------------------------------------------------
#
# The drain backlog copied into the apart schema and numbered there by its tick, then one
# read of 500 events after a random cursor, as the consumer's READ_BATCH makes it: from the
# sequence index of the event table (as built) and from the numbers stored apart, joined to
# the events by address (a nested loop of TID lookups, kept whatever the statistics by the
# LATERAL subquery; each row's arrival ID is returned to be compared, as a reader must).
# pgbench, one client, prepared, interleaved; per read: latency and the cluster's CPU.

: >"$work/reads"
if [ "$prototypes" = 1 ]; then
    log "numbering the drain backlog apart"
    sql -c "INSERT INTO apart.lifecycle_outbox
                (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
                 occurred_at, payload_version, payload)
            SELECT project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
                   occurred_at, payload_version, payload
            FROM outbox.lifecycle_outbox WHERE project_id = 'drain' ORDER BY sequence" >/dev/null
    OUTBOX_SCHEMA=apart "$outbox" sequence >/dev/null 2>"$work/apart-drain.err" \
        || { cat "$work/apart-drain.err" >&2; die "numbering the backlog apart failed"; }
    apart_check
    sql -c 'VACUUM (ANALYZE) apart.lifecycle_outbox' -c 'VACUUM (ANALYZE) apart.lifecycle_event_numbers' \
        -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' >/dev/null
    cat >"$work/read-row.sql" <<SQL
\set c random(0, $(( n_drain - 500 )))
SELECT o.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload
FROM outbox.lifecycle_outbox AS o
WHERE o.project_id = 'drain' AND o.sequence > :c
ORDER BY o.sequence
LIMIT 500;
SQL
    cat >"$work/read-apart.sql" <<SQL
\set c random(0, $(( n_drain - 500 )))
SELECT n.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload, o.id = n.arrival AS same_row
FROM (SELECT sequence, row_id, arrival FROM apart.lifecycle_event_numbers
      WHERE project_id = 'drain' AND sequence > :c
      ORDER BY sequence
      LIMIT 500) AS n
LEFT JOIN LATERAL (SELECT * FROM apart.lifecycle_outbox WHERE ctid = n.row_id OFFSET 0) AS o ON true
ORDER BY n.sequence;
SQL
    for rep in $(seq 1 "$reps"); do
        for shape in row apart; do
            c0=$(cluster_ticks)
            pgbench -n -M prepared -T "$read_seconds" -c 1 -f "$work/read-$shape.sql" "$DATABASE_URL" \
                >"$work/read-$shape-$rep.log" 2>&1 \
                || { cat "$work/read-$shape-$rep.log" >&2; die "the $shape read failed"; }
            sleep 0.3  # the backend's CPU reaches the postmaster's account once it has exited
            c1=$(cluster_ticks)
            reads=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/read-$shape-$rep.log")
            ms=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$work/read-$shape-$rep.log")
            echo "$shape $rep $ms $(awk -v t=$((c1 - c0)) -v clk="$clk" -v n="$reads" 'BEGIN { printf "%.0f", t / clk * 1e6 / n }')" >>"$work/reads"
            log "read of 500 ($shape), rep $rep: $ms ms, $(tail -n 1 "$work/reads" | cut -d' ' -f4) server us"
        done
    done
fi
read_median() {
    awk -v s="$1" -v f="$2" '$1 == s { print $f }' "$work/reads" | median_of
}

load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report --------------------------------------------------------------------------------

pg_version=$(sql -c 'SHOW server_version')
settings=$(sql -c "SELECT string_agg(name || ' = ' || current_setting(name), ', ' ORDER BY name)
                   FROM unnest(ARRAY['shared_buffers', 'fsync', 'synchronous_commit',
                        'full_page_writes', 'max_wal_size', 'autovacuum']) AS name")
cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
memory=$(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB" }')
revision=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)

# Goal 6 for the full path of one writer (ours+seq or rust+seq), at every client count:
# full / floor >= 0.95 and full / pgq >= 1.0.
goal_verdict() {
    local full=$1 clients verdict=met r_floor r_pgq
    for clients in $clients_list; do
        r_floor=$(ratio "$(median "$full" "$clients" 4)" "$(median floor "$clients" 4)")
        r_pgq=$(ratio "$(median "$full" "$clients" 4)" "$(median pgq "$clients" 4)")
        awk -v a="$r_floor" -v b="$r_pgq" 'BEGIN { exit !(a >= 0.95 && b >= 1.0) }' || verdict="not met"
    done
    echo "$verdict"
}

# why: goal 6's explanation, from the medians of the WAL anatomy columns.
why() {
    local clients
    echo "Why, from the WAL (medians per transaction; records = WAL without full-page images):"
    echo
    for clients in $clients_list; do
        awk -v c="$clients" \
            -v fr="$(median floor "$clients" 13)" -v ff="$(median floor "$clients" 14)" -v fb="$(median floor "$clients" 17)" \
            -v or="$(median ours "$clients" 13)" -v of="$(median ours "$clients" 14)" -v ob="$(median ours "$clients" 17)" \
            -v sr="$(median ours+seq "$clients" 13)" -v sf="$(median ours+seq "$clients" 14)" -v sb="$(median ours+seq "$clients" 17)" \
            -v su="$(median ours+seq "$clients" 15)" -v sh="$(median ours+seq "$clients" 16)" \
            -v pr="$(median pgq "$clients" 13)" -v pf="$(median pgq "$clients" 14)" -v pb="$(median pgq "$clients" 17)" \
            -v ts="$(median ours+seq "$clients" 10)" -v tf="$(median floor "$clients" 10)" -v tp="$(median pgq "$clients" 10)" -v to="$(median ours "$clients" 10)" 'BEGIN {
            printf "- **%s clients.** Floor: %d B of records + %d B of full-page images, %.2f b-tree leaf inserts. Ours without the sequencer: %d + %d B, %.2f b-tree inserts (the event key and the frontier index on `(xid, id)` of unsequenced rows, two, as many as the floor has; the rest of the gap is the plpgsql call: %d against %d server µs/txn). Ours with the sequencer: %d + %d B, %.2f b-tree inserts and %.2f non-HOT heap UPDATEs per transaction (plus %.2f HOT ones, the delete): the sequencer rewrites every event row once, and since `sequence` is indexed (a key column of the `(project_id, sequence)` index and the predicate of the frontier index) the new version can never be HOT: the event key and the sequence index each get a new entry (2 inserts by the writer + 2 by the sequencer); the new versions land on the pages the inserts have just dirtied, so they add hardly any full-page images. That is %+d B of records and %+d B of images per event over the floor, and %d against %d server µs/txn. PgQ: %d + %d B, %.2f b-tree inserts (one index, on `ev_txid`; no primary key, no unique key, no per-project numbering), %d server µs/txn.\n",
                c, fr, ff, fb, or, of, ob, to, tf, sr, sf, sb, su, sh, sr - fr, sf - ff, ts, tf, pr, pf, pb, tp }'
    done
    echo
    echo "So the full path pays for the numbering in the event table itself: the one-insert floor and PgQ do one heap insert and one or two index inserts per event and never touch the row again; ours inserts (two index entries) and then updates (two more) every event. Without the sequencer the Rust writer's statement is the floor's work (two b-tree inserts, one heap insert; the event table has no key on \`id\`, migration 6), and the SQL writer adds the plpgsql call and its checks (migration 7 made those cheap)."
    echo
    echo "Numbering that leaves the event row alone (the numbers stored apart) is measured in this run as a prototype (rust+apart, below): it writes less WAL per event, but every read then joins the numbers to the events. And a tick's work (finding the new rows, numbering them per project, storing its frontier, committing) runs on the same cores as the writers whatever it stores. PgQ's ticker does none of that per event (it records a transaction snapshot and numbers nothing), which is why it stays near the floor; it gives no per-project sequence in return."
}

# prototype_report: the rust+apart prototype beside the full path as built and PgQ.
prototype_report() {
    local clients v
    echo "## Prototype: numbers stored apart"
    echo
    echo "\`bench/numbering-apart.sql\` (read it for what the prototype leaves out): the same writer statement and elected sequencer as rust+seq, in a schema whose tick inserts one row per event into \`lifecycle_event_numbers (project_id, sequence, row_id tid, arrival)\` instead of writing the number into the event row, which is then never rewritten. Checked after every run: every event numbered exactly once, densely per project."
    echo
    echo "| clients | variant | TPS | TPS / pgq | WAL B/txn | WAL / pgq | records B/txn | full-page images B/txn | b-tree leaf inserts | server µs/txn | productive ticks | events per tick |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for clients in $clients_list; do
        for v in rust rust+seq rust+apart pgq; do
            printf '| %s | %s | %.0f | %s | %.0f | %s | %.0f | %.0f | %s | %.0f | %s | %s |\n' "$clients" "$v" \
                "$(median "$v" "$clients" 4)" "$(ratio "$(median "$v" "$clients" 4)" "$(median pgq "$clients" 4)")" \
                "$(median "$v" "$clients" 11)" "$(ratio "$(median "$v" "$clients" 11)" "$(median pgq "$clients" 11)")" \
                "$(median "$v" "$clients" 13)" "$(median "$v" "$clients" 14)" "$(median "$v" "$clients" 17)" \
                "$(median "$v" "$clients" 10)" "$(median "$v" "$clients" 12)" \
                "$(case "$v" in *+seq|*+apart) awk -v t="$(median "$v" "$clients" 12)" -v n="$(median "$v" "$clients" 6)" 'BEGIN { if (t > 0) printf "%.1f", n / t; else print "-" }' ;; *) echo - ;; esac)"
        done
    done
    echo
    echo "(PgQ's ticks are its ticker's, which number nothing; rust has no sequencer.)"
    echo
    echo "A consumer's read of 500 events after a random cursor in the $n_drain-event drain backlog (numbered apart by the prototype's tick for the second row), pgbench, one client, prepared, $read_seconds s per run, $reps round(s) interleaved, medians:"
    echo
    echo "| read | ms per read | server µs per read | runs (ms) |"
    echo "|---|---:|---:|---|"
    echo "| sequence index of the event table (as built, the consumer's READ_BATCH) | $(read_median row 3) | $(read_median row 4) | $(awk '$1 == "row" { printf "%s%s", sep, $3; sep = ", " }' "$work/reads") |"
    echo "| numbers apart, joined to the events by address | $(read_median apart 3) | $(read_median apart 4) | $(awk '$1 == "apart" { printf "%s%s", sep, $3; sep = ", " }' "$work/reads") |"
    echo
    echo "By address / as built: **$(ratio "$(read_median apart 3)" "$(read_median row 3)")** in time, $(ratio "$(read_median apart 4)" "$(read_median row 4)") in server CPU."
}

report() {
    local clients v what
    echo "# Peers benchmark"
    echo
    echo "Generated by \`bench/peers.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') at revision \`$revision\`$( [ "$quick" = 1 ] && echo ' (quick mode: not for conclusions)')."
    echo
    echo "## Machine"
    echo
    echo "- CPU: ${cpu_model:-unknown}, nproc = $cores; memory ${memory:-unknown}"
    echo "- PostgreSQL $pg_version, PgQ $pgq_version (Debian \`postgresql-15-pgq3\`), one disposable cluster from \`scripts/pg.sh\` (Unix socket): $settings"
    echo "- Load average (1, 5, 15 min) at the start: $load_start; at the end: $load_end. pgbench, the server, the sequencer or ticker, and whatever colleagues ran on the machine share the $cores CPUs: read absolute TPS with that in mind; ratios are between runs interleaved seconds apart."
    echo
    echo "## Method"
    echo
    echo "- \`tasks\`: $n_tasks rows over $n_projects projects, primary key on \`id\`, \`deleted_at\` not indexed (as in \`bench/writer.sh\`)."
    echo "- Every variant runs the same first statement in its transaction: \`WITH d AS (UPDATE tasks SET deleted_at = now() WHERE id = \$1 AND deleted_at IS NULL RETURNING ...) SELECT count(*), max(project_id), ..., bench_event_id(...), jsonb_build_object(...) FROM d\` into pgbench variables (\`\\gset\`), then, when a row was deleted:"
    echo "  - **bare**: nothing (the delete alone);"
    echo "  - **floor**: \`INSERT INTO bench_floor (project_id, event_id, task_id, deleted_at, payload) VALUES (...) ON CONFLICT (project_id, event_id) DO NOTHING\`; \`bench_floor\` has a \`bigserial\` primary key and \`UNIQUE (project_id, event_id)\`, nothing else;"
    echo "  - **ours**: \`SELECT outbox.write_task_deleted(project_id, task_id, deleted_at, 'bench-writer', payload)\`, no sequencer;"
    echo "  - **ours+seq**: the same while \`outbox sequence --every 50ms\` runs: the elected sequencer with the adaptive tick (at once after a tick that numbered something, then from 1 ms doubling to 50 ms when idle), which is what production runs (a consumer's embedded sequencer is the same code, elected the same way);"
    echo "  - **rust**: the Rust writer's statement, \`INSERT INTO outbox.lifecycle_outbox (...) VALUES (...) ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING RETURNING id\` (the Rust writer validates the fields in the service, so the database runs only this), no sequencer;"
    echo "  - **rust+seq**: the same while \`outbox sequence --every 50ms\` runs;"
    echo "  - **pgq**: \`SELECT pgq.insert_event('bench_q', 'task:deleted', payload, project_id, event_id, task_id, deleted_at)\` while a procedure calls \`pgq.ticker()\` every 10 ms, each in its own transaction (PgQ's own queue settings decide when a tick is made: at 500 events or 3 s)."
    echo "- What the peers do not do: the floor numbers nothing (a reader cannot tell a gap from a commit still in flight); PgQ numbers nothing per project and has no idempotency key (one index, on \`ev_txid\`), and its readers see batches between ticks. Ours gives dense per-project sequences, never visible out of order, and suppresses a repeated delete. The ratios are the price of that."
    echo "- \`pgbench -n -M prepared -t $txns_per_run/C -c C -j min(C, nproc)\` ($txns_per_run transactions per run), task ids random without repeats; per client count the variants run interleaved, $reps round(s), after one unrecorded warm-up of each (3 s at 32 clients); cells are medians. Before every run: all tables emptied (PgQ's queue dropped and re-created), every task undeleted, \`VACUUM (ANALYZE)\`, \`CHECKPOINT\`. After every run: exactly one event per deleted task (checked)."
    echo "- WAL B/txn: \`pg_current_wal_insert_lsn()\` difference over the run / transactions, so the sequencer's or ticker's WAL during the run is included. Every run deletes the same number of tasks: most of the full-page images are the tasks table's (the first change of each of its pages after the \`CHECKPOINT\`), and a run of fixed length would spread the same images over fewer transactions in a slower variant, charging it for being slow (the images column below is about equal in every variant for that reason). Server µs/txn: CPU of all the cluster's processes / transactions. Ticks: PgQ's ticks, or the sequencer's ticks that numbered something (each stores a frontier row)."
    echo "- Drain: $n_drain events in one project. Ours: numbered 1..N already (as the writer and the sequencer leave them), drained by \`outbox-bench catch-up-worker\` (the consumer runtime, \`ConsumerConfig\` defaults but no LISTEN, batches of 500, no-op handler, a fresh consumer ID per run). PgQ: written by \`pgq.insert_event\` in transactions of 500, a tick after each, consumers registered before, drained by \`outbox-bench pgq-drain\`: \`pgq.next_batch\`, \`pgq.get_batch_events\` (every row read, \`ev_data\` decoded into the same struct as our payload), \`pgq.finish_batch\`, prepared statements, one connection. Interleaved, $reps round(s), medians."
    echo
    echo "## Writer"
    echo
    for clients in $clients_list; do
        echo "### $clients clients"
        echo
        echo "| variant | TPS | latency ms | server µs/txn | WAL B/txn | TPS / bare |"
        echo "|---|---:|---:|---:|---:|---:|"
        for v in $variants; do
            printf '| %s | %.0f | %.3f | %.0f | %.0f | %s |\n' "$v" "$(median "$v" "$clients" 4)" \
                "$(median "$v" "$clients" 5)" "$(median "$v" "$clients" 10)" "$(median "$v" "$clients" 11)" \
                "$(ratio "$(median "$v" "$clients" 4)" "$(median bare "$clients" 4)")"
        done
        echo
    done
    echo "### What the WAL is made of (per transaction, medians, from \`pg_get_wal_stats\`)"
    echo
    echo "| clients | variant | WAL B/txn | records B/txn | full-page images B/txn | non-HOT heap UPDATEs | HOT UPDATEs | b-tree leaf inserts |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|"
    for clients in $clients_list; do
        for v in $variants; do
            printf '| %s | %s | %.0f | %.0f | %.0f | %s | %s | %s |\n' "$clients" "$v" "$(median "$v" "$clients" 11)" \
                "$(median "$v" "$clients" 13)" "$(median "$v" "$clients" 14)" "$(median "$v" "$clients" 15)" \
                "$(median "$v" "$clients" 16)" "$(median "$v" "$clients" 17)"
        done
    done
    echo
    echo "### Our ratios"
    echo
    echo "TPS ratios are the goal's measure; on this shared two-core host they move by ±30 % from run to run with the load (see All runs). Server CPU per transaction hardly depends on the load, so the last two columns give the same ratios by CPU cost (the peer's server µs/txn over the full path's): what TPS would be on a host where the server's CPU is the limit. Full path = the writer with the sequencer running."
    echo
    echo "| clients | writer | full path / floor | full path / pgq | writer alone / floor | writer alone / pgq | WAL B/txn full path − floor | WAL full path / pgq | WAL writer alone / pgq | by CPU: full path / floor | by CPU: full path / pgq |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    local alone label
    for clients in $clients_list; do
        for alone in ours rust; do
            label="SQL (\`write_task_deleted\`)"; [ "$alone" = rust ] && label="Rust (one INSERT)"
            printf '| %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %s |\n' "$clients" "$label" \
                "$(ratio "$(median "$alone+seq" "$clients" 4)" "$(median floor "$clients" 4)")" \
                "$(ratio "$(median "$alone+seq" "$clients" 4)" "$(median pgq "$clients" 4)")" \
                "$(ratio "$(median "$alone" "$clients" 4)" "$(median floor "$clients" 4)")" \
                "$(ratio "$(median "$alone" "$clients" 4)" "$(median pgq "$clients" 4)")" \
                "$(awk -v a="$(median "$alone+seq" "$clients" 11)" -v b="$(median floor "$clients" 11)" 'BEGIN { print a - b }')" \
                "$(ratio "$(median "$alone+seq" "$clients" 11)" "$(median pgq "$clients" 11)")" \
                "$(ratio "$(median "$alone" "$clients" 11)" "$(median pgq "$clients" 11)")" \
                "$(ratio "$(median floor "$clients" 10)" "$(median "$alone+seq" "$clients" 10)")" \
                "$(ratio "$(median pgq "$clients" 10)" "$(median "$alone+seq" "$clients" 10)")"
        done
    done
    echo
    echo "## Drain (catch-up)"
    echo
    local ours_rate pgq_rate
    ours_rate=$(drain_median ours); pgq_rate=$(drain_median pgq)
    echo "| consumer | events/s (median) | runs (events/s) |"
    echo "|---|---:|---|"
    echo "| ours (consumer runtime) | $ours_rate | $(awk '$1 == "ours" { printf "%s%s", sep, $4; sep = ", " }' "$work/drains") |"
    echo "| PgQ batch API | $pgq_rate | $(awk '$1 == "pgq" { printf "%s%s", sep, $4; sep = ", " }' "$work/drains") |"
    echo
    echo "ours / PgQ: **$(ratio "$ours_rate" "$pgq_rate")**. Per batch of 500 ours makes one read and one acknowledging commit; PgQ's API makes two commits (\`next_batch\` and \`finish_batch\`) and one read. PgQ batches per drain: $(awk '$1 == "pgq" { print $6; exit }' "$work/drains"). Load average (1 min) at the start of each drain: $(awk '{ printf "%s%s %s: %s", sep, $1, $2, $5; sep = "; " }' "$work/drains")."
    echo
    echo "## Goal 6 (writer at the floor)"
    echo
    echo "Goal: the full path ≥ 0.95 × floor and ≥ 1.0 × pgq, at each of $clients_list clients. Measured: with the SQL writer (ours+seq) **$(goal_verdict ours+seq)**, with the Rust writer (rust+seq) **$(goal_verdict rust+seq)** (ratios above)."
    echo
    why
    echo
    if [ "$prototypes" = 1 ]; then
        prototype_report
        echo
    fi
    echo "## All runs"
    echo
    echo '```'
    printf '%-13s %3s %3s %9s %8s %7s %7s %7s %5s %7s %6s %5s %6s %6s %5s %5s %5s\n' variant cl rep tps lat_ms txns deleted events lag us/txn B/txn ticks rec_B fpi_B upd hot btree
    awk '{ printf "%-13s %3s %3s %9s %8s %7s %7s %7s %5s %7s %6s %5s %6s %6s %5s %5s %5s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17 }' "$work/runs"
    echo '```'
}

report | tee "$results_file.new"
mv "$results_file.new" "$results_file"
log "report written to $results_file"
