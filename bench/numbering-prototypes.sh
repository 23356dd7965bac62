#!/usr/bin/env bash
# Numbering prototypes (issue 21): today's numbering against SQL prototypes of numbering that
# an old snapshot cannot slow down, and PgQ, on one cluster, in one run.
#
#   bench/numbering-prototypes.sh               10 s per writer run, 3 repetitions, history to
#                                               100,000 events
#   BENCH_QUICK=1 bench/numbering-prototypes.sh 3 s per run, 1 repetition, history to 30,000
#
# Variants (bench/numbering-prototypes.sql has the prototypes and why):
#   today     the Rust writer's INSERT into outbox.lifecycle_outbox; `outbox sequence` numbers
#             it (the update of the event row, found through the frontier index, migration 10)
#   narrow    INSERT into proto.events (insert-only, with the writer's xid8); the frontier tick
#             stores one (project, sequence, event_id) row per event
#   tickrows  the same frontier; one row per project and tick with the tick's event IDs
#   tidrows   the same frontier; one row per project and tick with the tick's events as
#             physical addresses and arrival IDs, read back by address (a TID scan)
#   pgq       pgq.insert_event; PgQ's ticker and one consumer's batches
#   writer    (writer runs only) today's INSERT with nothing numbering it: what every design
#             pays before numbering, so a design's numbering costs its figure less this one
#   tidrows_async  (writer runs only, when named) tidrows with each tick's commit not waiting
#             for its WAL flush (`SET LOCAL synchronous_commit = off`)
#
# 1. Held snapshot: for each variant and each kind of hold (a REPEATABLE READ snapshot after
#    one SELECT; an idle transaction that wrote a row, so it holds a transaction ID), events are
#    written and numbered in steps of 10,000 while the hold stays open; at each checkpoint of
#    the history one more tick of 100 events is measured with pg_stat_statements: shared
#    buffers of the idle probe and of the numbering tick (for PgQ: ticker, next_batch,
#    get_batch_events, finish_batch). Bounded means flat along the history.
# 2. Writer: pgbench, one event per transaction (the outbox statement alone: a stricter ratio
#    than bench/peers.sh's, whose transactions also soft-delete a task), 8 and 32 clients, with
#    the variant's numbering running as production would run it (a prototype's tick from one
#    client, a transaction per tick); events/s, WAL bytes and cluster CPU per event. Every run is checked: every event numbered once, numbers dense.
# 3. Reader: one consumer fetch of 500 events from the middle of a 100,000-event project,
#    shared buffers and server time (median of 20); for tidrows also the read by address
#    alone, which a consumer would send beside the read of the tick rows and join itself.
#
# Environment:
#   BENCH_SECONDS, BENCH_REPS, BENCH_CLIENTS ("8 32")
#   BENCH_VARIANTS         designs of parts 1 and 2 (default "today narrow tickrows tidrows pgq")
#   BENCH_WRITER_VARIANTS  designs of part 2 (default "writer" and BENCH_VARIANTS)
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-prototypes)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54374)
# The markdown report goes to stdout and bench/RESULTS-old-snapshot-prototypes.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
    seconds=${BENCH_SECONDS:-3}
    reps=${BENCH_REPS:-1}
    checkpoints="0 10000 30000"
else
    seconds=${BENCH_SECONDS:-10}
    reps=${BENCH_REPS:-3}
    checkpoints="0 10000 30000 100000"
fi
clients_list=${BENCH_CLIENTS:-"8 32"}
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-prototypes}
pg_port=${OUTBOX_BENCH_PG_PORT:-54374}
results_file=$root/bench/RESULTS-old-snapshot-prototypes.md
cores=$(nproc)
clk=$(getconf CLK_TCK)
variants=${BENCH_VARIANTS:-"today narrow tickrows tidrows pgq"}
writer_variants=${BENCH_WRITER_VARIANTS:-"writer $variants"}

bench_name=numbering-prototypes.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-prototypes.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

background_pid=
hold_pid=
bench_cleanup_extra() {
    local pid
    for pid in "$background_pid" "$hold_pid"; do
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

log "checking for PgQ"
scripts/pgq.sh ensure >/dev/null || die "PgQ is not installed and could not be installed (run scripts/pgq.sh ensure as root)"

bench_cluster
sql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" >/dev/null
pg down >/dev/null
pg up >/dev/null
sql -c "CREATE EXTENSION pg_stat_statements" -c "CREATE EXTENSION pgq" >/dev/null
"$outbox" migrate >&2
sql -f bench/numbering-prototypes.sql >/dev/null
postmaster_pid=$(head -n 1 "$(sql -c 'SHOW data_directory')/postmaster.pid")
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

sql <<'SQL' >/dev/null
CREATE TABLE bench_hold (n int);

-- PgQ's ticker, as pgqd would run it: pgq.ticker() every 10 ms.
CREATE PROCEDURE bench_pgq_ticker(iterations int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..iterations LOOP
        PERFORM pgq.ticker();
        COMMIT;
        PERFORM pg_sleep(0.01);
        COMMIT;
    END LOOP;
END $$;

-- write_events VARIANT FROM COUNT: COUNT events of 8 projects in one transaction.
CREATE PROCEDURE bench_write(variant text, first bigint, total int) LANGUAGE plpgsql AS $$
BEGIN
    IF variant = 'today' THEN
        INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, deleted_at,
            writer_process_id, payload_version, payload)
        SELECT 'p' || n % 8, 'task:deleted', 'e' || n, 't' || n, now(), 'bench', 1,
               '{"column": "todo", "status": "open"}'
        FROM generate_series(first, first + total - 1) AS n;
    ELSIF variant = 'pgq' THEN
        PERFORM pgq.insert_event('bench_q', 'task:deleted', '{"column": "todo", "status": "open"}',
                                 'p' || n % 8, 'e' || n, 't' || n, now()::text)
        FROM generate_series(first, first + total - 1) AS n;
    ELSE
        INSERT INTO proto.events (project_id, event_type, event_id, task_id, deleted_at,
            writer_process_id, payload_version, payload)
        SELECT 'p' || n % 8, 'task:deleted', 'e' || n, 't' || n, now(), 'bench', 1,
               '{"column": "todo", "status": "open"}'
        FROM generate_series(first, first + total - 1) AS n;
    END IF;
END $$;

-- PgQ's side of a tick: a forced tick, then one consumer's batch read and finished.
CREATE FUNCTION bench_pgq_tick() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    b bigint;
    n bigint;
BEGIN
    PERFORM pgq.force_tick('bench_q');
    PERFORM pgq.ticker('bench_q');
    b := pgq.next_batch('bench_q', 'bench_c');
    IF b IS NULL THEN RETURN 0; END IF;
    SELECT count(*) INTO n FROM pgq.get_batch_events(b);
    PERFORM pgq.finish_batch(b);
    RETURN n;
END $$;
SQL

reset_state() {
    sql -c 'TRUNCATE outbox.lifecycle_outbox, outbox.lifecycle_projects, outbox.lifecycle_sequencer_frontier, proto.events, proto.numbers, proto.tick_rows, proto.tick_tids, proto.ticks' \
        -c 'INSERT INTO proto.ticks VALUES (0, pg_current_snapshot())' \
        -c "SELECT pgq.drop_queue('bench_q', true) FROM pgq.queue WHERE queue_name = 'bench_q'" \
        -c "SELECT pgq.create_queue('bench_q')" \
        -c "SELECT pgq.register_consumer('bench_q', 'bench_c')" >/dev/null
    sql -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' -c 'VACUUM (ANALYZE) outbox.lifecycle_projects' \
        -c 'VACUUM (ANALYZE) proto.events' -c 'VACUUM (ANALYZE) proto.numbers' \
        -c 'VACUUM (ANALYZE) proto.tick_rows' -c 'VACUUM (ANALYZE) proto.tick_tids' \
        -c 'VACUUM (ANALYZE) proto.ticks' \
        -c 'VACUUM (ANALYZE) pgq.tick' -c 'VACUUM (ANALYZE) pgq.subscription' -c 'CHECKPOINT' >/dev/null
}

# number VARIANT: numbers everything committed (one tick of up to 10,000 for today).
number() {
    case "$1" in
        today) "$outbox" sequence >/dev/null ;;
        narrow) sql -c "SELECT proto.pending()" -c "BEGIN" -c "SELECT pg_advisory_xact_lock(4242)" -c "SELECT proto.tick_narrow()" -c "COMMIT" >/dev/null ;;
        tickrows) sql -c "SELECT proto.pending()" -c "BEGIN" -c "SELECT pg_advisory_xact_lock(4242)" -c "SELECT proto.tick_rows()" -c "COMMIT" >/dev/null ;;
        tidrows|tidrows_async) sql -c "SELECT proto.pending()" -c "BEGIN" -c "SELECT pg_advisory_xact_lock(4242)" -c "SELECT proto.tick_tids()" -c "COMMIT" >/dev/null ;;
        pgq) sql -c "SELECT bench_pgq_tick()" >/dev/null ;;
    esac
}

# tick_buffers VARIANT: "probe_buffers tick_buffers" of one tick, from pg_stat_statements
# (whose texts have their constants replaced, `LIMIT 1` by `LIMIT $1`; the numbering statement
# reads the same views as the probe, so it is recognised first).
tick_buffers() {
    sql -c "SELECT pg_stat_statements_reset()" >/dev/null
    number "$1"
    sql -F ' ' -c "
        SELECT coalesce(sum(shared_blks_hit + shared_blks_read) FILTER (WHERE kind = 'probe'), 0),
               coalesce(sum(shared_blks_hit + shared_blks_read) FILTER (WHERE kind = 'tick'), 0)
        FROM (SELECT shared_blks_hit, shared_blks_read,
                     CASE WHEN query LIKE '%PARTITION BY project_id ORDER BY xid, id%'
                               OR query LIKE '%pg_try_advisory_xact_lock%'
                               OR query LIKE '%proto.tick_%' OR query LIKE '%bench_pgq_tick%' THEN 'tick'
                          WHEN query LIKE '%lifecycle_outbox_unsequenced_open%LIMIT%'
                               OR query LIKE '%proto.pending%' THEN 'probe'
                     END AS kind
              FROM pg_stat_statements) AS s"
}

# --- 1. held snapshot ----------------------------------------------------------------------

: >"$work/history"
for hold in snapshot xid; do
    for variant in $variants; do
        reset_state
        # The proto frontier's first tick starts after the reset; PgQ needs a first tick.
        number "$variant"
        hold_start "$hold"
        written=0
        for checkpoint in $checkpoints; do
            while ((written < checkpoint)); do
                sql -c "CALL bench_write('$variant', $written + 1, 10000)" >/dev/null
                written=$((written + 10000))
                number "$variant"
            done
            sql -c "CALL bench_write('$variant', $written + 1, 100)" >/dev/null
            written=$((written + 100))
            read -r probe tick < <(tick_buffers "$variant")
            echo "$hold $variant $checkpoint $probe $tick" >>"$work/history"
            log "held $hold, $variant, $checkpoint events of history: probe $probe buffers, tick $tick buffers"
        done
        hold_stop
    done
done

# --- 2. writer -----------------------------------------------------------------------------

cluster_ticks() {
    {
        awk '{ print $14 + $15 + $16 + $17 }' "/proc/$postmaster_pid/stat"
        for child in $(ps -o pid= --ppid "$postmaster_pid"); do
            awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || true
        done
    } | awk '{ t += $1 } END { print t + 0 }'
}
wal_lsn() { sql -c 'SELECT pg_current_wal_insert_lsn()'; }

# (pgbench reads a colon followed by a name as a variable even inside a literal, so the
# event type comes in as one: -D event_type=task:deleted.)
event_fields="'p' || :p::text, :event_type::text, 'e-' || :client_id::text || '-' || :k::text, 't' || :k::text"
cat >"$work/today.sql" <<SQL
\set k :k + 1
\set p (:client_id + :k) % 8
INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, deleted_at,
    writer_process_id, payload_version, payload)
VALUES ($event_fields, now(), 'bench-writer', 1, '{"column": "todo", "status": "open"}'::jsonb)
ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING RETURNING id;
SQL
cat >"$work/proto.sql" <<SQL
\set k :k + 1
\set p (:client_id + :k) % 8
INSERT INTO proto.events (project_id, event_type, event_id, task_id, deleted_at,
    writer_process_id, payload_version, payload)
VALUES ($event_fields, now(), 'bench-writer', 1, '{"column": "todo", "status": "open"}'::jsonb)
ON CONFLICT ON CONSTRAINT events_event_key DO NOTHING RETURNING id;
SQL
cat >"$work/pgq.sql" <<SQL
\set k :k + 1
\set p (:client_id + :k) % 8
SELECT pgq.insert_event('bench_q', :event_type::text, '{"column": "todo", "status": "open"}',
    'p' || :p::text, 'e-' || :client_id::text || '-' || :k::text, 't' || :k::text, now()::text);
SQL

# check VARIANT: every event numbered exactly once, every project's numbers dense from 1.
check() {
    local bad
    case "$1" in
        today) bad=$(sql -c "SELECT count(*) FROM (SELECT project_id FROM outbox.lifecycle_outbox
                     GROUP BY project_id HAVING count(sequence) <> count(*) OR max(sequence) <> count(*)) AS b") ;;
        narrow) bad=$(sql -c "SELECT (SELECT count(*) FROM proto.events) - (SELECT count(DISTINCT (project_id, event_id)) FROM proto.numbers)
                      + (SELECT count(*) FROM (SELECT project_id FROM proto.numbers GROUP BY project_id
                                               HAVING max(sequence) <> count(*)) AS b)
                      + (SELECT count(*) FROM proto.numbers n LEFT JOIN proto.events e USING (project_id, event_id) WHERE e.id IS NULL)") ;;
        tickrows) bad=$(sql -c "WITH u AS (SELECT project_id, first_sequence + k - 1 AS sequence, event_id
                                          FROM proto.tick_rows, unnest(event_ids) WITH ORDINALITY AS x(event_id, k))
                      SELECT (SELECT count(*) FROM proto.events) - (SELECT count(DISTINCT (project_id, event_id)) FROM u)
                      + (SELECT count(*) FROM (SELECT project_id FROM u GROUP BY project_id
                                               HAVING max(sequence) <> count(*) OR count(DISTINCT sequence) <> count(*)) AS b)") ;;
        tidrows|tidrows_async) bad=$(sql -c "WITH u AS (SELECT t.project_id, first_sequence + k - 1 AS sequence, row_id, id
                                         FROM proto.tick_tids AS t, unnest(row_ids, ids) WITH ORDINALITY AS x(row_id, id, k))
                      SELECT (SELECT count(*) FROM proto.events) - (SELECT count(DISTINCT id) FROM u)
                      + (SELECT count(*) FROM (SELECT project_id FROM u GROUP BY project_id
                                               HAVING max(sequence) <> count(*) OR count(DISTINCT sequence) <> count(*)) AS b)
                      + (SELECT count(*) FROM u LEFT JOIN proto.events AS e
                                ON e.ctid = u.row_id AND e.id = u.id AND e.project_id = u.project_id
                         WHERE e.id IS NULL)") ;;
        pgq|writer) bad=0 ;;
    esac
    [ "$bad" = 0 ] || die "$1: numbering check failed ($bad)"
}

: >"$work/runs"
# start_ticker VARIANT: the prototype's sequencer as production runs its own: one client that
# sends each tick as its own transaction (begin, the lock, the tick, commit: four round trips,
# statements prepared once), again at once after a tick that numbered something, otherwise
# after 1 ms (the adaptive tick's shortest wait). A loop inside the server (a procedure) ticks
# far more often, a few events a tick, and its cost per event is then the tick's, not the
# numbering's. stop_ticker ends it; the next `number` finishes what it left.
start_ticker() {
    local tick
    case "$1" in
        narrow) tick=tick_narrow ;;
        tickrows) tick=tick_rows ;;
        tidrows|tidrows_async) tick=tick_tids ;;
    esac
    local commit=on
    [ "$1" != tidrows_async ] || commit=off
    cat >"$work/ticker.sql" <<SQL
BEGIN;
SET LOCAL synchronous_commit = $commit;
SELECT pg_advisory_xact_lock(4242);
SELECT proto.$tick() AS numbered \\gset
COMMIT;
\\if :numbered = 0
\\sleep 1 ms
\\endif
SQL
    pgbench -n -M prepared -c 1 -T $((seconds + 60)) -f "$work/ticker.sql" "$DATABASE_URL" \
        >"$work/ticker.log" 2>&1 &
    background_pid=$!
    sleep 0.3
}
stop_ticker() {
    kill -TERM "$background_pid" 2>/dev/null || true
    wait "$background_pid" 2>/dev/null || true
    background_pid=
    if grep -q ERROR "$work/ticker.log"; then cat "$work/ticker.log" >&2; die "the prototype's ticker failed"; fi
}

# run VARIANT CLIENTS REP: appends "variant clients rep tps wal_per_event cpu_us_per_event".
run() {
    local variant=$1 clients=$2 rep=$3 script threads out
    threads=$(( clients < cores ? clients : cores ))
    reset_state
    case "$variant" in
        today) script=today; start_sequencer ;;
        writer) script=today ;;
        narrow|tickrows|tidrows|tidrows_async) script=proto; start_ticker "$variant" ;;
        pgq) script=pgq; start_call bench-pgq-ticker "CALL bench_pgq_ticker($(( (seconds + 30) * 100 )))" ;;
    esac
    out=$work/pgbench-$variant-$clients-$rep.log
    local lsn0 lsn1 c0 c1
    lsn0=$(wal_lsn); c0=$(cluster_ticks)
    pgbench -n -M prepared -T "$seconds" -c "$clients" -j "$threads" -D k=0 -D event_type=task:deleted \
        -f "$work/$script.sql" "$DATABASE_URL" >"$out" 2>&1 \
        || { cat "$out" >&2; die "pgbench failed ($variant, $clients clients)"; }
    # Let the numbering catch up, so its WAL and CPU are counted.
    sleep 1
    case "$variant" in
        today) stop_sequencer ;;
        narrow|tickrows|tidrows|tidrows_async) stop_ticker ;;
        pgq) stop_call bench-pgq-ticker ;;
        writer) ;;
    esac
    c1=$(cluster_ticks); lsn1=$(wal_lsn)
    [ "$variant" = writer ] || { number "$variant"; check "$variant"; }
    local tps txns wal
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out")
    txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    wal=$(sql -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
    awk -v v="$variant" -v c="$clients" -v r="$rep" -v tps="$tps" -v n="$txns" -v wal="$wal" \
        -v ct=$((c1 - c0)) -v clk="$clk" \
        'BEGIN { printf "%s %s %s %.1f %.0f %.1f\n", v, c, r, tps, wal / n, ct / clk * 1e6 / n }' >>"$work/runs"
    log "$(tail -n 1 "$work/runs")"
}

for clients in $clients_list; do
    for rep in $(seq 1 "$reps"); do
        for variant in $writer_variants; do
            run "$variant" "$clients" "$rep"
        done
    done
done

median() {
    awk -v v="$1" -v c="$2" -v f="$3" '$1 == v && $2 == c { print $f }' "$work/runs" \
        | sort -g | awk '{ x[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            if (NR % 2) print x[(NR + 1) / 2]; else print (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "nan" }'; }

# --- 3. reader -----------------------------------------------------------------------------

log "reader: one project of 100,000 numbered events per design"
reset_state
sql -c "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, deleted_at,
            writer_process_id, payload_version, payload, sequence, sequenced_at)
        SELECT 'r', 'task:deleted', 'e' || n, 't' || n, now(), 'bench', 1, '{\"column\": \"todo\"}', n, now()
        FROM generate_series(1, 100000) AS n" \
    -c "INSERT INTO proto.events (project_id, event_type, event_id, task_id, deleted_at,
            writer_process_id, payload_version, payload)
        SELECT 'r', 'task:deleted', 'e' || n, 't' || n, now(), 'bench', 1, '{\"column\": \"todo\"}'
        FROM generate_series(1, 100000) AS n" \
    -c "INSERT INTO proto.numbers SELECT 'r', n, 'e' || n FROM generate_series(1, 100000) AS n" \
    -c "INSERT INTO proto.tick_rows SELECT 'r', t * 100 + 1, array_agg('e' || (t * 100 + k) ORDER BY k)
        FROM generate_series(0, 999) AS t, generate_series(1, 100) AS k GROUP BY t" \
    -c "INSERT INTO proto.tick_tids SELECT 'r', t * 100 + 1, array_agg(ctid ORDER BY id), array_agg(id ORDER BY id)
        FROM (SELECT ctid, id, (row_number() OVER (ORDER BY id) - 1) / 100 AS t
              FROM proto.events WHERE project_id = 'r') AS e GROUP BY t" \
    -c "VACUUM (ANALYZE) outbox.lifecycle_outbox" -c "VACUUM (ANALYZE) proto.events" \
    -c "VACUUM (ANALYZE) proto.numbers" -c "VACUUM (ANALYZE) proto.tick_rows" \
    -c "VACUUM (ANALYZE) proto.tick_tids" >/dev/null
fetch_today="SELECT sequence, event_id, task_id, deleted_at, payload FROM outbox.lifecycle_outbox
    WHERE project_id = 'r' AND sequence > 50000 ORDER BY sequence LIMIT 500"
fetch_narrow="SELECT n.sequence, e.event_id, e.task_id, e.deleted_at, e.payload
    FROM proto.numbers n JOIN proto.events e ON e.project_id = n.project_id AND e.event_id = n.event_id
    WHERE n.project_id = 'r' AND n.sequence > 50000 ORDER BY n.sequence LIMIT 500"
fetch_tickrows="SELECT t.first_sequence + x.k - 1 AS sequence, e.event_id, e.task_id, e.deleted_at, e.payload
    FROM (SELECT * FROM proto.tick_rows WHERE project_id = 'r' AND first_sequence <= 50001
          ORDER BY first_sequence DESC LIMIT 1) AS first
    CROSS JOIN LATERAL (SELECT * FROM proto.tick_rows WHERE project_id = 'r'
                        AND first_sequence >= first.first_sequence AND first_sequence <= 50500
                        ORDER BY first_sequence) AS t
    CROSS JOIN LATERAL unnest(t.event_ids) WITH ORDINALITY AS x(event_id, k)
    JOIN proto.events e ON e.project_id = t.project_id AND e.event_id = x.event_id
    WHERE t.first_sequence + x.k - 1 > 50000
    ORDER BY 1 LIMIT 500"
# The tick rows that cover sequences 50,001-50,500 (the newest that starts at or before the
# first, and those after it up to the last), as `t`: both reads by address start from them.
tid_ticks="FROM (SELECT * FROM proto.tick_tids WHERE project_id = 'r' AND first_sequence <= 50001
              ORDER BY first_sequence DESC LIMIT 1) AS first
        CROSS JOIN LATERAL (SELECT * FROM proto.tick_tids WHERE project_id = 'r'
                            AND first_sequence >= first.first_sequence AND first_sequence <= 50500
                            ORDER BY first_sequence) AS t"
# By address: the batch's addresses and arrival IDs first (at most 500), then the rows at those
# addresses in one TID scan, kept only where the arrival ID matches.
fetch_tidrows="WITH wanted AS MATERIALIZED (
        SELECT t.first_sequence + x.k - 1 AS sequence, x.row_id, x.id
        $tid_ticks
        CROSS JOIN LATERAL unnest(t.row_ids, t.ids) WITH ORDINALITY AS x(row_id, id, k)
        WHERE t.first_sequence + x.k - 1 > 50000
        ORDER BY 1 LIMIT 500)
    SELECT w.sequence, e.event_id, e.task_id, e.deleted_at, e.payload
    FROM wanted AS w JOIN proto.events AS e ON e.ctid = w.row_id AND e.id = w.id
    WHERE e.ctid = ANY (ARRAY(SELECT row_id FROM wanted))
    ORDER BY w.sequence"
# The by-address read alone, as a consumer would send it beside the read of the tick rows (their
# first numbers and arrival IDs), joining the two itself: the rows in address order.
fetch_tidrows_split="SELECT e.id, e.event_id, e.task_id, e.deleted_at, e.payload FROM proto.events AS e
    WHERE e.ctid = ANY (ARRAY(
        SELECT x.row_id
        $tid_ticks
        CROSS JOIN LATERAL unnest(t.row_ids) WITH ORDINALITY AS x(row_id, k)
        WHERE t.first_sequence + x.k - 1 BETWEEN 50001 AND 50500))"
reader_rows=
for variant in today narrow tickrows tidrows tidrows_split; do
    eval "q=\$fetch_$variant"
    # shellcheck disable=SC2154
    line=$(for _ in $(seq 1 20); do
        sql -c "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) $q" \
            | jq -r '.[0] | "\(.Plan["Shared Hit Blocks"] + .Plan["Shared Read Blocks"]) \(.["Execution Time"]) \(.Plan["Actual Rows"])"'
    done | sort -k2 -g | sed -n 10p)
    reader_rows+="| ${variant/_split/, by address alone} | $(echo "$line" | awk '{ printf "%d | %.3f | %d", $1, $2, $3 }') |"$'\n'
done

# --- report --------------------------------------------------------------------------------

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
{
    echo "# Numbering prototypes under an old snapshot"
    echo
    echo "Produced by \`bench/numbering-prototypes.sh\`$([ "$quick" = 1 ] && echo ' with BENCH_QUICK=1') on $(date -u +%Y-%m-%d)."
    echo "PostgreSQL $(sql -c 'SHOW server_version'), PgQ $(sql -c "SELECT extversion FROM pg_extension WHERE extname = 'pgq'"), $cores cores;"
    echo "load average $load_start at the start, $load_end at the end (the machine is shared: medians of $reps repetitions)."
    echo "Prototypes and their reasoning: \`bench/numbering-prototypes.sql\`."
    echo
    echo "## Buffers per tick under a held snapshot"
    echo
    echo "Events written and numbered while the hold stays open (steps of 10,000), then one tick of 100 events"
    echo "measured with pg_stat_statements: shared buffers (hit + read) of the idle probe and of the tick (for PgQ: a"
    echo "forced tick, next_batch, get_batch_events, finish_batch)."
    echo
    echo "| hold | design | history | probe buffers | tick buffers |"
    echo "|---|---|---:|---:|---:|"
    awk '{ printf "| %s | %s | %d | %d | %d |\n", $1, $2, $3, $4, $5 }' "$work/history"
    echo
    echo "## Writer: events/s, one event per transaction, numbering running"
    echo
    echo "| design | clients | events/s | vs pgq | WAL B/event | vs pgq | cluster CPU µs/event |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for clients in $clients_list; do
        pgq_tps=$(median pgq "$clients" 4); pgq_wal=$(median pgq "$clients" 5)
        for variant in $writer_variants; do
            tps=$(median "$variant" "$clients" 4); wal=$(median "$variant" "$clients" 5)
            printf '| %s | %s | %.0f | %s | %.0f | %s | %.1f |\n' "$variant" "$clients" "$tps" \
                "$(ratio "$tps" "$pgq_tps")" "$wal" "$(ratio "$wal" "$pgq_wal")" "$(median "$variant" "$clients" 6)"
        done
    done
    echo
    echo "## Reader: one fetch of 500 events at sequence 50,000 of 100,000 (median of 20)"
    echo
    echo "| design | shared buffers | ms | rows |"
    echo "|---|---:|---:|---:|"
    printf '%s' "$reader_rows"
} >"$work/report.md"
cp "$work/report.md" "$results_file"
cat "$work/report.md"
