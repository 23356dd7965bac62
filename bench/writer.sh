#!/usr/bin/env bash
# Writer-cost benchmark: what does recording `task:deleted` inside the delete transaction cost
# the application, and how fast does the sequencer number a backlog?
#
#   bench/writer.sh                  full run (~12 min): 10 s per pgbench run, 3 repetitions
#   BENCH_QUICK=1 bench/writer.sh    smoke run (~2 min): 3 s per run, 1 repetition
#
# Environment:
#   BENCH_SECONDS          seconds per pgbench run (default 10; 3 with BENCH_QUICK=1)
#   BENCH_REPS             repetitions of each interleaved round (default 3; 1 quick)
#   BENCH_CLIENTS          client counts (default "1 8 32")
#   BENCH_BREAKDOWN        1 (default) also runs the cost breakdown at the largest client count
#   BENCH_TASKS            rows in the tasks table (default 1000000)
#   BENCH_BACKLOG          events in the sequencer backlog (default 1000000)
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54331)
#
# It resets its own disposable cluster (never the shared .pg one) and stops it on exit. The
# markdown report goes to stdout and bench/RESULTS-writer.md; progress goes to stderr.
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
breakdown=${BENCH_BREAKDOWN:-1}
n_tasks=${BENCH_TASKS:-1000000}
n_backlog=${BENCH_BACKLOG:-1000000}
n_projects=64
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench}
pg_port=${OUTBOX_BENCH_PG_PORT:-54331}
results_file=$root/bench/RESULTS-writer.md
cores=$(nproc)
clk=$(getconf CLK_TCK)
max_clients=$(printf '%s\n' $clients_list | sort -n | tail -n 1)

bench_name=writer.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-writer-bench.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# --- cluster and binary --------------------------------------------------------------------

bench_cluster

# --- CPU and WAL accounting ----------------------------------------------------------------
#
# On a small machine the server is CPU-bound long before the disk is, so TPS alone mixes the
# writer's cost with whatever else runs on the box. Server CPU per transaction (all processes
# of this cluster) and WAL bytes per transaction explain the TPS and hardly depend on load.

postmaster_pid=$(head -n 1 "$(sql -c 'SHOW data_directory')/postmaster.pid")

# CPU ticks of the cluster: the postmaster, its exited (reaped) children and its live ones.
cluster_ticks() {
    {
        awk '{ print $14 + $15 + $16 + $17 }' "/proc/$postmaster_pid/stat"
        for child in $(ps -o pid= --ppid "$postmaster_pid"); do
            awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || true
        done
    } | awk '{ t += $1 } END { print t + 0 }'
}

# Busy CPU ticks of the whole machine (user, nice, system, irq, softirq; not idle or steal).
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

wal_lsn() { sql -c 'SELECT pg_current_wal_insert_lsn()'; }

# --- data ----------------------------------------------------------------------------------

create_tasks "$n_tasks" "$n_projects"

log "migrating the outbox schema"
"$outbox" migrate >&2

# --- pgbench scripts -----------------------------------------------------------------------
#
# Every transaction deletes a distinct live task: client c's k-th transaction takes slot
# c + k * clients and permute() maps slots to task numbers pseudo-randomly (a new mapping per
# run), so there are no repeats as long as a run stays below $n_tasks transactions; beyond
# that it wraps and repeats become harmless no-ops. Needs pgbench >= 14 (permute).
# pgbench turns every ":word" into a bind parameter, even inside string literals, so SQL text
# here avoids literal colons ('task:deleted' arrives as the variable :event_type).
pick_task='\set k :k + 1
\set n 1 + permute((:client_id + (:k - 1) * :clients) % '"$n_tasks"', '"$n_tasks"')'

# (a) The bare soft delete: BEGIN, UPDATE, COMMIT, as an application's own transaction.
cat >"$work/bare.sql" <<SQL
$pick_task
BEGIN;
UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n::text AND deleted_at IS NULL;
COMMIT;
SQL

# (b) The same delete plus the SQL writer. The UPDATE's RETURNING goes through an aggregate
# so it always yields exactly one row (\gset aborts the client on zero rows); the writer is
# called only when a row was deleted, as an application would.
cat >"$work/sql2.sql" <<SQL
$pick_task
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

# Breakdown: the SQL writer folded into the delete statement (no extra round trip).
cat >"$work/sql1.sql" <<SQL
$pick_task
BEGIN;
WITH d AS (
    UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n::text AND deleted_at IS NULL
    RETURNING project_id, id, deleted_at, column_name, status)
SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'bench-writer',
    jsonb_build_object('column', column_name, 'status', status))
FROM d;
COMMIT;
SQL

# Breakdown: the Rust writer's shape: the delete, then its single INSERT with bound values
# (no plpgsql, no server-side validation beyond the table's constraints).
cat >"$work/rust.sql" <<SQL
$pick_task
BEGIN;
WITH d AS (
    UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n::text AND deleted_at IS NULL
    RETURNING project_id, id, deleted_at, column_name, status)
SELECT count(*) AS hit, max(project_id) AS project_id, max(id) AS task_id,
       max(deleted_at) AS deleted_at, bench_event_id(max(id), max(deleted_at)) AS event_id,
       jsonb_build_object('column', max(column_name), 'status', max(status)) AS payload
FROM d
\gset
\if :hit > 0
$rust_writer_insert
\endif
COMMIT;
SQL

# --- one run -------------------------------------------------------------------------------

# Every run starts from the same state: all tasks live, an empty outbox, no dead tuples, fresh
# statistics and a fresh checkpoint (so each run pays the same full-page writes, and no timed
# checkpoint lands inside a run: every CHECKPOINT restarts the 5-minute clock).
reset_state() {
    sql -c 'TRUNCATE outbox.lifecycle_outbox, outbox.lifecycle_projects, outbox.lifecycle_sequencer_frontier' \
        -c 'UPDATE tasks SET deleted_at = NULL WHERE deleted_at IS NOT NULL'
    sql -c 'VACUUM (ANALYZE) tasks' -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' \
        -c 'VACUUM (ANALYZE) outbox.lifecycle_projects' -c 'CHECKPOINT'
}

# run VARIANT CLIENTS REP [SECONDS]: one measured pgbench run. Variants: bare, outbox (sql2
# plus the sequencer), and the breakdown's rust, sql1, sql2. Appends one line to $work/runs:
# variant clients rep tps latency_ms txns deleted events unsequenced cpu_us wal_b others
run() {
    local variant=$1 clients=$2 rep=$3 duration=${4:-$seconds} script=$1 threads out with_sequencer=0
    threads=$(( clients < cores ? clients : cores ))
    if [ "$variant" = outbox ]; then script=sql2; with_sequencer=1; fi
    reset_state
    [ "$with_sequencer" = 0 ] || start_sequencer
    out=$work/pgbench-$variant-$clients-$rep.log

    local lsn0 lsn1 c0 c1 m0 m1 s_ticks=0 pgbench_cpu
    lsn0=$(wal_lsn); c0=$(cluster_ticks); m0=$(machine_ticks)
    local TIMEFORMAT='%3U %3S'
    { time pgbench -n -M prepared -T "$duration" -c "$clients" -j "$threads" \
        -D k=0 -D clients="$clients" -D event_type=task:deleted \
        -f "$work/$script.sql" "$DATABASE_URL" >"$out" 2>&1; } 2>"$out.cpu" \
        || { cat "$out" >&2; die "pgbench failed ($variant, $clients clients)"; }
    sleep 0.3 # let the postmaster reap the exited backends, so their CPU is counted
    c1=$(cluster_ticks); m1=$(machine_ticks); lsn1=$(wal_lsn)
    pgbench_cpu=$(awk '{ print $1 + $2 }' "$out.cpu")

    local unsequenced=0
    if [ "$with_sequencer" = 1 ]; then
        # What the sequencer had not numbered yet when the writers stopped: its lag.
        unsequenced=$(sql -c 'SELECT count(*) FROM outbox.lifecycle_outbox_unsequenced')
        s_ticks=$(awk '{ print $14 + $15 }' "/proc/$sequencer_pid/stat")
        stop_sequencer
    fi

    local tps latency txns deleted events wal
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out")
    latency=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out")
    txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    [ -n "$tps" ] && [ -n "$latency" ] && [ -n "$txns" ] && [ "$txns" -gt 0 ] \
        || { cat "$out" >&2; die "could not parse pgbench output"; }
    deleted=$(sql -c 'SELECT count(*) FROM tasks WHERE deleted_at IS NOT NULL')
    events=$(sql -c 'SELECT count(*) FROM outbox.lifecycle_outbox')
    wal=$(sql -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
    # One event per effective delete, none for a no-op: the writer contract under load.
    if [ "$variant" != bare ] && [ "$events" -ne "$deleted" ]; then
        die "$variant: $deleted tasks deleted but $events events written"
    fi

    # cpu_us: cluster CPU per transaction; others: cores busy with anything but the cluster,
    # pgbench and the sequencer during the run (other tenants of the machine, kernel threads).
    local line
    line=$(awk -v v="$variant" -v c="$clients" -v r="$rep" -v tps="$tps" -v lat="$latency" \
        -v n="$txns" -v d="$deleted" -v e="$events" -v u="$unsequenced" -v clk="$clk" \
        -v ct=$((c1 - c0)) -v mt=$((m1 - m0)) -v st="$s_ticks" -v pc="$pgbench_cpu" \
        -v wal="$wal" -v secs="$duration" 'BEGIN {
            others = (mt - ct - st) / clk - pc; if (others < 0) others = 0
            printf "%s %s %s %.1f %.3f %d %d %d %d %.0f %.0f %.2f\n", v, c, r, tps, lat, n, d, e, u,
                ct / clk * 1e6 / n, wal / n, others / secs }')
    echo "$line" >>"$work/runs"
    log "$(echo "$line" | awk '{ printf "%-6s c=%-2s rep %s: %8.1f tps %8.3f ms  server %4d us/txn  wal %5d B/txn  hit %5.1f%%  lag %d  others %.2f cores",
        $1, $2, $3, $4, $5, $10, $11, 100 * $7 / $6, $9, $12 }')"
}

# median VARIANT CLIENTS FIELD [REP-PATTERN]: median of one column of $work/runs over the
# matching runs (main runs by default; "^b" selects the breakdown rounds).
median() {
    awk -v v="$1" -v c="$2" -v f="$3" -v p="${4:-^[0-9]}" '$1 == v && $2 == c && $3 ~ p { print $f }' "$work/runs" \
        | sort -g | awk '{ x[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            if (NR % 2) print x[(NR + 1) / 2]; else print (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0) printf "%.3f", b / a; else print "nan" }'; }

# --- writer cost ---------------------------------------------------------------------------

: >"$work/runs"
# Warm the caches (tasks, indexes, plpgsql and plan caches) once, unrecorded.
log "warm-up (unrecorded)"
for variant in bare outbox; do
    run "$variant" "$max_clients" warm $(( seconds < 3 ? seconds : 3 ))
done
: >"$work/runs"

# Interleaved a, b, a, b, ... per client count, so drift (caches, table state, other tenants
# of the machine) hits both variants alike.
started=$(date +%s)
for clients in $clients_list; do
    for rep in $(seq 1 "$reps"); do
        run bare "$clients" "$rep"
        run outbox "$clients" "$rep"
    done
done

# Where the cost goes, one step at a time, at the largest client count: the delete alone; plus
# the Rust writer's INSERT; the SQL writer in the same statement; the SQL writer as its own
# statement (= b without the sequencer); plus the sequencer (= b). Interleaved as well.
breakdown_variants="bare rust sql1 sql2 outbox"
if [ "$breakdown" = 1 ]; then
    for rep in $(seq 1 "$reps"); do
        for variant in $breakdown_variants; do
            run "$variant" "$max_clients" "b$rep"
        done
    done
fi
log "pgbench runs took $(( $(date +%s) - started )) s"

# --- sequencer throughput ------------------------------------------------------------------

log "writing a backlog of $n_backlog unsequenced events"
reset_state
# Direct INSERT with the writer's columns and event_id format (a million plpgsql calls would
# only slow the setup down); projects round-robin as in tasks, so every sequencer batch
# touches all projects, the worst case for its per-project bookkeeping.
sql <<SQL
INSERT INTO outbox.lifecycle_outbox
    (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
     payload_version, payload)
SELECT 'p' || (n % $n_projects), 'task:deleted', bench_event_id('b' || n, ts), 'b' || n, ts,
       'bench-backlog', 1, jsonb_build_object('column', 'todo', 'status', 'open')
FROM generate_series(1, $n_backlog) AS n,
     LATERAL (SELECT timestamptz '2025-01-01 00:00:00+00' + n * interval '1 millisecond') AS t(ts);
SQL
# As autovacuum would have done by the time a real backlog is drained.
sql -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' -c 'CHECKPOINT'

log "draining the backlog with: outbox sequence"
c0=$(cluster_ticks)
t0=$(date +%s.%N)
OUTBOX_LOG=warn "$outbox" sequence >"$work/drain.out" 2>"$work/drain.err" \
    || { cat "$work/drain.err" >&2; die "outbox sequence failed"; }
t1=$(date +%s.%N)
sleep 0.3
c1=$(cluster_ticks)
drained=$(sed -n 's/^numbered \([0-9]*\) event.*/\1/p' "$work/drain.out")
drain_seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
events_per_second=$(awk -v n="$drained" -v s="$drain_seconds" 'BEGIN { printf "%.0f", n / s }')
drain_cpu_us=$(awk -v t=$((c1 - c0)) -v clk="$clk" -v n="$drained" 'BEGIN { printf "%.0f", t / clk * 1e6 / n }')
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
             AND sum(n) = $n_backlog
             AND sum(n) = sum(numbered)
             AND bool_and(lo = 1 AND hi = n AND misplaced = 0)
             AND bool_and(h.head_sequence IS NOT DISTINCT FROM p.hi)
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
settings=$(sql -c "SELECT string_agg(name || ' = ' || current_setting(name), ', ' ORDER BY name)
                   FROM unnest(ARRAY['shared_buffers', 'fsync', 'synchronous_commit',
                        'full_page_writes', 'max_wal_size', 'autovacuum']) AS name")
cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
memory=$(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB" }')
others_median=$(awk '{ print $12 }' "$work/runs" | sort -g | awk '{ x[NR] = $1 } END { print x[int((NR + 1) / 2)] }')
others_max=$(awk '{ print $12 }' "$work/runs" | sort -g | tail -n 1)

report() {
    local clients ta la tb lb ca cb
    echo "# Writer cost benchmark"
    echo
    echo "Generated by \`bench/writer.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC')$( [ "$quick" = 1 ] && echo ' (quick mode: not for conclusions)')."
    echo
    echo "## Machine"
    echo
    echo "- CPU: ${cpu_model:-unknown}, nproc = $cores; memory ${memory:-unknown}"
    echo "- PostgreSQL $pg_version, disposable cluster from \`scripts/pg.sh\` (Unix socket): $settings"
    echo "- pgbench, the sequencer and the server share these $cores CPUs. Everything else on the machine (other tenants, kernel threads) kept a median of $others_median cores (max $others_max) busy during the runs (column \`others\` below): read TPS with that in mind; server µs/txn depends much less on it."
    echo
    echo "## Method"
    echo
    echo "- \`tasks\`: $n_tasks rows over $n_projects projects; primary key on \`id\` (the index the delete uses); \`deleted_at\` not indexed."
    echo "- (a) bare: \`BEGIN; UPDATE tasks SET deleted_at = now() WHERE id = 't' || :n AND deleted_at IS NULL; COMMIT\`."
    echo "- (b) with outbox: the same UPDATE with \`RETURNING\` into pgbench variables (\`\\gset\`), then \`SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'bench-writer', jsonb_build_object('column', column_name, 'status', status))\` in the same transaction, while \`outbox sequence --every 50ms\` runs in the background (started before, stopped after each run)."
    echo "- Task ids: \`\\set n 1 + permute(slot, $n_tasks)\` over a per-client slot counter, i.e. random but without repeats, so every transaction deletes a live row (hit rate in the runs below)."
    echo "- \`pgbench -n -M prepared -T $seconds -c C -j min(C, nproc)\`; per client count, runs interleaved a, b, a, b, ... ($reps pair(s)) after one unrecorded warm-up of each; each cell is the median; ratio = median TPS (b) / median TPS (a)."
    echo "- Before every run: the outbox, its project rows and the sequencer's frontiers truncated, every task undeleted, \`VACUUM (ANALYZE)\` of \`tasks\` and the outbox tables, \`CHECKPOINT\`: every run starts with all tasks live, no dead tuples, the same full-page-write cost and no timed checkpoint inside the run. Autovacuum stays on."
    echo "- After every run with the writer: exactly one event per task deleted (checked)."
    echo "- server µs/txn: CPU time of all processes of the cluster (backends, sequencer's backend, WAL writer, checkpointer, autovacuum) during the run / transactions. WAL B/txn: WAL bytes / transactions."
    echo
    echo "## Results"
    echo
    echo "| clients | bare TPS | bare latency ms | with-outbox TPS | with-outbox latency ms | ratio b/a |"
    echo "|---:|---:|---:|---:|---:|---:|"
    for clients in $clients_list; do
        ta=$(median bare "$clients" 4); la=$(median bare "$clients" 5)
        tb=$(median outbox "$clients" 4); lb=$(median outbox "$clients" 5)
        printf '| %s | %.0f | %.3f | %.0f | %.3f | %s |\n' "$clients" "$ta" "$la" "$tb" "$lb" "$(ratio "$ta" "$tb")"
    done
    echo
    echo "Server CPU per transaction (median µs, bare / with outbox): $(for clients in $clients_list; do
        ca=$(median bare "$clients" 10); cb=$(median outbox "$clients" 10)
        printf '%s at c=%s, ' "$(printf '%.0f / %.0f' "$ca" "$cb")" "$clients"; done | sed 's/, $//')."
    echo
    echo "Sequencer lag: $(sequencer_summary)."
    echo
    if [ "$breakdown" = 1 ]; then
        echo "## Where the cost goes ($max_clients clients)"
        echo
        echo "From (a) to (b) one change at a time; the five variants interleaved, $reps round(s), medians."
        echo
        echo "| variant | what it adds | TPS | latency ms | server µs/txn | WAL B/txn | TPS / bare |"
        echo "|---|---|---:|---:|---:|---:|---:|"
        local v what base
        base=$(breakdown_median bare 4)
        for v in $breakdown_variants; do
            case "$v" in
                bare) what="(a): the delete alone" ;;
                rust) what="(a) + the Rust writer's INSERT as 2nd statement (bound values, no plpgsql)" ;;
                sql1) what="(a) + the SQL writer inside the delete statement (\`WITH d AS (UPDATE ... RETURNING ...) SELECT outbox.write_task_deleted(...) FROM d\`)" ;;
                sql2) what="(a) + the SQL writer as 2nd statement (= b without the sequencer)" ;;
                outbox) what="sql2 + \`outbox sequence --every 50ms\` (= b)" ;;
            esac
            printf '| %s | %s | %.0f | %.3f | %.0f | %.0f | %s |\n' "$v" "$what" \
                "$(breakdown_median "$v" 4)" "$(breakdown_median "$v" 5)" \
                "$(breakdown_median "$v" 10)" "$(breakdown_median "$v" 11)" \
                "$(ratio "$base" "$(breakdown_median "$v" 4)")"
        done
        echo
    fi
    echo "## Sequencer throughput"
    echo
    echo "- Backlog: $n_backlog unsequenced events over $n_projects projects (round-robin), written by a direct \`INSERT ... SELECT\` with the writer's columns and event_id format, then \`VACUUM (ANALYZE)\` and \`CHECKPOINT\`."
    echo "- \`target/release/outbox sequence\` (drain once; default batch of 10000 events per transaction): $drained events in $drain_seconds s = **$events_per_second events/s** (wall clock, including process start and connect); server CPU $drain_cpu_us µs per event."
    echo "- Verification (every row numbered; per project exactly 1..N in arrival order; heads equal to the last number): **$verify**"
    echo
    echo "## Goal"
    echo
    ta=$(median bare 32 4); tb=$(median outbox 32 4)
    if [ "$ta" = nan ] || [ "$tb" = nan ]; then
        echo "b/a >= 0.95 at 32 clients: not measured in this run (32 not in BENCH_CLIENTS)."
    elif awk -v r="$(ratio "$ta" "$tb")" 'BEGIN { exit !(r >= 0.95) }'; then
        echo "b/a >= 0.95 at 32 clients: measured $(ratio "$ta" "$tb"), **met**."
    else
        echo "b/a >= 0.95 at 32 clients: measured $(ratio "$ta" "$tb"), **not met**."
    fi
    echo
    echo "## All runs"
    echo
    echo "Rep \`bN\` = breakdown round N. lag = events still unsequenced when the writers stopped; us/txn = server CPU per transaction; others = cores kept busy by everything else on the machine during the run."
    echo
    echo '```'
    printf '%-6s %3s %3s %9s %8s %7s %7s %7s %5s %7s %6s %6s\n' variant cl rep tps lat_ms txns deleted events lag us/txn B/txn others
    awk '{ printf "%-6s %3s %3s %9s %8s %7s %7s %7s %5s %7s %6s %6s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }' "$work/runs"
    echo '```'
}

breakdown_median() { median "$1" "$max_clients" "$2" '^b'; }

sequencer_summary() {
    awk '$1 == "outbox" && $3 ~ /^[0-9]/ { n++; if ($9 > lag) lag = $9 } END {
        printf "in all %d (b) runs, at most %d event(s) were still unsequenced when the writers stopped", n, lag }' "$work/runs"
}

report | tee "$results_file"
log "report written to $results_file"
case "$verify" in
    PASS*) ;;
    *) exit 1 ;;
esac
