#!/usr/bin/env bash
# Retention benchmark: prune 1M eligible events with `outbox prune` (batched deletes) while
# writers run at a fixed rate, and compare the writers' p99 latency during the prune with
# their p99 without it.
#
#   bench/prune.sh                   full run: 1M events, 30 s baseline, batches of 500 and
#                                    5000, 3 repetitions each
#   BENCH_QUICK=1 bench/prune.sh     smoke run: 100k events, 10 s baseline, 1 rep
#
# Environment:
#   BENCH_EVENTS          eligible events to prune (default 1000000; 100000 with BENCH_QUICK=1)
#   BENCH_PROJECTS        projects they are spread over (default 8)
#   BENCH_RATE            writer transactions per second, all clients together (default 200)
#   BENCH_CLIENTS         writer connections (default 4)
#   BENCH_BASELINE        seconds of writing without a prune (default 30; 10 quick)
#   BENCH_BATCHES         prune batch sizes to run, each on a fresh load (default "500 5000")
#   BENCH_REPS            repetitions per batch size (default 3; 1 with BENCH_QUICK=1)
#   OUTBOX_BENCH_PG_DIR   cluster directory (default <project>/.pg-bench-prune)
#   OUTBOX_BENCH_PG_PORT  cluster port (default 54333)
#
# It resets its own disposable cluster (never the shared .pg one) and stops it on exit. The
# markdown report goes to stdout and to bench/RESULTS-prune.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
    n_events=${BENCH_EVENTS:-100000}
    baseline=${BENCH_BASELINE:-10}
    reps=${BENCH_REPS:-1}
else
    n_events=${BENCH_EVENTS:-1000000}
    baseline=${BENCH_BASELINE:-30}
    reps=${BENCH_REPS:-3}
fi
n_projects=${BENCH_PROJECTS:-8}
rate=${BENCH_RATE:-200}
clients=${BENCH_CLIENTS:-4}
batches=${BENCH_BATCHES:-"500 5000"}
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-prune}
pg_port=${OUTBOX_BENCH_PG_PORT:-54333}
results_file=$root/bench/RESULTS-prune.md
cores=$(nproc)
threads=$(( clients < cores ? clients : cores ))

bench_name=prune.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-prune-bench.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
writers_pid=
# The writers' loop ends after its current 5 s chunk once the stop file exists.
bench_cleanup_extra() {
    [ -z "$writers_pid" ] || { touch "$work/stop"; wait "$writers_pid" 2>/dev/null || true; }
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# --- cluster and binary --------------------------------------------------------------------

bench_cluster

load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "migrating the outbox schema"
"$outbox" migrate >&2

# --- the writers' workload -----------------------------------------------------------------

# One writer call per transaction, into the same projects the prune works on (so the writers'
# sequencer numbers events of the very projects whose floors the prune advances). Task IDs are
# random, so a repeat is rare and harmless (AlreadyRecorded).
cat >"$work/write.sql" <<SQL
\set n random(1, 2000000000)
SELECT outbox.write_task_deleted('p' || (:n % $n_projects), 'w' || :client_id || '-' || :n,
    now(), 'bench-writer', jsonb_build_object('column', 'todo', 'status', 'open'));
SQL

# writers PREFIX SECONDS: pgbench at a fixed rate with a per-transaction log. Latency per
# transaction is measured from its scheduled start (pgbench -R), so queueing behind a slow
# transaction counts.
writers() {
    pgbench -n -M prepared -R "$rate" -T "$2" -c "$clients" -j "$threads" -f "$work/write.sql" \
        -l --log-prefix="$work/$1" "$DATABASE_URL" >"$work/$1.out" 2>&1
}

# writer_chunks PREFIX: writers in 5 s runs, back to back, until $work/stop exists. (Each run
# ends by itself, so every log is complete: an asynchronous pgbench ignores SIGINT, and one
# killed otherwise loses its buffered log lines.) Any failed run is recorded in PREFIX.failed.
writer_chunks() {
    local i=0
    rm -f "$work/stop"
    while [ ! -f "$work/stop" ]; do
        writers "$1-$i" 5 || echo "$1-$i" >>"$work/$1.failed"
        i=$((i + 1))
    done
}

# run_writers PREFIX: starts writer_chunks in the background; stop_writers waits for it.
run_writers() {
    rm -f "$work/$1".failed "$work/$1"-*
    writer_chunks "$1" &
    writers_pid=$!
}

stop_writers() {
    touch "$work/stop"
    wait "$writers_pid"
    writers_pid=
    if [ -f "$work/$1.failed" ]; then
        for run in $(cat "$work/$1.failed"); do cat "$work/$run.out" >&2; done
        log "FAIL: a writer run failed"
        exit 1
    fi
}

# latencies PREFIX [FROM TO]: per-transaction latencies in ms (from the pgbench logs of every
# chunk), only of transactions that ended within [FROM, TO] (epoch seconds) when given.
latencies() {
    cat "$work/$1"-*.[0-9]* 2>/dev/null | awk -v from="${2:-0}" -v to="${3:-1e12}" '
        NF >= 6 && $3 >= 0 { t = $5 + $6 / 1e6; if (t >= from && t <= to) print $3 / 1000 }'
}

# stats: count, p50, p99, max of the numbers on stdin.
stats() {
    sort -g | awk '{ x[NR] = $1 } END {
        if (NR == 0) { print "0 nan nan nan"; exit }
        p50 = x[int((NR - 1) * 0.50) + 1]; p99 = x[int((NR - 1) * 0.99) + 1]
        printf "%d %.2f %.2f %.2f\n", NR, p50, p99, x[NR] }'
}

# --- the load ------------------------------------------------------------------------------

# Sequenced events written directly (a 1M-call writer run would only slow the setup), with the
# writer's columns and event_id format, 60 days old; one consumer per project that has
# acknowledged all of them. So every one of them is eligible, and the writers' new events
# (young, not acknowledged) are not.
load() {
    log "loading $n_events eligible events over $n_projects projects"
    sql -c 'TRUNCATE outbox.lifecycle_outbox, outbox.lifecycle_projects,
                     outbox.lifecycle_sequencer_frontier, outbox.lifecycle_deliveries, outbox.lifecycle_consumer_positions,
                     outbox.lifecycle_lease_renewals, outbox.lifecycle_consumers, outbox.lifecycle_audit'
    sql <<SQL
INSERT INTO outbox.lifecycle_outbox
    (project_id, sequence, event_type, event_id, task_id, deleted_at, writer_process_id,
     occurred_at, payload_version, payload, sequenced_at)
SELECT 'p' || (n % $n_projects), n / $n_projects + 1, 'task:deleted',
       'task-deleted:old' || n || ':'
           || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       'old' || n, ts, 'bench-loader', ts, 1,
       jsonb_build_object('column', 'todo', 'status', 'open'), ts
FROM generate_series(0, $n_events - 1) AS n,
     LATERAL (SELECT now() - interval '60 days' + n * interval '1 millisecond') AS t(ts);
INSERT INTO outbox.lifecycle_projects (project_id, pruned_through)
SELECT DISTINCT project_id, 0 FROM outbox.lifecycle_outbox;
INSERT INTO outbox.lifecycle_consumers (project_id, consumer_id)
SELECT project_id, 'bench-consumer' FROM outbox.lifecycle_projects;
INSERT INTO outbox.lifecycle_consumer_positions (project_id, consumer_id, last_acked_sequence)
SELECT project_id, 'bench-consumer', head_sequence FROM outbox.lifecycle_project_heads;
SQL
    sql -c 'VACUUM (ANALYZE) outbox.lifecycle_outbox' -c 'VACUUM (ANALYZE) outbox.lifecycle_projects' \
        -c 'CHECKPOINT'
}

# --- runs ----------------------------------------------------------------------------------

: >"$work/runs"
warm=0
for batch in $batches; do
  for rep in $(seq 1 "$reps"); do
    load
    start_sequencer
    if [ "$warm" = 0 ]; then
        log "warm-up: 5 s of writers (unrecorded)"
        writers warmup-0 5 || { cat "$work/warmup-0.out" >&2; log "pgbench failed"; exit 1; }
        warm=1
    fi

    log "baseline: $baseline s of writers at $rate tx/s, no prune"
    run_writers "base-$batch"
    sleep 1
    b0=$(date +%s.%N)
    sleep "$baseline"
    b1=$(date +%s.%N)
    stop_writers "base-$batch"
    read -r b_n b_p50 b_p99 b_max < <(latencies "base-$batch" "$b0" "$b1" | stats)

    log "prune with batches of $batch while the writers run"
    run_writers "during-$batch"
    sleep 2
    t0=$(date +%s.%N)
    OUTBOX_LOG=warn "$outbox" prune --retention 30d --batch-size "$batch" --output json \
        >"$work/prune-$batch.json" 2>"$work/prune-$batch.err" \
        || { cat "$work/prune-$batch.err" >&2; log "outbox prune failed"; exit 1; }
    t1=$(date +%s.%N)
    stop_writers "during-$batch"
    stop_sequencer
    # pgbench stops a client at its first error and then exits non-zero (checked above); make
    # sure no client gave up silently either.
    if grep -hiE 'aborted|error' "$work"/base-$batch-*.out "$work"/during-$batch-*.out >&2; then
        log "FAIL: a writer transaction failed"
        exit 1
    fi
    read -r d_n d_p50 d_p99 d_max < <(latencies "during-$batch" "$t0" "$t1" | stats)

    seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    # The report's total comes first; each project repeats the field after it.
    pruned=$(grep -o '"events_pruned":[0-9]*' "$work/prune-$batch.json" | head -n 1 | cut -d: -f2)
    per_second=$(awk -v n="$pruned" -v s="$seconds" 'BEGIN { printf "%.0f", n / s }')
    ratio=$(awk -v a="$b_p99" -v b="$d_p99" 'BEGIN { printf "%.2f", b / a }')
    # Exactly the loaded events went; the floor equals the old head everywhere; the writers'
    # events are all retained.
    verify=$(sql <<SQL
SELECT CASE WHEN (SELECT count(*) FROM outbox.lifecycle_outbox WHERE writer_process_id = 'bench-loader') = 0
             AND (SELECT bool_and(pruned_through = $n_events / $n_projects)
                  FROM outbox.lifecycle_projects)
             AND (SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence <= $n_events / $n_projects) = 0
             AND $pruned = $n_events
            THEN 'PASS' ELSE 'FAIL' END
       || format(' (%s events pruned, %s writer events retained, floors %s)', $pruned,
                 (SELECT count(*) FROM outbox.lifecycle_outbox),
                 (SELECT string_agg(DISTINCT pruned_through::text, ',')
                  FROM outbox.lifecycle_projects));
SQL
)
    log "batch $batch rep $rep: $pruned events in $seconds s ($per_second/s); writer p99 ${b_p99} ms -> ${d_p99} ms (x$ratio); $verify"
    echo "$batch $pruned $seconds $per_second $b_n $b_p50 $b_p99 $b_max $d_n $d_p50 $d_p99 $d_max $ratio $rep $verify" >>"$work/runs"
  done
done

# median BATCH FIELD: the median of a column of $work/runs over the repetitions.
median() {
    awk -v b="$1" -v f="$2" '$1 == b { print $f }' "$work/runs" | sort -g | awk '{ x[NR] = $1 } END {
        if (NR % 2) print x[(NR + 1) / 2]; else print (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}

# --- report --------------------------------------------------------------------------------

pg_version=$(sql -c 'SHOW server_version')
settings=$(sql -c "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
                   FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit',
                   'max_wal_size', 'autovacuum')")
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
memory=$(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB" }')
revision=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)

report() {
    echo "# Retention (prune) benchmark"
    echo
    echo "Generated by \`bench/prune.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') at $revision$( [ "$quick" = 1 ] && echo ' (quick mode)')."
    echo
    echo "## Machine"
    echo
    echo "- CPU: ${cpu:-unknown}, nproc = $cores; memory ${memory:-unknown}"
    echo "- PostgreSQL $pg_version (disposable cluster from \`scripts/pg.sh\`, Unix socket): $settings"
    echo "- pgbench, the sequencer and \`outbox prune\` run on the same machine as the server; load average at the start: $load_at_start (other work on the machine shows up as noise in both columns)"
    echo
    echo "## Method"
    echo
    echo "- Load: $n_events sequenced events over $n_projects projects, 60 days old (direct \`INSERT\` with the writer's columns), and one consumer per project whose cursor is at the head: every loaded event is eligible. \`VACUUM (ANALYZE)\`, \`CHECKPOINT\`."
    echo "- Writers: \`pgbench -n -M prepared -R $rate -c $clients -j $threads\`, one \`SELECT outbox.write_task_deleted(...)\` per transaction into the same $n_projects projects; \`outbox sequence --every 50ms\` numbers their events (in the very projects whose floors the prune advances). Latency per transaction from the pgbench log, measured from its scheduled start (so waiting behind a slow transaction counts). One unrecorded 5 s warm-up."
    echo "- The writers run as back-to-back 5 s pgbench runs (so every per-transaction log is complete). Baseline: the transactions that ended within $baseline s of writing without a prune. Then the writers run again and, 2 s in, \`outbox prune --retention 30d --batch-size B\` runs to completion; the transactions that ended while the prune ran are 'during'."
    echo "- Verification after each prune: no loaded event left, every floor at the old head, every writer event retained, \`events_pruned\` = $n_events; no writer transaction failed."
    echo "- The 'during' window lasts only as long as the prune, so its p99 rests on fewer samples than the baseline's (see 'writer tx'): at 200 tx/s about 1500 for an 8 s prune, about 450 for a 2.3 s one, where p99 is roughly the 5th-highest latency. Single runs scatter accordingly; the medians over the repetitions are the figures to read."
    echo
    echo "## Results"
    echo
    echo "Medians over $reps repetition(s):"
    echo
    echo "| batch | prune s | events/s | writer p99 ms without prune | writer p99 ms during prune | p99 ratio |"
    echo "|---:|---:|---:|---:|---:|---:|"
    local batch
    for batch in $batches; do
        printf '| %s | %s | %s | %s | %s | **%s** |\n' "$batch" "$(median "$batch" 3)" \
            "$(median "$batch" 4)" "$(median "$batch" 7)" "$(median "$batch" 11)" "$(median "$batch" 13)"
    done
    echo
    echo "Every run:"
    echo
    echo "| batch | rep | events pruned | prune s | events/s | writer tx (base / during) | writer p50 ms (base / during) | writer p99 ms (base / during) | writer max ms (base / during) | p99 ratio |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk '{ printf "| %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s |\n",
           $1, $14, $2, $3, $4, $5, $9, $6, $10, $7, $11, $8, $12, $13 }' "$work/runs"
    echo
    echo "Verification:"
    echo
    awk '{ v = ""; for (i = 15; i <= NF; i++) v = v (i > 15 ? " " : "") $i; printf "- batch %s rep %s: %s\n", $1, $14, v }' "$work/runs"
    echo
    echo "## Goal"
    echo
    for batch in $batches; do
        awk -v b="$batch" -v r="$(median "$batch" 13)" 'BEGIN {
            printf "Writer p99 during the prune / without it <= 1.5 (batch %s, median): measured %s, **%s**.\n",
                   b, r, (r <= 1.5 ? "met" : "not met") }'
    done
}

report | tee "$results_file"
log "report written to $results_file"
if grep -q FAIL "$work/runs"; then
    exit 1
fi
