#!/usr/bin/env bash
# Old-snapshot benchmark: what one long-held snapshot elsewhere in the database does to
# numbering and delivery while writers keep writing.
#
#   bench/old-snapshot.sh                 60 s baseline, then a REPEATABLE READ snapshot held for
#                                         30 min; then again with an idle-in-transaction session
#                                         that holds a transaction ID (~63 min)
#   BENCH_QUICK=1 bench/old-snapshot.sh   the same with each hold 3 min (~9 min)
#
# One `outbox consume --all-projects` (embedded elected sequencer, LISTEN) prints every event
# line; `outbox-bench stamp-lines` stamps each line as it arrives. Writers: pgbench at a fixed
# rate (open loop, `-R`) through the SQL writer (`outbox.write_task_deleted`, with
# `clock_timestamp()` as `deleted_at`) over 8 projects, one event per transaction. Latency runs
# from the writer's commit (its commit timestamp, `track_commit_timestamp = on`, read through
# the event's `xid`) to the line on the consumer's stdout; both ends read this machine's wall
# clock. The latency from `deleted_at` (inside the writer's transaction, so it also holds the
# rest of the writer's statement and its commit) is reported beside it, as earlier runs
# measured it, and the commit-to-stdout latency is split at the start of the tick that
# numbered the event (`sequenced_at`).
#
# Per window (a minute by default), from the arrival times and pg_stat_statements:
#   p50/p99/max    commit to stdout
#   seq us/event   the sequencer's server time (lock + numbering + NOTIFY + idle probes) per
#                  event it numbered
#   bufs/tick      shared buffers (hit + read) per numbering statement (one per tick)
#   bufs/probe     shared buffers per idle probe of the work list (the frontier's, from migration 10)
#   bufs/read      shared buffers per other statement that reads the event table (the
#                  consumer's fetches and caught-up checks)
#   bufs/ack       shared buffers per cursor write (a position appended from migration 11, an
#                  update of the cursor row before) or lease renewal (a renewal appended from
#                  migration 12, an update of the consumer row before)
#   PG cores       CPU of every PostgreSQL process of the cluster (writers' backends included)
#
# Environment:
#   OLD_SNAPSHOT_RATE      events per second (default 2000)
#   OLD_SNAPSHOT_BASELINE  seconds of each baseline (default 60)
#   OLD_SNAPSHOT_HOLD      seconds each snapshot is held (default 1800; 180 with BENCH_QUICK=1)
#   OLD_SNAPSHOT_WINDOW    seconds per reported window (default 60)
#   OLD_SNAPSHOT_RESULTS   the markdown file (default bench/RESULTS-old-snapshot.md)
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-old-snapshot)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54373)
#
# The machine running this may be shared: every figure is a median or a percentile of one
# window, and the load average is printed with the report. The markdown report goes to stdout
# and to the results file; progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
rate=${OLD_SNAPSHOT_RATE:-2000}
baseline=${OLD_SNAPSHOT_BASELINE:-60}
hold=${OLD_SNAPSHOT_HOLD:-$([ "$quick" = 1 ] && echo 180 || echo 1800)}
window=${OLD_SNAPSHOT_WINDOW:-60}
results=${OLD_SNAPSHOT_RESULTS:-$root/bench/RESULTS-old-snapshot.md}
projects=8
writers=8
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-old-snapshot}
pg_port=${OUTBOX_BENCH_PG_PORT:-54373}
clk=$(getconf CLK_TCK)

bench_name=old-snapshot.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-old-snapshot.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

consumer_pid=
stamper_pid=
writer_pid=
hold_pid=
bench_cleanup_extra() {
    local pid
    for pid in "$writer_pid" "$hold_pid" "$consumer_pid" "$stamper_pid"; do
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

bench_cluster
log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2
bench_bin=$root/target/release/outbox-bench
log "loading pg_stat_statements, tracking commit timestamps"
sql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" \
    -c "ALTER SYSTEM SET track_commit_timestamp = on" >/dev/null
pg down >/dev/null
pg up >/dev/null
sql -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "ALTER SYSTEM SET pg_stat_statements.track = 'all'" -c "SELECT pg_reload_conf()" >/dev/null
"$outbox" migrate >&2
postmaster_pid=$(head -n 1 "$(sql -c 'SHOW data_directory')/postmaster.pid")
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# The table the idle-in-transaction session writes to, so it holds a transaction ID.
sql -c "CREATE TABLE bench_hold (n int)"

# One event per project first, so the consumer set starts with all of them (no discovery
# delay in the first window).
for ((p = 0; p < projects; p++)); do
    sql -c "SELECT outbox.write_task_deleted('p$p', 'seed', clock_timestamp(), 'bench-writer')" >/dev/null
done

# CPU ticks of every process of the cluster (the postmaster's children, living and reaped).
cluster_ticks() {
    {
        awk '{ print $14 + $15 + $16 + $17 }' "/proc/$postmaster_pid/stat"
        for child in $(ps -o pid= --ppid "$postmaster_pid"); do
            awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || true
        done
    } | awk '{ t += $1 } END { print t + 0 }'
}

# sample: one line of counters: unix ms, events numbered (sum of heads), cluster CPU ticks,
# then calls, time (ms) and buffers of: the numbering statement, the sequencer's other
# statements (lock, NOTIFY), the idle probe, other reads of the event table, the consumer's
# cursor writes (acknowledgements, lease renewals). Statements inside functions are tracked
# too (the tick is one function call since migration 14): they give the numbering statement's
# and the probe's calls and buffers (the probe's read inside its function; the call itself is
# a PL/pgSQL expression, which is not tracked), while time is taken from top-level statements
# only (the tick call's includes theirs).
sample() {
    local now ticks
    now=$(date +%s%3N)
    ticks=$(cluster_ticks)
    sql -F ' ' -c "
WITH s AS (
    SELECT calls, CASE WHEN toplevel THEN total_exec_time ELSE 0 END AS ms,
           shared_blks_hit + shared_blks_read AS bufs,
           CASE
               WHEN query LIKE '%PARTITION BY project_id ORDER BY id%'
                    OR query LIKE '%PARTITION BY project_id ORDER BY xid, id%' THEN 'number'
               WHEN query LIKE '%pg_try_advisory_xact_lock%' OR query LIKE '%pg_notify%'
                    OR query LIKE '%lifecycle_outbox_tick(%' THEN 'seq'
               WHEN query LIKE '%sequence IS NULL ORDER BY id LIMIT%'
                    OR query LIKE '%lifecycle_outbox_unsequenced_open%LIMIT%'
                    OR query LIKE '%lifecycle_outbox_unsequenced_exists()%' THEN 'probe'
               WHEN (query LIKE '%INSERT%lifecycle_consumer_positions%' AND query NOT LIKE '%reactivated%')
                    OR query LIKE '%UPDATE%lifecycle_consumer_cursors%'
                    OR query LIKE '%UPDATE%lifecycle_consumers %'
                    OR (query LIKE '%INSERT INTO %lifecycle_lease_renewals%'
                        AND query NOT LIKE '%INSERT INTO %lifecycle_consumers AS c%') THEN 'ack'
               WHEN query LIKE '%lifecycle_outbox%' AND query NOT LIKE '%INSERT%'
                    AND query NOT LIKE '%write_task_deleted%' THEN 'read'
           END AS kind
    FROM pg_stat_statements)
SELECT $now, (SELECT coalesce(sum(head_sequence), 0) FROM outbox.lifecycle_project_heads), $ticks,
       coalesce(sum(calls) FILTER (WHERE kind = 'number'), 0),
       coalesce(sum(ms) FILTER (WHERE kind = 'number'), 0),
       coalesce(sum(bufs) FILTER (WHERE kind = 'number'), 0),
       coalesce(sum(ms) FILTER (WHERE kind = 'seq'), 0),
       coalesce(sum(calls) FILTER (WHERE kind = 'probe'), 0),
       coalesce(sum(ms) FILTER (WHERE kind = 'probe'), 0),
       coalesce(sum(bufs) FILTER (WHERE kind = 'probe'), 0),
       coalesce(sum(calls) FILTER (WHERE kind = 'read'), 0),
       coalesce(sum(bufs) FILTER (WHERE kind = 'read'), 0),
       coalesce(sum(calls) FILTER (WHERE kind = 'ack'), 0),
       coalesce(sum(bufs) FILTER (WHERE kind = 'ack'), 0)
FROM s"
}

# --- the consumer and the writers ----------------------------------------------------------

log "starting outbox consume --all-projects"
mkfifo "$work/lines.fifo"
"$bench_bin" stamp-lines <"$work/lines.fifo" >"$work/stamps" &
stamper_pid=$!
OUTBOX_LOG=warn "$outbox" consume --all-projects --consumer-id bench --start-from earliest \
    2>"$work/consumer.err" >"$work/lines.fifo" &
consumer_pid=$!
sleep 3
kill -0 "$consumer_pid" 2>/dev/null || { cat "$work/consumer.err" >&2; die "the consumer exited"; }

cat >"$work/writer.sql" <<'SQL'
\set k :k + 1
\set p (:client_id + :k) % 8
SELECT outbox.write_task_deleted('p' || :p::text, 't' || :run::text || '-' || :client_id::text || '-' || :k::text,
    clock_timestamp(), 'bench-writer', '{"column": "todo", "status": "open"}'::jsonb);
SQL

run_no=0
# start_writers SECONDS: pgbench at $rate in the background for SECONDS.
start_writers() {
    run_no=$((run_no + 1))
    pgbench -n -M prepared -R "$rate" -T "$1" -c "$writers" -j 2 -D k=0 -D run="$run_no" \
        -f "$work/writer.sql" "$DATABASE_URL" >"$work/pgbench-$run_no.log" 2>&1 &
    writer_pid=$!
}
stop_writers() {
    wait "$writer_pid" || { cat "$work/pgbench-$run_no.log" >&2; die "pgbench failed"; }
    writer_pid=
}

# phase LABEL SECONDS: writers for SECONDS, a sample at every window's end.
phase() {
    local label=$1 seconds=$2 elapsed=0 step
    log "$label: $seconds s"
    start_writers "$seconds"
    echo "$label start $(sample)" >>"$work/samples"
    while ((elapsed < seconds)); do
        step=$(( seconds - elapsed < window ? seconds - elapsed : window ))
        sleep "$step"
        elapsed=$((elapsed + step))
        echo "$label $elapsed $(sample)" >>"$work/samples"
    done
    stop_writers
}

# settle: waits until everything written is numbered and delivered, then vacuums the event
# and consumer tables, so the next baseline starts from clean indexes.
settle() {
    local i
    for i in $(seq 1 600); do
        [ "$(sql -c "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL")" = 0 ] && break
        sleep 0.5
    done
    sleep 2
    log "vacuuming the event and consumer tables"
    sql -c "VACUUM outbox.lifecycle_outbox, outbox.lifecycle_consumers, outbox.lifecycle_consumer_positions, outbox.lifecycle_lease_renewals"
}

: >"$work/samples"
started=$(date +%s)
phase "baseline-1" "$baseline"
hold_start snapshot
phase "snapshot" "$hold"
hold_stop
settle
phase "baseline-2" "$baseline"
hold_start xid
phase "xid" "$hold"
hold_stop
settle
total_seconds=$(( $(date +%s) - started ))
sleep 2
kill -TERM "$consumer_pid"
wait "$consumer_pid" || { cat "$work/consumer.err" >&2; die "the consumer failed"; }
consumer_pid=
# What the consumer warned about (a failed step, a lost lease) explains a stall in a window.
if [ -s "$work/consumer.err" ]; then
    log "the consumer's warnings:"
    cat "$work/consumer.err" >&2
fi
# The stamper ends with the consumer's stdout.
wait "$stamper_pid" || die "stamp-lines failed"
stamper_pid=
written=$(sql -c "SELECT count(*) FROM outbox.lifecycle_outbox")
delivered=$(wc -l <"$work/stamps")
lag_max=$(cat "$work/pgbench-"*.log | sed -n 's/^rate limit schedule lag: avg [0-9.]* (max \([0-9.]*\)) ms.*/\1/p' | sort -g | tail -n 1)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the report ----------------------------------------------------------------------------

# rows: one per window: phase, end (s into the phase), events/s, p50, p99, max (ms),
# seq us/event, bufs/tick, bufs/probe, bufs/read, PG cores.
awk -v clk="$clk" '
    $2 == "start" { prev[$1] = $0; next }
    {
        # fields: label elapsed ms heads ticks ncalls nms nbufs seqms pcalls pms pbufs rcalls
        # rbufs acalls abufs
        split(prev[$1], a, " ")
        dt = ($3 - a[3]) / 1000
        events = $4 - a[4]
        ncalls = $6 - a[6]; pcalls = $10 - a[10]; rcalls = $13 - a[13]; acalls = $15 - a[15]
        seq_ms = ($7 - a[7]) + ($9 - a[9]) + ($11 - a[11])
        printf "%s %s %.0f %.0f %.1f %.1f %.1f %.1f %.2f %.2f %.2f\n", $1, $2, a[3], $3,
            events / dt, (events > 0 ? seq_ms * 1000 / events : 0),
            (ncalls > 0 ? ($8 - a[8]) / ncalls : 0),
            (pcalls > 0 ? ($12 - a[12]) / pcalls : 0),
            (rcalls > 0 ? ($14 - a[14]) / rcalls : 0),
            (acalls > 0 ? ($16 - a[16]) / acalls : 0),
            ($5 - a[5]) / clk / dt
        prev[$1] = $0
    }' "$work/samples" >"$work/windows"

# Each arrival joined to its event: arrival ms, then commit to stdout, commit to the start of
# the numbering tick, and that start to stdout (µs).
sql -c "CREATE TABLE bench_arrivals (arrival_ms bigint, since_deleted_us bigint, project_id text,
                                     sequence bigint, arrival_us bigint)" \
    -c "\\copy bench_arrivals FROM '$work/stamps' WITH (DELIMITER ' ')"
sql -F ' ' -c "
WITH e AS (
    SELECT a.arrival_ms, a.arrival_us,
           (extract(epoch FROM pg_xact_commit_timestamp(o.xid::xid)) * 1e6)::bigint AS commit_us,
           (extract(epoch FROM o.sequenced_at) * 1e6)::bigint AS numbered_us
    FROM bench_arrivals AS a
    JOIN outbox.lifecycle_outbox AS o USING (project_id, sequence))
SELECT arrival_ms, arrival_us - commit_us, numbered_us - commit_us, arrival_us - numbered_us
FROM e ORDER BY arrival_ms" >"$work/commits"
joined=$(wc -l <"$work/commits")
[ "$joined" -eq "$delivered" ] || die "$delivered lines delivered but $joined joined to their events"

# percentiles FILE COLUMN START_MS END_MS: p50 p99 max (ms) of column COLUMN (µs) of FILE over
# the arrivals in the window.
percentiles() {
    awk -v c="$2" -v s="$3" -v e="$4" '$1 >= s && $1 < e { print $c }' "$1" | sort -n | awk '
        { x[NR] = $1 }
        END {
            if (NR == 0) { print "nan nan nan"; exit }
            r50 = int(0.50 * NR + 0.999999); r99 = int(0.99 * NR + 0.999999)
            printf "%.1f %.1f %.1f\n", x[r50] / 1000, x[r99] / 1000, x[NR] / 1000
        }'
}

: >"$work/rows"
# rows: as windows, with commit-to-stdout percentiles; split: per window, p50 and p99 from
# deleted_at, from commit to the numbering tick, and from that tick to stdout.
: >"$work/split"
while read -r label end s e eps seq_us bt bp br ba cores; do
    read -r p50 p99 max < <(percentiles "$work/commits" 2 "$s" "$e")
    echo "$label $end $eps $p50 $p99 $max $seq_us $bt $bp $br $ba $cores" >>"$work/rows"
    read -r d50 d99 _ < <(percentiles "$work/stamps" 2 "$s" "$e")
    read -r n50 n99 _ < <(percentiles "$work/commits" 3 "$s" "$e")
    read -r t50 t99 _ < <(percentiles "$work/commits" 4 "$s" "$e")
    echo "$label $end $d50 $d99 $n50 $n99 $t50 $t99" >>"$work/split"
done <"$work/windows"

# Goals, for each hold against the baseline before it: the last window's p99 at most 1.5x the
# baseline's and at most 10 ms; server time per event within 20 % of the baseline's.
goals=
for pair in "baseline-1 snapshot" "baseline-2 xid"; do
    set -- $pair
    base=$(awk -v l="$1" '$1 == l' "$work/rows" | tail -n 1)
    last=$(awk -v l="$2" '$1 == l' "$work/rows" | tail -n 1)
    goals+=$(awk -v b="$base" -v l="$last" -v name="$2" 'BEGIN {
        split(b, x, " "); split(l, y, " ")
        p99ok = (y[5] <= 1.5 * x[5] && y[5] <= 10) ? "met" : "missed"
        seqok = (y[7] >= 0.8 * x[7] && y[7] <= 1.2 * x[7]) ? "met" : "missed"
        printf "- %s, last window: p99 %.1f ms against a baseline of %.1f ms (goal <= %.1f and <= 10): **%s**; sequencer %.1f us/event against %.1f (goal +/-20 %%): **%s**\n",
            name, y[5], x[5], 1.5 * x[5], p99ok, y[7], x[7], seqok }')$'\n'
done

{
    echo "# Old snapshots: numbering and delivery under a held snapshot"
    echo
    echo "Produced by \`bench/old-snapshot.sh\`$([ "$quick" = 1 ] && echo ' with BENCH_QUICK=1') on $(date -u +%Y-%m-%d)."
    echo "PostgreSQL $(sql -c 'SHOW server_version'), $(nproc) cores; load average $load_start at the start, $load_end at the end."
    echo "Writers: pgbench at $rate events/s (open loop) through \`outbox.write_task_deleted\` over $projects projects, $writers clients;"
    echo "one \`outbox consume --all-projects\` with its embedded sequencer and LISTEN. Baselines of $baseline s;"
    echo "each hold $hold s; windows of $window s. $written events written, $delivered lines delivered, $total_seconds s in all;"
    echo "largest writer schedule lag ${lag_max:-?} ms."
    echo
    echo "Latency: the writer's commit (its commit timestamp, \`track_commit_timestamp = on\`) to the line on stdout."
    echo "seq µs/event: the sequencer's server time (lock, numbering, NOTIFY, idle probes; pg_stat_statements) per event numbered; since schema version 14 the tick is one function call, whose time includes its statements' executor start-up, which top-level statements' times leave out, so compare it within one build only."
    echo "bufs/tick: shared buffers per numbering statement; bufs/probe: per idle probe of the work list;"
    echo "bufs/read: per other statement reading the event table (the consumer's fetches and caught-up checks);"
    echo "bufs/ack: per cursor write (acknowledgements: a position appended from migration 11, an update of the cursor row before) or lease renewal (appended from migration 12, an update of the consumer row before). PG cores: every PostgreSQL process, the writers' backends included."
    echo "Each row is one window: its percentiles, and totals divided by counts. The machine is shared with other work,"
    echo "so single windows are noisy; the trend across windows is the result."
    echo
    echo "| phase | s | events/s | p50 ms | p99 ms | max ms | seq µs/event | bufs/tick | bufs/probe | bufs/read | bufs/ack | PG cores |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk '{ printf "| %s | %s | %.0f | %s | %s | %s | %.1f | %.0f | %.0f | %.1f | %.1f | %.2f |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }' "$work/rows"
    echo
    echo "Where the time goes, per window (ms): from \`deleted_at\` (\`clock_timestamp()\` in the writer's"
    echo "statement, as earlier runs measured) to stdout; from the commit to the start of the tick that"
    echo "numbered the event (\`sequenced_at\`: the tick's transaction start); from that start to stdout"
    echo "(the tick, its commit, the NOTIFY, the consumer's read and its line)."
    echo
    echo "| phase | s | deleted_at p50 | deleted_at p99 | to the tick p50 | to the tick p99 | tick to stdout p50 | tick to stdout p99 |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }' "$work/split"
    echo
    echo "Goals (issue 21):"
    echo
    printf '%s' "$goals"
} >"$work/report.md"

cp "$work/report.md" "$results"
cat "$work/report.md"
[ "$delivered" -ge $((written)) ] || log "warning: $written events written but $delivered lines delivered"
