#!/usr/bin/env bash
# What one sequencer tick costs the server, alone: the fixed part every tick pays and the part
# each event adds. One client runs, back to back, an insert of N events into N projects (the
# Rust writer's columns, one statement) and then one tick (`lifecycle_outbox_tick`, as the
# sequencer calls it), so every tick numbers exactly those N events; pgbench's per-statement
# latency of the tick is its time in the server plus one local round trip. The same runs with
# `synchronous_commit = off` leave out the commit's wait for the WAL flush (which is I/O, not
# CPU, and shared by concurrent commits). An idle tick (nothing to number) is the probe alone.
#
#   bench/tick-cost.sh                  full run (~3 min): 5 s per run, 3 rounds
#   BENCH_QUICK=1 bench/tick-cost.sh    smoke run (~1 min): 2 s per run, 1 round
#
# Environment:
#   BENCH_SECONDS          seconds per pgbench run (default 5; 2 with BENCH_QUICK=1)
#   BENCH_REPS             rounds (default 3; 1 with BENCH_QUICK=1)
#   BENCH_EVENTS           events per tick (default "1 5 20 50")
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-tick)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54383)
# The markdown report goes to stdout and bench/RESULTS-tick-cost.md; progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
    seconds=${BENCH_SECONDS:-2}
    reps=${BENCH_REPS:-1}
else
    seconds=${BENCH_SECONDS:-5}
    reps=${BENCH_REPS:-3}
fi
events_list=${BENCH_EVENTS:-"1 5 20 50"}
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-tick}
pg_port=${OUTBOX_BENCH_PG_PORT:-54383}
results_file=$root/bench/RESULTS-tick-cost.md

bench_name=tick-cost.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-tick-cost.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

exec 9>"$pg_dir.lock"
if ! flock -n 9; then
    log "another run is using $pg_dir; set OUTBOX_BENCH_PG_DIR and OUTBOX_BENCH_PG_PORT to use another cluster"
    exit 1
fi
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

bench_cluster
"$outbox" migrate >&2
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# The tick exactly as the sequencer sends it (outbox-core's TICK), with its lock key, batch
# and channel.
tick_statement="SELECT locked, project_id, head_sequence, numbered
FROM outbox.lifecycle_outbox_tick(4242, 10000, 'outbox_events');"

# events N: N events in N projects (64 projects in all, a random first one), one statement.
events_statement() {
    cat <<SQL
\\set first random(0, 63)
INSERT INTO outbox.lifecycle_outbox
    (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
     payload_version, payload)
SELECT 'p' || ((:first::int + g) % 64), :event_type::text,
       format('e-%s-%s-%s', :run::text, :k::bigint, g),
       't' || g, now(), 'bench-writer', 1,
       jsonb_build_object('column', 'todo', 'status', 'open')
FROM generate_series(1, $1) AS g;
\\set k :k + 1
SQL
}

printf '%s\n' "$tick_statement" >"$work/idle.sql"
for n in $events_list; do
    { events_statement "$n"; printf '%s\n' "$tick_statement"; } >"$work/tick-$n.sql"
done

# run SHAPE COMMIT REP: appends "shape commit rep tick_ms ticks" to $work/runs.
run() {
    local shape=$1 commit=$2 rep=$3 out options=''
    out=$work/pgbench-$shape-$commit-$rep.log
    [ "$commit" = async ] && options='-c synchronous_commit=off'
    PGOPTIONS=$options pgbench -n -M prepared -r -T "$seconds" -c 1 -D k=0 -D event_type=task:deleted \
        -D run="$shape-$commit-$rep" \
        -f "$work/$shape.sql" "$DATABASE_URL" >"$out" 2>&1 \
        || { cat "$out" >&2; die "pgbench failed ($shape, $commit)"; }
    local tick_ms ticks
    tick_ms=$(awk '/SELECT locked, project_id/ { print $1 }' "$out")
    ticks=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    [ -n "$tick_ms" ] && [ -n "$ticks" ] || { cat "$out" >&2; die "could not parse pgbench output"; }
    # Every event numbered by its own tick: nothing left behind.
    [ "$(sql -c 'SELECT count(*) FROM outbox.lifecycle_outbox_unsequenced')" = 0 ] \
        || die "$shape: events left unnumbered"
    echo "$shape $commit $rep $tick_ms $ticks" >>"$work/runs"
    log "$shape ($commit commit), rep $rep: tick $tick_ms ms over $ticks ticks"
}

: >"$work/runs"
shapes="idle"
for n in $events_list; do shapes="$shapes tick-$n"; done
for rep in $(seq 1 "$reps"); do
    for shape in $shapes; do
        for commit in sync async; do
            run "$shape" "$commit" "$rep"
        done
    done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

median() {
    awk -v s="$1" -v c="$2" '$1 == s && $2 == c { print $4 }' "$work/runs" | sort -g \
        | awk '{ x[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            if (NR % 2) print x[(NR + 1) / 2]; else print (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}

report() {
    local n first last
    first=$(echo "$events_list" | awk '{ print $1 }')
    last=$(echo "$events_list" | awk '{ print $NF }')
    echo "# What one sequencer tick costs"
    echo
    echo "Generated by \`bench/tick-cost.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') at revision \`$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)\`$( [ "$quick" = 1 ] && echo ' (quick mode: not for conclusions)')."
    echo "PostgreSQL $(sql -c 'SHOW server_version'), $(nproc) cores; load average $load_start at the start, $load_end at the end."
    echo
    echo "One client, back to back: an insert of N events into N of 64 projects, then one tick (\`lifecycle_outbox_tick\`, as the sequencer sends it), so each tick numbers exactly those N events; an idle tick has nothing to number (the probe alone). \`pgbench -M prepared -r\`, $seconds s per run, $reps round(s) interleaved, medians of the tick statement's latency (server time plus one local round trip). Async: the same with \`synchronous_commit = off\`, which leaves out the commit's wait for the WAL flush."
    echo
    echo "| tick | ms, synchronous commit | ms, without the flush | the flush, ms |"
    echo "|---|---:|---:|---:|"
    for shape in $shapes; do
        local label=$shape
        [ "$shape" = idle ] && label="idle (nothing to number)"
        [ "$shape" != idle ] && label="${shape#tick-} event(s)"
        printf '| %s | %s | %s | %s |\n' "$label" "$(median "$shape" sync)" "$(median "$shape" async)" \
            "$(awk -v a="$(median "$shape" sync)" -v b="$(median "$shape" async)" 'BEGIN { printf "%.3f", a - b }')"
    done
    echo
    awk -v n1="$first" -v n2="$last" -v t1="$(median "tick-$first" async)" -v t2="$(median "tick-$last" async)" 'BEGIN {
        per = (t2 - t1) / (n2 - n1)
        printf "Without the flush, a tick costs about %.3f ms plus %.0f µs per event (each in a project of its own), from the %s- and %s-event rows.\n", t1 - per * n1, per * 1000, n1, n2 }'
    echo
    echo '## All runs'
    echo
    echo '```'
    echo "shape commit rep tick_ms ticks"
    cat "$work/runs"
    echo '```'
}

report | tee "$results_file.new"
mv "$results_file.new" "$results_file"
log "report written to $results_file"
