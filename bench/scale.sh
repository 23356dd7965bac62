#!/usr/bin/env bash
# Idle cost of many consumer processes: statements and transactions per second that N idle
# `outbox consume` processes send the database, and the connections they hold.
#
#   bench/scale.sh                      50 processes over 5 projects, 20 s measured
#   BENCH_QUICK=1 bench/scale.sh        10 processes, 10 s measured
#
# Environment:
#   SCALE_PROCESSES        idle consumer processes (default 50; 10 quick)
#   SCALE_PROJECTS         projects they are spread over (default 5)
#   SCALE_SECONDS          measured window (default 20; 10 quick)
#   SCALE_BASELINE_BIN     another `outbox` binary (say, an earlier build) measured the same
#                          way first, for a before/after table
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-scale)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54334)
#
# It resets its own disposable cluster with pg_stat_statements loaded, and stops it on exit.
# The markdown report goes to stdout and to bench/RESULTS-scale.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-scale}
pg_port=${OUTBOX_BENCH_PG_PORT:-54334}
quick=${BENCH_QUICK:-0}
processes=${SCALE_PROCESSES:-$([ "$quick" = 1 ] && echo 10 || echo 50)}
projects=${SCALE_PROJECTS:-5}
seconds=${SCALE_SECONDS:-$([ "$quick" = 1 ] && echo 10 || echo 20)}
warmup=6
results=$root/bench/RESULTS-scale.md

bench_name=scale.sh
work=$(mktemp -d)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

pids=()
stop_consumers() {
    local pid
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
bench_cleanup_extra() { stop_consumers; }
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

bench_cluster
log "loading pg_stat_statements"
sql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
pg down >/dev/null
pg up >/dev/null
sql -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"

# measure BINARY LABEL: one row of the table (and the top statements) for one binary.
rows=
top=
estimates=
measure() {
    local binary=$1 label=$2 i project
    log "$label: migrating a fresh schema and starting $processes idle consumers"
    sql -c "DROP SCHEMA IF EXISTS outbox CASCADE"
    "$binary" --database-url "$DATABASE_URL" migrate >/dev/null
    for ((i = 0; i < processes; i++)); do
        project=project-$((i % projects))
        OUTBOX_LOG=warn "$binary" --database-url "$DATABASE_URL" consume \
            --project "$project" --consumer-id "idle-$i" --start-from earliest \
            >"$work/consumer-$i.out" 2>"$work/consumer-$i.err" &
        pids+=($!)
    done
    sleep "$warmup"
    for ((i = 0; i < ${#pids[@]}; i++)); do
        kill -0 "${pids[$i]}" 2>/dev/null || { cat "$work/consumer-$i.err" >&2; die "consumer $i exited"; }
    done
    local xact0 xact1 calls connections
    xact0=$(sql -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
    sql -c "SELECT pg_stat_statements_reset()" >/dev/null
    sleep "$seconds"
    # The calls of everything but this script's own statements.
    calls=$(sql -c "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements
                    WHERE query NOT LIKE '%pg_stat_%' AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
    # The sequencer's probe: sent by every process without the election, by the leader with it.
    local probes
    probes=$(sql -c "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements
                     WHERE query LIKE '%AS pending%' AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
    [ "$label" = "${label#baseline}" ] && estimates+="- $label: $(awk -v c="$calls" -v p="$probes" -v s="$seconds" -v n="$processes" 'BEGIN {
        per = (c - p) / s / n; e = per * 50 + p / s;
        printf "%.2f statements/s per process besides the probes, probes %.1f/s in all; for 50 processes about %.0f statements/s if the probes stay as they are (goal <= 100: %s)", per, p / s, e, (e <= 100 ? "**met**" : "**not met**") }')."$'\n'
    top+="**$label**, statements per second by statement (top 5):"$'\n\n'"| calls/s | statement |"$'\n'"|---:|---|"$'\n'
    top+=$(sql -F $'\t' -c "SELECT round(calls::numeric / $seconds, 1), regexp_replace(left(query, 90), '\s+', ' ', 'g')
                           FROM pg_stat_statements
                           WHERE query NOT LIKE '%pg_stat_%' AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                           ORDER BY calls DESC LIMIT 5" | awk -F '\t' '{ gsub(/\|/, "\\|", $2); printf "| %s | `%s` |\n", $1, $2 }')
    top+=$'\n\n'
    # Idle backends report their counters up to 10 s late: wait for them before reading.
    sleep 11
    xact1=$(sql -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
    connections=$(sql -c "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
    local window=$((seconds + 11))
    rows+="| $label | $processes | $projects | $(awk -v c="$calls" -v s="$seconds" 'BEGIN { printf "%.1f", c / s }') | $(awk -v x=$((xact1 - xact0)) -v s="$window" 'BEGIN { printf "%.1f", x / s }') | $connections |"$'\n'
    stop_consumers
}

if [ -n "${SCALE_BASELINE_BIN:-}" ]; then
    measure "$SCALE_BASELINE_BIN" "baseline ($(basename "$SCALE_BASELINE_BIN"))"
fi
revision=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
measure "$outbox" "this build ($revision)"

report=$(cat <<EOF
# Scale benchmark: idle consumer processes

Generated by \`bench/scale.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC').

Method: a disposable cluster with \`pg_stat_statements\` (top-level statements); per binary, a fresh
schema, then $processes \`outbox consume\` processes with the default configuration (LISTEN,
embedded sequencer, retention sweep at start), spread over $projects projects, one consumer ID
each, and no events. After ${warmup} s of warm-up: statements/s = the sum of
\`pg_stat_statements.calls\` over ${seconds} s (the script's own statements excluded);
transactions/s = the \`pg_stat_database\` \`xact_commit + xact_rollback\` delta over the same
window plus 11 s (idle backends report their counters up to 10 s late); connections = the
backends of the database at the end.

Reading the figures: every statement is sent unnamed, in one round trip and one implicit
transaction, so transactions/s follows statements/s (idle backends report their transaction
counters late, so the two windows do not match exactly). With the
elected sequencer, only the leader probes for unnumbered events (every idle tick, 50 ms) and
every other process sends one lease \`UPDATE\` every 2.5 s (a quarter of the 10 s lease);
without it, every process probes every 10 ms. What remains per process is the consumer's own
fallback poll (\`READ_BATCH\` and the replay-request check, each once per poll interval: 1 s,
or 5 s while its LISTEN connection is up, as it is here), its lease heartbeat (every 10 s) and
its listener's ping (every 5 s).

| binary | processes | projects | statements/s | transactions/s | connections |
|---|---:|---:|---:|---:|---:|
${rows}
The goal of issue 12: 50 idle processes over 5 projects send at most 100 statements/s in all
(with 50 processes running, the default, the line below is the measurement itself; with fewer
it is extrapolated: the per-process rest times 50, plus the probes, which the election keeps
to one process):

${estimates}
${top}
EOF
)
echo "$report"
echo "$report" >"$results"
log "report written to $results"
