#!/usr/bin/env bash
# Throughput at equal latency: PgQ and this project, each configured to meet a commit ->
# consumer latency target with the least work, then measured at full load with that
# configuration, side by side in one run.
#
#   bench/equal-latency.sh                  calibration 60 s per candidate, full-load runs of
#                                           60 s, 3 repetitions (~45 min)
#   BENCH_QUICK=1 bench/equal-latency.sh    20 s per candidate, 20 s runs, 1 repetition (~12 min)
#
# Per system, in its own fresh database:
#   producer   pgbench, 200-byte-class events as bench/peers-harness.sh writes them (PgQ:
#              pgq.insert_event with repeat('x', 200); this project: outbox.write_task_deleted
#              with a 64-character task ID and two 64-character prior fields)
#   consumer   PgQ: a loop of next_batch / get_batch_events / finish_batch that, when no batch
#              is ready, sleeps half a ticker period; this project: one `outbox consume`
#              (LISTEN) printing event lines, stamped as they arrive
#   numbering  PgQ: pgq.ticker() every P, with the queue's ticker_max_lag = P (PgQ's own rule
#              otherwise makes a tick only after 500 events or 3 s); maintenance every 5 s.
#              This project: `outbox sequence --every P --min-tick-pause P --max-tick-pause P`
#              (after a tick that numbered something it pauses P, as PgQ's ticker period does;
#              idle, it backs off up to P)
#
# 1. Calibration: for each latency target (p99 of the event's age at the consumer, from the
#    producer's transaction) the producer runs at -R 2000 with 4 clients; candidates P go from
#    the least work (the longest period) to the most, and the first whose p99 meets the target
#    is the configuration.
# 2. Full load: with each system's configuration per target, pgbench without a rate limit at 8
#    and 32 clients, the consumer and the numbering running: events committed per second
#    (median of the repetitions), WAL bytes per event (everything the cluster wrote during the
#    run, numbering and consumer included), and the p99 age the consumer saw under that load.
#
# Environment:
#   EQUAL_TARGETS_MS   latency targets in ms (default "10 100")
#   EQUAL_RATE         calibration rate, events/s (default 2000)
#   EQUAL_PGQ_PERIODS  PgQ candidates in ms, least work first (default "1000 500 200 100 50 20 10 5 2 1")
#   EQUAL_OURS_PERIODS this project's candidates in ms (default "100 50 20 10 5 2 1"; 100 ms is
#                      --max-tick-pause's ceiling)
#   EQUAL_SECONDS      length of each calibration and full-load run (default 60; 20 quick)
#   BENCH_CLIENTS      client counts of the full-load runs (default "8 32")
#   OUTBOX_BENCH_PG_DIR, OUTBOX_BENCH_PG_PORT   the cluster (default .pg-bench-equal, 54375)
#
# PgQ comes from Debian's postgresql-<major>-pgq3 (scripts/pgq.sh ensure installs it as root).
# The markdown report goes to stdout and bench/RESULTS-equal-latency.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
targets=${EQUAL_TARGETS_MS:-"10 100"}
rate=${EQUAL_RATE:-2000}
pgq_periods=${EQUAL_PGQ_PERIODS:-"1000 500 200 100 50 20 10 5 2 1"}
ours_periods=${EQUAL_OURS_PERIODS:-"100 50 20 10 5 2 1"}
clients_list=${BENCH_CLIENTS:-"8 32"}
calibrate_s=${EQUAL_SECONDS:-$([ "$quick" = 1 ] && echo 20 || echo 60)}
run_s=$calibrate_s
reps=${BENCH_REPS:-$([ "$quick" = 1 ] && echo 1 || echo 3)}
warmup_s=3
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-equal}
pg_port=${OUTBOX_BENCH_PG_PORT:-54375}
results=$root/bench/RESULTS-equal-latency.md

bench_name=equal-latency.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-equal-latency.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
# shellcheck source=bench/peers-lib.sh
. "$root/bench/peers-lib.sh"

for p in $pgq_periods $ours_periods $targets; do
    [[ $p =~ ^[1-9][0-9]*$ ]] || die "periods and targets are positive whole milliseconds, not '$p'"
done
for p in $ours_periods; do
    (( p <= 100 )) || die "this project's periods are at most 100 ms (--max-tick-pause's ceiling), not $p"
done

bench_lock "$pg_dir"

pids=()
bench_cleanup_extra() {
    local pid
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

log "checking for PgQ"
scripts/pgq.sh ensure >/dev/null || die "PgQ is not installed and could not be installed (run scripts/pgq.sh ensure as root)"

bench_cluster
log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2
bench_bin=$root/target/release/outbox-bench
admin_url=$DATABASE_URL
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# fresh_database SYSTEM: an empty database for SYSTEM, set up; exports DATABASE_URL.
fresh_database() {
    psql "$admin_url" -X -q -c "DROP DATABASE IF EXISTS bench_$1 WITH (FORCE)" -c "CREATE DATABASE bench_$1"
    DATABASE_URL=$(sed "s|/postgres?|/bench_$1?|" <<<"$admin_url")
    export DATABASE_URL
    peer_setup "$1"
}

# start_pipeline SYSTEM PERIOD_MS: the numbering and the consumer, in the background.
start_pipeline() {
    local system=$1 period=$2
    rm -f "$work/lines.fifo" "$work/stamps" "$work/consumer.log"
    case $system in
    pgq)
        sql -c "UPDATE pgq.queue SET queue_ticker_max_lag = interval '$period milliseconds' WHERE queue_name = 'bench_queue'"
        PGAPPNAME=bench-ticker sql -c "CALL bench_ticker('pgq', $period)" >/dev/null 2>"$work/ticker.err" &
        pids+=($!)
        cat >"$work/consumer.sql" <<SQL
DO \$\$
DECLARE
  b bigint;
  n int := 0;
  ages text := '';
BEGIN
  SELECT pgq.next_batch('bench_queue', 'bench_consumer') INTO b;
  IF b IS NULL THEN
    PERFORM pg_sleep($period / 2000.0);
  ELSE
    SELECT count(*), coalesce(string_agg(round(extract(epoch FROM clock_timestamp() - ev_time) * 1000, 1)::text, ','), '')
      INTO n, ages FROM pgq.get_batch_events(b);
    PERFORM pgq.finish_batch(b);
    RAISE NOTICE 'ev ts=% n=% ages=%', extract(epoch FROM clock_timestamp())::bigint, n, ages;
  END IF;
END \$\$;
SQL
        pgbench -n -c 1 -j 1 -T 100000 -f "$work/consumer.sql" "$DATABASE_URL" \
            >"$work/consumer.out" 2>"$work/consumer.log" &
        pids+=($!)
        ;;
    ours)
        OUTBOX_LOG=warn "$outbox" sequence --every "${period}ms" --max-tick-pause "${period}ms" \
            --min-tick-pause "${period}ms" \
            >/dev/null 2>"$work/sequencer.err" &
        pids+=($!)
        mkfifo "$work/lines.fifo"
        "$bench_bin" stamp-lines <"$work/lines.fifo" >"$work/stamps" &
        pids+=($!)
        OUTBOX_LOG=warn "$outbox" consume --project p0 --consumer-id bench --start-from earliest \
            --no-sequencer 2>"$work/consumer.err" >"$work/lines.fifo" &
        pids+=($!)
        ;;
    esac
    sleep 2
}

# stop_pipeline SYSTEM: stops what start_pipeline started; writes the arrivals (unix ms and age
# in µs, one line per event consumed) to $work/arrivals.
stop_pipeline() {
    local pid
    sleep 2
    # The ticker's procedure runs on in its backend after its psql is gone: cancelled first.
    [ "$1" = pgq ] && sql -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'bench-ticker'" >/dev/null
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
    case $1 in
    pgq)
        grep -q ERROR "$work/consumer.log" && { grep ERROR "$work/consumer.log" | head -5 >&2; die "pgq: the consumer failed"; }
        notice_arrivals <"$work/consumer.log" >"$work/arrivals"
        ;;
    ours)
        grep -q . "$work/consumer.err" && { log "ours: the consumer's warnings:"; cat "$work/consumer.err" >&2; }
        awk '{ printf "%.0f %.0f\n", $1, $2 }' "$work/stamps" >"$work/arrivals"
        ;;
    esac
}

# p99_from SINCE_MS: the p99 age (ms) of the arrivals from SINCE_MS on, and their count.
p99_from() {
    awk -v s="$1" '$1 >= s { print $2 }' "$work/arrivals" | sort -n | awk '
        { x[NR] = $1 } END {
            if (NR == 0) { print "nan 0"; exit }
            printf "%.1f %d\n", x[int(0.99 * NR + 0.999999)] / 1000, NR }'
}

# calibrate SYSTEM TARGET_MS: sets `period` to the first candidate (least work first) whose
# p99 at $rate events/s meets TARGET_MS, or to "none"; logs each candidate's p99.
calibrate() {
    local system=$1 target=$2 candidate periods p99 n since
    periods=$([ "$system" = pgq ] && echo "$pgq_periods" || echo "$ours_periods")
    for candidate in $periods; do
        fresh_database "$system" >/dev/null
        start_pipeline "$system" "$candidate"
        since=$(( $(date +%s%3N) + warmup_s * 1000 ))
        pgbench -n -M prepared -c 4 -j 2 -R "$rate" -T "$calibrate_s" -D k=0 -f "$work/producer.sql" \
            "$DATABASE_URL" >"$work/producer.out" 2>&1 || { cat "$work/producer.out" >&2; die "$system: the producer failed"; }
        stop_pipeline "$system"
        read -r p99 n < <(p99_from "$since")
        log "$system at $candidate ms: p99 $p99 ms over $n events (target $target ms)"
        echo "$system $target $candidate $p99 $n" >>"$work/calibration"
        if [ "$p99" != nan ] && awk -v p="$p99" -v t="$target" 'BEGIN { exit !(p <= t) }'; then
            period=$candidate
            return
        fi
    done
    period=none
}

# full_load SYSTEM PERIOD CLIENTS: one unthrottled run; appends "tps wal_per_event p99".
full_load() {
    local system=$1 period=$2 clients=$3 wal_before wal_after tps p99 n since events wal
    fresh_database "$system" >/dev/null
    start_pipeline "$system" "$period"
    since=$(( $(date +%s%3N) + warmup_s * 1000 ))
    wal_before=$(sql -c "SELECT pg_current_wal_lsn()")
    pgbench -n -M prepared -c "$clients" -j 2 -T "$run_s" -D k=0 -f "$work/producer.sql" \
        "$DATABASE_URL" >"$work/producer.out" 2>&1 || { cat "$work/producer.out" >&2; die "$system: the producer failed"; }
    wal_after=$(sql -c "SELECT pg_current_wal_lsn()")
    stop_pipeline "$system"
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/producer.out" | head -1)
    events=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/producer.out")
    read -r p99 n < <(p99_from "$since")
    wal=$(sql -c "SELECT round(pg_wal_lsn_diff('$wal_after', '$wal_before') / $events)")
    log "$system at ${period} ms, $clients clients: $tps TPS, $wal WAL bytes/event, p99 $p99 ms over $n events"
    echo "$tps $wal $p99"
}

: >"$work/calibration"
: >"$work/rows"
for target in $targets; do
    for system in pgq ours; do
        producer_sql "$system" >"$work/producer.sql"
        calibrate "$system" "$target"
        echo "$system $target $period" >>"$work/chosen"
        [ "$period" = none ] && { log "$system: no candidate met $target ms"; continue; }
        for clients in $clients_list; do
            : >"$work/reps"
            for _ in $(seq 1 "$reps"); do
                full_load "$system" "$period" "$clients" >>"$work/reps"
            done
            tps=$(awk '{ print $1 }' "$work/reps" | median_of)
            wal=$(awk '{ print $2 }' "$work/reps" | median_of)
            p99=$(awk '{ print $3 }' "$work/reps" | median_of)
            echo "$target $system $period $clients $tps $wal $p99" >>"$work/rows"
        done
    done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the report ----------------------------------------------------------------------------

{
    echo "# Throughput at equal latency: PgQ and lifecycle-outbox"
    echo
    echo "Produced by \`bench/equal-latency.sh\`$([ "$quick" = 1 ] && echo ' with BENCH_QUICK=1') on $(date -u +%Y-%m-%d):"
    echo "PostgreSQL $(psql "$admin_url" -X -q -t -A -c 'SHOW server_version'), $(nproc) cores; load average $load_start at"
    echo "the start, $load_end at the end. Calibration: $calibrate_s s per candidate at -R $rate (4 clients);"
    echo "full load: $run_s s per run, median of $reps. Ages count from the producer's transaction"
    echo "(PgQ's \`ev_time\`, this project's \`deleted_at\`) to the consumer having the event."
    echo
    echo "## Calibration (p99 age at $rate events/s; least work first, the first that meets the target is used)"
    echo
    echo "| system | target ms | period ms | p99 ms | events |"
    echo "|---|---:|---:|---:|---:|"
    awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$work/calibration"
    echo
    echo "## Full load with the calibrated configuration"
    echo
    echo "| target p99 ms | system | period ms | clients | events/s | ours / PgQ | WAL bytes/event | p99 ms under full load |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|"
    awk '{ key = $1 " " $4; if ($2 == "pgq") base[key] = $5; row[NR] = $0 }
        END { for (i = 1; i <= NR; i++) { split(row[i], f, " "); key = f[1] " " f[4]
              ratio = (f[2] == "ours" && base[key] > 0) ? sprintf("%.2f", f[5] / base[key]) : ""
              printf "| %s | %s | %s | %s | %.0f | %s | %s | %s |\n", f[1], f[2], f[3], f[4], f[5], ratio, f[6], f[7] } }' "$work/rows"
    while read -r system target period; do
        [ "$period" = none ] && echo && echo "$system met no candidate for the $target ms target."
    done <"$work/chosen"
} >"$work/report.md"
cp "$work/report.md" "$results"
cat "$work/report.md"
