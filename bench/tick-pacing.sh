#!/usr/bin/env bash
# The sequencer's pause after a busy tick (`outbox sequence --max-tick-pause`), on and off:
# writer throughput and commit-to-consumer latency at fixed rates and at saturation.
#
#   bench/tick-pacing.sh                  full run (~12 min): 30 s per run, 3 rounds
#   BENCH_QUICK=1 bench/tick-pacing.sh    smoke run (~3 min): 10 s per run, 1 round
#
# One `outbox sequence --every 50ms` numbers (restarted for each run with the pause under
# test); one `outbox consume --all-projects --no-sequencer` prints every event line, stamped as
# it arrives (`outbox-bench stamp-lines`). Writers: pgbench, 8 clients, through the SQL writer
# (`outbox.write_task_deleted`, `clock_timestamp()` as `deleted_at`) over 8 projects, at a
# fixed rate (open loop, `-R`) or as fast as they can (saturation). Latency: `deleted_at` to
# the line on the consumer's stdout, so it holds the writer's commit, the wait for a tick, the
# tick, its NOTIFY and the consumer's read. PG µs/event: CPU of every PostgreSQL process of the
# cluster (writers' backends included) per event written. Ticks/s: numbering ticks that
# numbered something (frontier rows stored). Rounds run the modes interleaved.
#
# Environment:
#   BENCH_SECONDS          seconds per run (default 30; 10 with BENCH_QUICK=1)
#   BENCH_REPS             rounds (default 3; 1 with BENCH_QUICK=1)
#   BENCH_RATES            rates, events/s, "max" for saturation (default "1000 2000 5000 max")
#   BENCH_PAUSES           the --max-tick-pause values compared (default "0s 2ms")
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-pacing)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54384)
# The markdown report goes to stdout and bench/RESULTS-tick-pacing.md; progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
seconds=${BENCH_SECONDS:-$([ "$quick" = 1 ] && echo 10 || echo 30)}
reps=${BENCH_REPS:-$([ "$quick" = 1 ] && echo 1 || echo 3)}
rates=${BENCH_RATES:-"1000 2000 5000 max"}
pauses=${BENCH_PAUSES:-"0s 2ms"}
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-pacing}
pg_port=${OUTBOX_BENCH_PG_PORT:-54384}
results=$root/bench/RESULTS-tick-pacing.md
clk=$(getconf CLK_TCK)

bench_name=tick-pacing.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-tick-pacing.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

consumer_pid=
stamper_pid=
bench_cleanup_extra() {
    local pid
    for pid in "$consumer_pid" "$stamper_pid"; do
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
"$outbox" migrate >&2
sql -c "CREATE TABLE tasks (id text PRIMARY KEY, project_id text NOT NULL, deleted_at timestamptz)"
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
written() { sql -c "SELECT count(*) FROM outbox.lifecycle_outbox"; }
frontiers() { sql -c "SELECT coalesce(max(tick), 0) FROM outbox.lifecycle_sequencer_frontier"; }

log "starting outbox consume --all-projects --no-sequencer"
mkfifo "$work/lines.fifo"
"$bench_bin" stamp-lines <"$work/lines.fifo" >"$work/stamps" &
stamper_pid=$!
OUTBOX_LOG=warn "$outbox" consume --all-projects --no-sequencer --consumer-id bench \
    --start-from earliest 2>"$work/consumer.err" >"$work/lines.fifo" &
consumer_pid=$!
sleep 2
kill -0 "$consumer_pid" 2>/dev/null || { cat "$work/consumer.err" >&2; die "the consumer exited"; }

cat >"$work/writer.sql" <<'SQL'
\set k :k + 1
\set p (:client_id + :k) % 8
SELECT outbox.write_task_deleted('p' || :p::text,
    't' || :run::text || '-' || :client_id::text || '-' || :k::text,
    clock_timestamp(), 'bench-writer', '{"column": "todo", "status": "open"}'::jsonb);
SQL

# settle: waits until the consumer has acknowledged every event written (it acknowledges an
# event once its line is written; `stamp-lines` buffers its own output until the end, so the
# stamps are read only after the consumer stops).
settle() {
    local want i
    want=$(written)
    for i in $(seq 1 1200); do
        [ "$(sql -c "SELECT coalesce(sum(last_acked_sequence), 0) FROM outbox.lifecycle_consumer_cursors
                     WHERE consumer_id = 'bench'")" -ge "$want" ] && return 0
        sleep 0.25
    done
    die "the consumer did not catch up ($want written)"
}

run_no=0
# run PAUSE RATE REP: one run; a line in $work/runs.
run() {
    local pause=$1 rate=$2 rep=$3 rate_args=() before_written before_ticks before_frontiers
    local start_ms end_ms tps cpu_us events ticks_s
    run_no=$((run_no + 1))
    [ "$rate" = max ] || rate_args=(-R "$rate")
    OUTBOX_LOG=warn "$outbox" sequence --every 50ms --max-tick-pause "$pause" \
        >"$work/sequencer.out" 2>"$work/sequencer.err" &
    sequencer_pid=$!
    sleep 0.5
    before_written=$(written)
    before_frontiers=$(frontiers)
    before_ticks=$(cluster_ticks)
    start_ms=$(date +%s%3N)
    pgbench -n -M prepared "${rate_args[@]}" -T "$seconds" -c 8 -j 2 -D k=0 -D run="$run_no" \
        -f "$work/writer.sql" "$DATABASE_URL" >"$work/pgbench-$run_no.log" 2>&1 \
        || { cat "$work/pgbench-$run_no.log" >&2; die "pgbench failed"; }
    settle
    end_ms=$(date +%s%3N)
    cpu_us=$(( ($(cluster_ticks) - before_ticks) * 1000000 / clk ))
    events=$(( $(written) - before_written ))
    ticks_s=$(awk -v n="$(( $(frontiers) - before_frontiers ))" -v s="$seconds" 'BEGIN { printf "%.0f", n / s }')
    stop_sequencer
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench-$run_no.log" | head -n 1)
    echo "$pause $rate $rep $tps $start_ms $end_ms $(( cpu_us / (events > 0 ? events : 1) )) $ticks_s" >>"$work/windows"
    log "pause $pause, rate $rate, round $rep: $tps TPS, $ticks_s ticks/s"
}

: >"$work/windows"
: >"$work/runs"
for ((rep = 1; rep <= reps; rep++)); do
    for rate in $rates; do
        for pause in $pauses; do
            run "$pause" "$rate" "$rep"
        done
    done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
kill -TERM "$consumer_pid"
wait "$consumer_pid" || { cat "$work/consumer.err" >&2; die "the consumer failed"; }
consumer_pid=
wait "$stamper_pid" || die "stamp-lines failed"
stamper_pid=

# Each run's latencies from its window of arrivals.
while read -r pause rate rep tps start_ms end_ms us ticks; do
    read -r p50 p99 < <(awk -v s="$start_ms" -v e="$end_ms" '$1 >= s && $1 <= e { print $2 }' "$work/stamps" | sort -n | awk '
        { x[NR] = $1 } END {
            if (NR == 0) { print "nan nan"; exit }
            printf "%.2f %.2f\n", x[int(0.50 * NR + 0.999999)] / 1000, x[int(0.99 * NR + 0.999999)] / 1000 }')
    echo "$pause $rate $rep $tps $p50 $p99 $us $ticks" >>"$work/runs"
done <"$work/windows"

# --- the report ----------------------------------------------------------------------------

# medians PAUSE RATE: median TPS, p50, p99, µs/event, ticks/s over the rounds.
medians() {
    local col out=
    for col in 4 5 6 7 8; do
        out+="$(awk -v p="$1" -v r="$2" -v c="$col" '$1 == p && $2 == r { print $c }' "$work/runs" | median_of) "
    done
    echo "$out"
}

{
    echo "# The sequencer's pause after a busy tick"
    echo
    echo "Produced by \`bench/tick-pacing.sh\`$([ "$quick" = 1 ] && echo ' with BENCH_QUICK=1') on $(date -u +%Y-%m-%d) at revision \`$(git rev-parse --short HEAD)\`."
    echo "PostgreSQL $(sql -c 'SHOW server_version'), $(nproc) cores; load average $load_start at the start, $load_end at the end."
    echo "pgbench, 8 clients, \`outbox.write_task_deleted\` over 8 projects, $seconds s per run, $reps round(s), modes interleaved;"
    echo "\`outbox sequence --every 50ms --max-tick-pause P\` numbers, one \`outbox consume --all-projects --no-sequencer\` prints."
    echo "Latency: \`deleted_at\` (in the writer's transaction) to the line on the consumer's stdout. PG µs/event: CPU of the"
    echo "whole cluster (writers' backends included) per event. Ticks/s: ticks that numbered something. Medians of the rounds."
    echo
    echo "| rate | --max-tick-pause | TPS | p50 ms | p99 ms | PG µs/event | ticks/s |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for rate in $rates; do
        for pause in $pauses; do
            read -r tps p50 p99 us ticks < <(medians "$pause" "$rate")
            printf '| %s | %s | %.0f | %s | %s | %s | %s |\n' "$rate" "$pause" "$tps" "$p50" "$p99" "$us" "$ticks"
        done
    done
    echo
    echo "## All runs"
    echo
    echo '```'
    echo "pause rate round tps p50_ms p99_ms pg_us_per_event ticks_per_s"
    cat "$work/runs"
    echo '```'
} >"$work/report.md"
cp "$work/report.md" "$results"
cat "$work/report.md"
