#!/usr/bin/env bash
# The peers' own harness: PgQue's published cross-system method (../shared/peers/pgque/benchmark,
# METHODOLOGY.md and runners/run_r10.sh), run here for PgQ, PgQue and this project, one after
# the other on one cluster, in one run.
#
#   bench/peers-harness.sh                  as published: per system 10 min clean, 30 min with a
#                                           held xmin, 10 min recovery (~2.5 h for three)
#   BENCH_QUICK=1 bench/peers-harness.sh    60 s, 120 s, 60 s per system (~13 min)
#
# The method, per system, in its own fresh database:
#   producer   pgbench, one client, open loop at -R 2000, for the whole run, logging
#              --aggregate-interval=10 (count, latency sums, max) as the authors do
#   consumer   PgQ and PgQue: the authors' consumer.sql (ticker inline, next_batch,
#              get_batch_events, finish_batch) under pgbench, one client, in a tight loop; its
#              NOTICE also carries each event's age (clock_timestamp() - ev_time) so latency
#              is measured the same way for all three. This project: one `outbox consume`
#              (LISTEN, its embedded sequencer, the retention sweep every 30 s with a 30 s
#              retention, the counterpart of the peers' 30 s rotation) printing event lines,
#              stamped as they arrive (age from `deleted_at`, the writer's clock_timestamp())
#   ticker     PgQ: pgq.ticker() every second and maint_operations() every 5 s, as the authors'
#              pgq_ticker_daemon.py (rotation period 30 s). PgQue: pgque.ticker() every 100 ms
#              (its default tick period under pg_cron) and pgque.maint() every 5 s with
#              maint_rotate_tables_step2() in its own transaction, rotation period 30 s
#   phases     clean; held xmin (a REPEATABLE READ transaction that read once and stays idle);
#              recovery (the holder ended); a database-wide VACUUM at each boundary
#   payloads   200 bytes: PgQ and PgQue repeat('x', 200) as the authors' producer.sql; this
#              project `outbox.write_task_deleted` with a 64-character task ID and a prior
#              state of two 64-character fields (the writer's own fields make up the rest)
#
# Columns per phase, as the authors' tables: events produced and consumed per second,
# producer latency (pgbench's, mean over the phase), event age at the consumer (p50/p99),
# dead tuples and total size of the system's tables (largest sample in the phase, every 10 s),
# and backlog (produced - consumed at the phase's end).
#
# Environment:
#   HARNESS_SYSTEMS    systems to run, in order (default "pgq pgque ours")
#   HARNESS_RATE       producer rate, events/s (default 2000)
#   HARNESS_CLEAN, HARNESS_HOLD, HARNESS_RECOVERY   phase lengths in seconds
#   OUTBOX_BENCH_PG_DIR, OUTBOX_BENCH_PG_PORT       the cluster (default .pg-bench-harness, 54374)
#
# The markdown report goes to stdout and bench/RESULTS-peers-harness.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
systems=${HARNESS_SYSTEMS:-"pgq pgque ours"}
rate=${HARNESS_RATE:-2000}
clean=${HARNESS_CLEAN:-$([ "$quick" = 1 ] && echo 60 || echo 600)}
hold=${HARNESS_HOLD:-$([ "$quick" = 1 ] && echo 120 || echo 1800)}
recovery=${HARNESS_RECOVERY:-$([ "$quick" = 1 ] && echo 60 || echo 600)}
pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-harness}
pg_port=${OUTBOX_BENCH_PG_PORT:-54374}
peers=$root/../shared/peers/pgque
results=$root/bench/RESULTS-peers-harness.md
sample_every=10

bench_name=peers-harness.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-peers-harness.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
# shellcheck source=bench/peers-lib.sh
. "$root/bench/peers-lib.sh"

bench_lock "$pg_dir"

pids=()
hold_pid=
bench_cleanup_extra() {
    local pid
    for pid in "${pids[@]}" "$hold_pid"; do
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

[ -f "$peers/sql/pgque.sql" ] || die "PgQue's SQL is missing at $peers/sql/pgque.sql"
log "checking for PgQ"
scripts/pgq.sh ensure >/dev/null || die "PgQ is not installed and could not be installed (run scripts/pgq.sh ensure as root)"

bench_cluster
log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2
bench_bin=$root/target/release/outbox-bench
admin_url=$DATABASE_URL
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# --- per-system setup, producer, consumer and ticker ------------------------------------

# The authors' consumer.sql, schema swapped, with each event's age in milliseconds added to
# its NOTICE (`ev ts=<epoch s> n=<events> ages=<ms,ms,...>`).
consumer_sql() {
    cat <<SQL
DO \$\$
DECLARE
  b bigint;
  n int := 0;
  ages text := '';
BEGIN
  PERFORM $1.ticker('bench_queue');
  SELECT $1.next_batch('bench_queue', 'bench_consumer') INTO b;
  IF b IS NOT NULL THEN
    SELECT count(*), coalesce(string_agg(round(extract(epoch FROM clock_timestamp() - ev_time) * 1000, 1)::text, ','), '')
      INTO n, ages FROM $1.get_batch_events(b);
    PERFORM $1.finish_batch(b);
  END IF;
  RAISE NOTICE 'ev ts=% n=% ages=%', extract(epoch FROM clock_timestamp())::bigint, n, ages;
END \$\$;
SQL
}

start_consumer() {
    case $1 in
    ours)
        mkfifo "$work/lines.fifo"
        "$bench_bin" stamp-lines <"$work/lines.fifo" >"$work/stamps" &
        pids+=($!)
        OUTBOX_LOG=warn "$outbox" consume --project p0 --consumer-id bench --start-from earliest \
            --prune-interval 30s --retention 30s 2>"$work/consumer.err" >"$work/lines.fifo" &
        pids+=($!)
        ;;
    *)
        consumer_sql "$1" >"$work/consumer.sql"
        pgbench -n -c 1 -j 1 -T "$total" -f "$work/consumer.sql" "$DATABASE_URL" \
            >"$work/consumer.out" 2>"$work/consumer.log" &
        pids+=($!)
        PGAPPNAME=bench-ticker sql -c "CALL bench_ticker('$1', $([ "$1" = pgq ] && echo 1000 || echo 100))" >/dev/null 2>"$work/ticker.err" &
        pids+=($!)
        ;;
    esac
}

# sample PHASE: one line: phase, unix s, dead tuples and bytes of the system's tables.
sample() {
    sql -F ' ' -c "
SELECT '$1', extract(epoch FROM now())::bigint,
       coalesce(sum(s.n_dead_tup), 0), coalesce(sum(pg_total_relation_size(s.relid)), 0)
FROM pg_stat_user_tables AS s WHERE s.schemaname = '$schema'"
}

# hold_begin / hold_end: the authors' idle_in_tx: a REPEATABLE READ transaction that read
# once and stays idle, holding the database's xmin back.
hold_begin() {
    mkfifo "$work/hold.fifo"
    PGAPPNAME=idle_in_tx psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 \
        <"$work/hold.fifo" >"$work/hold.out" 2>&1 &
    hold_pid=$!
    exec 8>"$work/hold.fifo"
    echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;" >&8
    local held=
    for _ in $(seq 1 100); do
        held=$(sql -c "SELECT backend_xmin FROM pg_stat_activity
                       WHERE application_name = 'idle_in_tx' AND state = 'idle in transaction'")
        [ -n "$held" ] && break
        sleep 0.1
    done
    [ -n "$held" ] || { cat "$work/hold.out" >&2; die "the holding session did not start"; }
    log "holding xmin $held"
}
hold_end() {
    echo "COMMIT;" >&8
    exec 8>&-
    wait "$hold_pid" || { cat "$work/hold.out" >&2; die "the holding session failed"; }
    hold_pid=
    rm -f "$work/hold.fifo"
}

# run_phase NAME SECONDS: samples every $sample_every seconds for SECONDS.
run_phase() {
    local name=$1 until=$(( $(date +%s) + $2 ))
    echo "$name $(date +%s)" >>"$work/phases"
    sample "$name" >>"$work/samples"
    while (( $(date +%s) < until )); do
        sleep $(( until - $(date +%s) < sample_every ? until - $(date +%s) : sample_every ))
        sample "$name" >>"$work/samples"
    done
}

# --- the runs ------------------------------------------------------------------------------

total=$((clean + hold + recovery))
: >"$work/report-rows"
for system in $systems; do
    case $system in
    pgq) schema=pgq ;;
    pgque) schema=pgque ;;
    ours) schema=outbox ;;
    *) die "unknown system $system (pgq, pgque, ours)" ;;
    esac
    log "$system: $clean s clean, $hold s held xmin, $recovery s recovery at $rate events/s"
    psql "$admin_url" -X -q -c "DROP DATABASE IF EXISTS bench_$system" -c "CREATE DATABASE bench_$system"
    DATABASE_URL=$(sed "s|/postgres?|/bench_$system?|" <<<"$admin_url")
    export DATABASE_URL
    peer_setup "$system"
    : >"$work/phases"
    : >"$work/samples"
    rm -f "$work"/producer_agg* "$work/stamps" "$work/consumer.log" "$work/lines.fifo"
    pids=()
    start_consumer "$system"
    sleep 2
    producer_sql "$system" >"$work/producer.sql"
    pgbench -n -M prepared -c 1 -j 1 -R "$rate" -T "$total" -D k=0 -f "$work/producer.sql" \
        --aggregate-interval=$sample_every --log --log-prefix="$work/producer_agg" \
        "$DATABASE_URL" >"$work/producer.out" 2>&1 &
    producer_pid=$!
    run_phase clean "$clean"
    hold_begin
    sql -c "VACUUM" >/dev/null
    run_phase held "$hold"
    hold_end
    sql -c "VACUUM" >/dev/null
    run_phase recovery "$recovery"
    echo "end $(date +%s)" >>"$work/phases"
    wait "$producer_pid" || { cat "$work/producer.out" >&2; die "$system: the producer failed"; }
    produced_total=$(cat "$work"/producer_agg* | awk '{ n += $2 } END { print n + 0 }')
    sleep 3
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
    # Arrivals: unix ms and age in µs, one line per event consumed.
    case $system in
    ours)
        grep -q . "$work/consumer.err" && { log "$system: the consumer's warnings:"; cat "$work/consumer.err" >&2; }
        awk '{ printf "%.0f %.0f\n", $1, $2 }' "$work/stamps" >"$work/arrivals"
        ;;
    *)
        grep -q 'ERROR' "$work/consumer.log" && { grep ERROR "$work/consumer.log" | head -5 >&2; die "$system: the consumer failed"; }
        notice_arrivals <"$work/consumer.log" >"$work/arrivals"
        ;;
    esac
    consumed_total=$(wc -l <"$work/arrivals")
    log "$system: produced $produced_total, consumed $consumed_total"
    # One row per phase.
    while read -r phase start; do
        [ "$phase" = end ] && continue
        stop=$(awk -v s="$start" '$2 > s { print $2; exit }' "$work/phases")
        produced=$(cat "$work"/producer_agg* | awk -v s="$start" -v e="$stop" '$1 >= s && $1 < e { n += $2 } END { print n + 0 }')
        produced_by_end=$(cat "$work"/producer_agg* | awk -v e="$stop" '$1 < e { n += $2 } END { print n + 0 }')
        # pgbench's latency under -R counts from the scheduled start; the schedule lag (column
        # 7) taken out leaves the transaction itself.
        lat=$(cat "$work"/producer_agg* | awk -v s="$start" -v e="$stop" '$1 >= s && $1 < e { n += $2; t += $3 - $7 } END { printf "%.2f", (n ? t / n / 1000 : 0) }')
        consumed=$(awk -v s="$start" -v e="$stop" '$1 >= s * 1000 && $1 < e * 1000' "$work/arrivals" | wc -l)
        consumed_by_end=$(awk -v e="$stop" '$1 < e * 1000' "$work/arrivals" | wc -l)
        read -r p50 p99 < <(awk -v s="$start" -v e="$stop" '$1 >= s * 1000 && $1 < e * 1000 { print $2 }' "$work/arrivals" | sort -n | awk '
            { x[NR] = $1 } END {
                if (NR == 0) { print "nan nan"; exit }
                printf "%.1f %.1f\n", x[int(0.50 * NR + 0.999999)] / 1000, x[int(0.99 * NR + 0.999999)] / 1000 }')
        read -r dead bytes < <(awk -v p="$phase" '$1 == p { if ($3 > d) d = $3; if ($4 > b) b = $4 } END { print d + 0, b + 0 }' "$work/samples")
        secs=$((stop - start))
        echo "$system $phase $secs $((produced / secs)) $((consumed / secs)) $lat $p50 $p99 $dead $((bytes / 1048576)) $((produced_by_end - consumed_by_end))" >>"$work/report-rows"
    done <"$work/phases"
    psql "$admin_url" -X -q -c "DROP DATABASE bench_$system WITH (FORCE)"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the report ----------------------------------------------------------------------------

{
    echo "# The peers' own harness: PgQ, PgQue and lifecycle-outbox side by side"
    echo
    echo "Produced by \`bench/peers-harness.sh\`$([ "$quick" = 1 ] && echo ' with BENCH_QUICK=1') on $(date -u +%Y-%m-%d):"
    echo "PgQue's published method (../shared/peers/pgque/benchmark: pgbench producer at -R $rate, one"
    echo "consumer, clean / held xmin / recovery), here $clean s / $hold s / $recovery s per system, one"
    echo "system after the other on one cluster. PostgreSQL $(psql "$admin_url" -X -q -t -A -c 'SHOW server_version'), $(nproc) cores;"
    echo "load average $load_start at the start, $load_end at the end."
    echo
    echo "- produced, consumed: events per second over the phase; backlog: produced - consumed at its end."
    echo "- produced/s below the rate: the one producer client could not keep up (pgbench's schedule lag grew)."
    echo "- producer ms: pgbench's mean transaction time (its latency less the schedule lag; the commit included)."
    echo "- age p50/p99: the event's age when the consumer has it: from the producer's transaction"
    echo "  (PgQ's and PgQue's \`ev_time\`, this project's \`deleted_at\`) to \`get_batch_events\`"
    echo "  returning it, or to its line on \`outbox consume\`'s stdout."
    echo "- dead tuples, MiB: the system's tables (\`pg_stat_user_tables\`, its schema), largest sample of the phase."
    echo
    echo "| system | phase | s | produced/s | consumed/s | producer ms | age p50 ms | age p99 ms | dead tuples | MiB | backlog |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 }' "$work/report-rows"
} >"$work/report.md"
cp "$work/report.md" "$results"
cat "$work/report.md"
