#!/usr/bin/env bash
# Event contracts: what checking a payload against its contract costs the writer, and what
# passing events of undeclared types costs a consumer's catch-up.
#
#   bench/contracts.sh                  full run: 20,000 calls per round, 7 rounds; 200,000-event backlogs, 5 runs
#   BENCH_QUICK=1 bench/contracts.sh    smoke run: 5,000 calls per round, 3 rounds; 50,000 events, 3 runs
#
# 1. Server time per event, `write_event('task:archived', ...)` against `write_task_deleted`,
#    each called in a loop inside one backend, rounds interleaved; the median round of each and
#    their ratio, as the backend's CPU time (user + system from /proc/self/stat, read with
#    pg_read_file: the bench cluster's superuser may; it does not count the time the backend
#    waited for a core, so it holds on a busy host) and as wall time (clock_timestamp).
#    Goal: <= 1.1 x.
# 2. Catch-up of `outbox consume --exit-when-caught-up` (stdout to /dev/null) over a backlog
#    of deletes only, against a backlog of the same size where every other event is a
#    `task:archived` the consumer did not declare; events passed per second (all of them, the
#    skipped included), median of the runs, and the ratio. Goal: >= 0.9 x.
#
# Environment: OUTBOX_BENCH_PG_DIR / OUTBOX_BENCH_PG_PORT (default <project>/.pg-bench, 54331).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
    calls=${BENCH_CALLS:-5000}; rounds=${BENCH_ROUNDS:-3}
    backlog=${BENCH_BACKLOG:-50000}; runs=${BENCH_RUNS:-3}
else
    calls=${BENCH_CALLS:-20000}; rounds=${BENCH_ROUNDS:-7}
    backlog=${BENCH_BACKLOG:-200000}; runs=${BENCH_RUNS:-5}
fi
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench}
pg_port=${OUTBOX_BENCH_PG_PORT:-54331}
results_file=$root/bench/RESULTS-contracts.md

bench_name=contracts.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-contracts-bench.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

bench_cluster
$outbox migrate >/dev/null
$outbox contracts add contracts/task-archived.json --by bench >/dev/null

# write_round KIND: "<wall µs> <CPU µs>" per call of one round of `calls` writes, each to a
# task of its own, inside one transaction that is rolled back (the table stays the same size).
write_round() {
    local call
    case $1 in
        deleted) call="PERFORM outbox.write_task_deleted('b', 't' || i || '-' || r, now(), 'w1',
                         '{\"column\": \"todo\", \"status\": \"open\"}');" ;;
        event) call="PERFORM outbox.write_event('b', 'task:archived', 1, 't' || i || '-' || r,
                         jsonb_build_object('archived_at', now(),
                           'prior', '{\"column\": \"todo\", \"status\": \"open\"}'::jsonb), 'w1');" ;;
    esac
    sql <<SQL
BEGIN;
CREATE TEMP TABLE IF NOT EXISTS timing (us float8, cpu_us float8);
TRUNCATE timing;
DO \$\$
DECLARE
    t0   timestamptz;
    r    text := md5(random()::text);
    -- utime and stime, in clock ticks (fields 14 and 15 of /proc/<pid>/stat).
    cpu0 bigint;
    cpu1 bigint;
    tick float8 := 1e6 / $clk_tck;
BEGIN
    SELECT f[12]::bigint + f[13]::bigint INTO cpu0 FROM regexp_split_to_array(
        split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ') AS f;
    t0 := clock_timestamp();
    FOR i IN 1..$calls LOOP
        $call
    END LOOP;
    SELECT f[12]::bigint + f[13]::bigint INTO cpu1 FROM regexp_split_to_array(
        split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ') AS f;
    INSERT INTO timing VALUES (extract(epoch FROM clock_timestamp() - t0) * 1e6 / $calls,
                               (cpu1 - cpu0) * tick / $calls);
END
\$\$;
SELECT round(us::numeric, 2) || ' ' || round(cpu_us::numeric, 2) FROM timing;
ROLLBACK;
SQL
}

clk_tck=$(getconf CLK_TCK)
log "writer: $rounds interleaved rounds of $calls calls"
deleted_us=(); event_us=(); deleted_cpu=(); event_cpu=()
write_round deleted >/dev/null; write_round event >/dev/null   # warm-up
for _ in $(seq "$rounds"); do
    read -r wall cpu < <(write_round deleted | tail -n 1)
    deleted_us+=("$wall"); deleted_cpu+=("$cpu")
    read -r wall cpu < <(write_round event | tail -n 1)
    event_us+=("$wall"); event_cpu+=("$cpu")
done
d_med=$(printf '%s\n' "${deleted_us[@]}" | median_of)
e_med=$(printf '%s\n' "${event_us[@]}" | median_of)
w_ratio=$(awk -v e="$e_med" -v d="$d_med" 'BEGIN { printf "%.2f", e / d }')
dc_med=$(printf '%s\n' "${deleted_cpu[@]}" | median_of)
ec_med=$(printf '%s\n' "${event_cpu[@]}" | median_of)
c_w_ratio=$(awk -v e="$ec_med" -v d="$dc_med" 'BEGIN { printf "%.2f", e / d }')

# backlog PROJECT MIXED: `backlog` numbered events in PROJECT; MIXED=1 makes every other one
# a task:archived.
make_backlog() {
    local project=$1 mixed=$2
    sql <<SQL
INSERT INTO outbox.lifecycle_outbox
    (project_id, event_type, event_id, task_id, deleted_at, writer_process_id, payload_version,
     payload)
SELECT '$project',
       CASE WHEN $mixed = 1 AND g % 2 = 0 THEN 'task:archived' ELSE 'task:deleted' END,
       CASE WHEN $mixed = 1 AND g % 2 = 0 THEN 'task-archived:t' ELSE 'task-deleted:t' END
           || g || ':2026-01-01T00:00:00.000000Z',
       't' || g,
       CASE WHEN $mixed = 1 AND g % 2 = 0 THEN NULL ELSE timestamptz '2026-01-01' END,
       'w1', 1,
       CASE WHEN $mixed = 1 AND g % 2 = 0
            THEN '{"archived_at": "2026-01-01T00:00:00Z", "prior": {"column": "todo", "status": "open"}}'::jsonb
            ELSE '{"column": "todo", "status": "open"}'::jsonb END
FROM generate_series(1, $backlog) g;
SQL
    $outbox sequence >/dev/null 2>&1
}

log "catch-up: backlogs of $backlog events"
make_backlog all-declared 0
make_backlog half-undeclared 1
sql -c "VACUUM ANALYZE outbox.lifecycle_outbox"

# catch_up PROJECT RUN: events passed per second by a new consumer reading PROJECT from its
# first event to its head.
catch_up() {
    local start end
    start=$(date +%s.%N)
    $outbox consume --project "$1" --consumer-id "bench-$2" --start-from earliest \
        --exit-when-caught-up >/dev/null 2>"$work/consume.log"
    end=$(date +%s.%N)
    awk -v n="$backlog" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", n / (e - s) }'
}

all_rates=(); half_rates=()
for run in $(seq "$runs"); do
    all_rates+=("$(catch_up all-declared "$run")")
    half_rates+=("$(catch_up half-undeclared "$run")")
done
a_med=$(printf '%s\n' "${all_rates[@]}" | median_of)
h_med=$(printf '%s\n' "${half_rates[@]}" | median_of)
c_ratio=$(awk -v h="$h_med" -v a="$a_med" 'BEGIN { printf "%.2f", h / a }')

load=$(cut -d' ' -f1-3 /proc/loadavg)
report=$(cat <<EOF
# Event contracts

$(date -u +%Y-%m-%d), $(nproc) cores, load average at the end: $load$( [ "$quick" = 1 ] && echo ", quick run")

## Writer: server time per event

Backend CPU time (user + system) per call, the figure that holds on a busy host, and wall
time; medians of $rounds interleaved rounds of $calls calls.

| writer | CPU µs per call | wall µs per call | CPU µs per round | wall µs per round |
|---|---:|---:|---|---|
| \`write_task_deleted\` | $dc_med | $d_med | ${deleted_cpu[*]} | ${deleted_us[*]} |
| \`write_event\` (\`task:archived\`@1) | $ec_med | $e_med | ${event_cpu[*]} | ${event_us[*]} |
| ratio | **$c_w_ratio x** (goal <= 1.1 x) | $w_ratio x | | |

## Catch-up over a backlog of $backlog events

| backlog | median events passed per second ($runs runs) | runs |
|---|---:|---|
| all \`task:deleted\` (all declared) | $a_med | ${all_rates[*]} |
| every other one a \`task:archived\` the consumer did not declare | $h_med | ${half_rates[*]} |
| ratio | **$c_ratio x** (goal >= 0.9 x) | |
EOF
)
echo "$report"
echo "$report" >"$results_file"
