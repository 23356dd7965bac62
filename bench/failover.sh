#!/usr/bin/env bash
# Failover benchmark: a primary and a synchronous streaming standby (pg_basebackup -R), one
# `outbox consume` on the multi-host URL with target_session_attrs=read-write, writers
# committing through the same URL. Each round stops the primary at once, promotes the
# standby and measures the time from the promotion until the first event committed on the
# new primary is delivered (goal: at most 2 x the lease TTL), and counts the events delivered
# twice across the failover (goal: at most one batch). Median of the rounds.
#
#   bench/failover.sh                  5 rounds
#   BENCH_QUICK=1 bench/failover.sh    2 rounds
#
# Environment: BENCH_FAILOVER_ROUNDS (5), BENCH_FAILOVER_LEASE_TTL (5s),
# OUTBOX_BENCH_PG_DIR (<project>/.pg-bench-failover; the nodes live in -a and -b beside it),
# OUTBOX_BENCH_PG_PORT (54342). The report goes to stdout and to bench/RESULTS-failover.md;
# progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

base=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-failover}
pg_port=${OUTBOX_BENCH_PG_PORT:-54342}
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    rounds=${BENCH_FAILOVER_ROUNDS:-2}
else
    rounds=${BENCH_FAILOVER_ROUNDS:-5}
fi
lease_ttl=${BENCH_FAILOVER_LEASE_TTL:-5s}
batch_size=500

bench_name=failover.sh
pg_dir=$base-a
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

exec 9>"$base.lock"
if ! flock -n 9; then
    log "another run is using $base; set OUTBOX_BENCH_PG_DIR and OUTBOX_BENCH_PG_PORT"
    exit 1
fi
work=$(mktemp -d)
consumer_pid=
writer_pids=()
bench_cleanup_extra() {
    for pid in "${writer_pids[@]}" $consumer_pid; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    OUTBOX_PG_DIR=$base-b OUTBOX_PG_PORT=$pg_port scripts/pg.sh down >/dev/null 2>&1 || true
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

bindir=$(pg_config --bindir)
[ -x "$bindir/pg_ctl" ] || bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_owner() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
standby() { OUTBOX_PG_DIR=$base-b OUTBOX_PG_PORT=$pg_port scripts/pg.sh "$@"; }

bench_cluster
user=${DATABASE_URL#postgresql://}
user=${user%%@*}
node_url() { echo "postgresql://$user@/postgres?host=$1/run&port=$pg_port"; }
multi="postgresql://$user@/postgres?host=$base-a/run,$base-b/run&port=$pg_port,$pg_port&target_session_attrs=read-write"

# new_pair: a fresh primary and a standby made from it, then synchronous_standby_names = '*'
# on the primary (the standby, promoted, has none).
new_pair() {
    standby down >/dev/null 2>&1 || true
    rm -rf "$base-b"
    DATABASE_URL=$(pg reset)
    export DATABASE_URL
    "$outbox" migrate >/dev/null
    sql -c "CREATE TABLE tasks (id text PRIMARY KEY, project_id text NOT NULL, deleted_at timestamptz)"
    mkdir -p "$base-b/run"
    [ "$(id -u)" -ne 0 ] || chown -R postgres: "$base-b"
    as_owner "$bindir/pg_basebackup" -D "$base-b/data" -R -X stream -c fast \
        -h "$base-a/run" -p "$pg_port" -U "$user"
    echo "unix_socket_directories = '$base-b/run'" >>"$base-b/data/postgresql.conf"
    standby up >/dev/null
    # Synchronous from now on (before, a commit would wait for a standby that is not there).
    sql -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null
}

# writer N: commits events through the multi-host URL until killed, retrying across the
# failover; prints nothing.
writer() {
    local n=0
    while :; do
        n=$((n + 1))
        psql "$multi" -X -q -t -A -c \
            "SELECT outbox.write_task_deleted('p', 'w$1-$n-$RANDOM', now(), 'bench-writer')" \
            >/dev/null 2>&1 || sleep 0.05
    done
}

delivered() { grep -c '"type":"event"' "$work/consume.out" 2>/dev/null || true; }

latencies=()
duplicates=()
for round in $(seq 1 "$rounds"); do
    log "round $round of $rounds: a fresh primary and standby"
    new_pair
    : >"$work/consume.out"
    OUTBOX_LOG=warn "$outbox" --database-url "$multi" consume --project p --consumer-id bench \
        --start-from earliest --lease-ttl "$lease_ttl" --batch-size "$batch_size" \
        >"$work/consume.out" 2>"$work/consume.err" &
    consumer_pid=$!
    writer_pids=()
    for w in 1 2; do
        writer "$w" &
        writer_pids+=($!)
    done
    while [ "$(delivered)" -lt 300 ]; do sleep 0.1; done
    as_owner "$bindir/pg_ctl" -D "$base-a/data" -m immediate -w stop >/dev/null
    as_owner "$bindir/pg_ctl" -D "$base-b/data" -w -t 60 promote >/dev/null
    promoted=$(date +%s.%N)
    # The first event committed on the new primary: one written right after the promotion.
    id=$(psql "$(node_url "$base-b")" -X -q -t -A -c \
        "SELECT outbox.write_task_deleted('p', 'first-after-$round', now(), 'bench-probe')")
    until grep -qF "\"event_id\":\"$id\"" "$work/consume.out"; do sleep 0.01; done
    arrived=$(date +%s.%N)
    latency=$(echo "$arrived - $promoted" | bc -l)
    latencies+=("$latency")
    sleep 1
    for pid in "${writer_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    writer_pids=()
    DATABASE_URL=$(node_url "$base-b")
    export DATABASE_URL
    head=$(sql -c "SELECT COALESCE(max(head_sequence), 0) FROM outbox.lifecycle_project_heads WHERE project_id = 'p'")
    "$outbox" sequence >/dev/null
    head=$(sql -c "SELECT COALESCE(max(head_sequence), 0) FROM outbox.lifecycle_project_heads WHERE project_id = 'p'")
    until [ "$(sql -c "SELECT last_acked_sequence FROM outbox.lifecycle_consumer_cursors WHERE consumer_id = 'bench'")" = "$head" ]; do
        sleep 0.1
    done
    kill -INT "$consumer_pid"
    wait "$consumer_pid" || true
    consumer_pid=
    twice=$(grep '"type":"event"' "$work/consume.out" | sed -E 's/.*"event_id":"([^"]*)".*/\1/' | sort | uniq -d | wc -l)
    total=$(sql -c "SELECT count(*) FROM outbox.lifecycle_outbox WHERE project_id = 'p'" )
    got=$(grep '"type":"event"' "$work/consume.out" | sed -E 's/.*"event_id":"([^"]*)".*/\1/' | sort -u | wc -l)
    reconciled=$(grep -c '"type":"reconcile"' "$work/consume.out" || true)
    duplicates+=("$twice")
    log "round $round: promotion to first new event $(printf '%.3f' "$latency") s; $twice delivered twice; $got of $total events delivered; $reconciled reconciliations"
    [ "$got" = "$total" ] || die "round $round: $got of $total events delivered"
    [ "$reconciled" = 0 ] || die "round $round: the synchronous failover reconciled"
    DATABASE_URL=$(node_url "$base-a")
    export DATABASE_URL
done

median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ttl_seconds=$(echo "$lease_ttl" | sed -E 's/s$//')
median_latency=$(median "${latencies[@]}")
max_twice=$(printf '%s\n' "${duplicates[@]}" | sort -n | tail -n 1)
report=$(cat <<EOF
# Failover benchmark

\`bench/failover.sh\` ($(date -u +%Y-%m-%d), $(nproc) cores, PostgreSQL $("$bindir/postgres" --version | awk '{print $3}')):
a primary and a synchronous streaming standby on Unix sockets, one \`outbox consume\` on the
multi-host URL with \`target_session_attrs=read-write\` (lease TTL $lease_ttl, batch
$batch_size), two writers committing through the same URL. Each round stops the primary
immediately (\`pg_ctl stop -m immediate\`), promotes the standby, and writes one event on it.

| round | promotion → first new event delivered (s) | events delivered twice |
|---|---|---|
$(for i in "${!latencies[@]}"; do printf '| %d | %.3f | %s |\n' "$((i + 1))" "${latencies[$i]}" "${duplicates[$i]}"; done)

- Median time from the promotion to the delivery of the first event committed on the new
  primary: **$(printf '%.3f' "$median_latency") s** (goal ≤ 2 × lease TTL = $(echo "2 * $ttl_seconds" | bc) s).
- Most events delivered twice in a round: **$max_twice** (goal ≤ one batch, $batch_size).
- Every round: every event of the new primary delivered, no reconciliation.
EOF
)
echo "$report"
echo "$report" >bench/RESULTS-failover.md
