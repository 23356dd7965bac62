#!/usr/bin/env bash
# Failover benchmark: a primary and a synchronous streaming standby (pg_basebackup -R), two
# `outbox consume` processes on the multi-host URL with target_session_attrs=read-write (one
# `--project p`, one `--all-projects`; a third, killed -9 across the failover and started
# again, in the draining rounds), two writers committing through the same URL. Each
# round makes a fresh pair, stops the primary at once (`pg_ctl stop -m immediate`) and
# promotes the standby (`pg_ctl promote`). Two kinds of rounds:
#   caught-up  the consumers keep up with the writers; a probe event written on the new
#              primary right after the promotion measures, per consumer, the time from the
#              promotion to the probe's line on stdout (goal: at most 2 x the lease TTL);
#   draining   the consumers start behind a backlog and the primary stops while they drain
#              it in full batches (the most a failover can catch in flight).
# Both count, per consumer, the events delivered twice across the failover (goal: at most one
# batch), and check that every event acknowledged to a writer is on the new primary, that
# each consumer delivered every event of the new primary, that nothing reconciled and that no
# history divergence was recorded; the script stops at the first failed check.
#
#   bench/failover.sh                  5 rounds of each kind: 1,000 events before each
#                                      caught-up failover, a 100,000-event backlog stopped at
#                                      20,000 delivered, 5 s of writes after each (~5 min)
#   BENCH_QUICK=1 bench/failover.sh    5 rounds of each kind: 200 events, a 20,000-event
#                                      backlog stopped at 4,000, 1 s after (~2 min)
#
# Environment: BENCH_FAILOVER_ROUNDS (5), BENCH_FAILOVER_LEASE_TTL (5s; the sequencer lease
# gets the same TTL, the heartbeat a fifth of it), BENCH_FAILOVER_BATCH (500, the default
# batch size), OUTBOX_BENCH_PG_DIR (<project>/.pg-bench-failover; the nodes live in -a and -b
# beside it, each round's consumer and standby logs in -logs), OUTBOX_BENCH_PG_PORT (54342;
# both nodes listen on that port, each on a Unix socket in its own directory). The report
# goes to stdout and to bench/RESULTS-failover.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
base=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-failover}
pg_port=${OUTBOX_BENCH_PG_PORT:-54342}
rounds=${BENCH_FAILOVER_ROUNDS:-5}
lease_ttl=${BENCH_FAILOVER_LEASE_TTL:-5s}
batch_size=${BENCH_FAILOVER_BATCH:-500}
if [ "$quick" = 1 ]; then
    warm_events=200
    after_seconds=1
    backlog=20000
    drain_stop_at=4000
else
    warm_events=1000
    after_seconds=5
    backlog=100000
    drain_stop_at=20000
fi
results=$root/bench/RESULTS-failover.md
# bench-1 and bench-2 live through every failover; bench-3 (draining rounds only) is killed
# -9 with the primary and started again once the standby is promoted: the crash case.
all_consumers=(bench-1 bench-2 bench-3)
consumers=()
writers=2

[[ $lease_ttl =~ ^([0-9]+)s$ ]] && [ "${BASH_REMATCH[1]}" -ge 2 ] \
    || { echo "failover.sh: BENCH_FAILOVER_LEASE_TTL must be whole seconds, at least 2s (got $lease_ttl)" >&2; exit 2; }
ttl_seconds=${BASH_REMATCH[1]}
# The heartbeat must be at most half the lease; a fifth leaves room for a slow renewal.
heartbeat_ms=$((ttl_seconds * 200))

bench_name=failover.sh
pg_dir=$base-a
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-failover.XXXXXX")
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$base"

declare -A consumer_pids=()
writer_pids=()

# stop_pid PID SECONDS: SIGTERM, SIGKILL if it is still there after SECONDS; reaps it.
stop_pid() {
    kill -TERM "$1" 2>/dev/null || return 0
    local i
    for i in $(seq 1 $(($2 * 10))); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

bench_cleanup_extra() {
    local pid
    touch "$work/stop-writers"
    for pid in "${writer_pids[@]}" "${consumer_pids[@]}"; do
        [ -n "$pid" ] || continue
        stop_pid "$pid" 10
    done
    standby down immediate >/dev/null 2>&1 || log "could not stop the standby in $base-b"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

bindir=$(pg_config --bindir 2>/dev/null || true)
[ -x "$bindir/pg_ctl" ] || bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_owner() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
standby() { OUTBOX_PG_DIR=$base-b OUTBOX_PG_PORT=$pg_port scripts/pg.sh "$@"; }

bench_cluster
user=${DATABASE_URL#postgresql://}
user=${user%%@*}
node_url() { echo "postgresql://$user@/postgres?host=$1/run&port=$pg_port"; }
url_a=$(node_url "$base-a")
url_b=$(node_url "$base-b")
multi="postgresql://$user@/postgres?host=$base-a/run,$base-b/run&port=$pg_port,$pg_port&target_session_attrs=read-write"
on() { local url=$1; shift; psql "$url" -X -q -t -A -v ON_ERROR_STOP=1 "$@"; }

# fail MESSAGE: the end of each consumer's log and of both servers' logs, then stops.
fail() {
    local c
    for c in "${consumers[@]}"; do
        log "--- the last lines of $c's log:"
        tail -n 15 "$work/$c.err" >&2 2>/dev/null || true
    done
    for node in a b; do
        log "--- the last lines of server $node's log:"
        tail -n 10 "$base-$node/server.log" >&2 2>/dev/null || true
    done
    die "$*"
}

consumers_alive() {
    local c
    for c in "${!consumer_pids[@]}"; do
        kill -0 "${consumer_pids[$c]}" 2>/dev/null || return 1
    done
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 50 ms until it succeeds; stops the
# benchmark, naming WHAT, when SECONDS pass first or a consumer exits meanwhile.
wait_for() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((${EPOCHREALTIME/./} + limit * 1000000))
    until "$@"; do
        consumers_alive || fail "a consumer exited while waiting for $what"
        [ "${EPOCHREALTIME/./}" -lt "$deadline" ] || fail "timed out after ${limit}s waiting for $what"
        sleep "${poll_interval:-0.05}"
    done
}

# new_pair: a fresh primary, a standby made from it with pg_basebackup -R and streaming, then
# synchronous_standby_names = '*' on the primary (set after the backup, so the standby, once
# promoted, has no standby of its own to wait for).
new_pair() {
    standby down immediate >/dev/null 2>&1 || true
    rm -rf "$base-b"
    DATABASE_URL=$(pg reset)
    export DATABASE_URL
    OUTBOX_LOG=warn "$outbox" migrate >/dev/null
    sql -c "CREATE TABLE tasks (id text PRIMARY KEY, project_id text NOT NULL, deleted_at timestamptz)"
    mkdir -p "$base-b/run"
    [ "$(id -u)" -ne 0 ] || chown -R postgres: "$base-b"
    as_owner "$bindir/pg_basebackup" -D "$base-b/data" -R -X stream -c fast \
        -h "$base-a/run" -p "$pg_port" -U "$user"
    echo "unix_socket_directories = '$base-b/run'" >>"$base-b/data/postgresql.conf"
    standby up >/dev/null
    wait_for 30 "the standby to stream from the primary" streaming
    sql -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null
    wait_for 30 "the standby to become synchronous" synchronous
}
streaming() { [ "$(sql -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ]; }
synchronous() { [ "$(sql -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ]; }

# start_consumer C [>>]: C on the multi-host URL (bench-2 follows every project, the others
# project p); its stdout and log (info: the outage's start and end) in $work, appended to
# with `>>`; its PID in consumer_pids[C].
start_consumer() {
    local c=$1 scope=(--project p)
    [ "$c" != bench-2 ] || scope=(--all-projects)
    [ "${2:-}" = ">>" ] || : >"$work/$c.out" >"$work/$c.err"
    "$outbox" --database-url "$multi" consume "${scope[@]}" --consumer-id "$c" \
        --start-from earliest --batch-size "$batch_size" --lease-ttl "$lease_ttl" \
        --heartbeat-interval "${heartbeat_ms}ms" --sequencer-lease-ttl "$lease_ttl" \
        >>"$work/$c.out" 2>>"$work/$c.err" &
    consumer_pids[$c]=$!
}

# writer N: commits events through the multi-host URL until $work/stop-writers exists: one
# psql session per chunk of 50 events (one autocommit statement each, then a 50 ms pause, so
# a writer stays below 1,000 events/s), a new session after a failed one; appends each event
# ID whose commit was acknowledged (the statement's result) to $work/acked-N.
writer() {
    local chunk=0
    while [ ! -e "$work/stop-writers" ]; do
        chunk=$((chunk + 1))
        {
            for i in $(seq 1 50); do
                echo "SELECT outbox.write_task_deleted('p', 'r$round-w$1-c$chunk-$i', now(), 'bench-writer');"
            done
            echo "SELECT pg_sleep(0.05);"
        } | psql "$multi" -X -q -t -A -v ON_ERROR_STOP=1 2>/dev/null | grep '^task-deleted:' >>"$work/acked-$1" \
            || sleep 0.02
    done
}
start_writers() {
    local w
    rm -f "$work/stop-writers"
    writer_pids=()
    for w in $(seq 1 "$writers"); do
        : >"$work/acked-$w"
        writer "$w" &
        writer_pids+=($!)
    done
}
writers_gone() {
    local pid
    for pid in "${writer_pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 1; done
    return 0
}
stop_writers() {
    touch "$work/stop-writers"
    wait_for 30 "the writers to stop" writers_gone
    local pid
    for pid in "${writer_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    writer_pids=()
}

delivered() { grep -c '"type":"event"' "$work/$1.out" 2>/dev/null || true; }
each_delivered_at_least() {
    local c
    for c in "${consumers[@]}"; do [ "$(delivered "$c")" -ge "$1" ] || return 1; done
}
# event_ids CONSUMER: the event ID of each event line, in arrival order.
event_ids() { grep '"type":"event"' "$work/$1.out" | sed -E 's/.*"event_id":"([^"]*)".*/\1/'; }
all_numbered() { [ "$(on "$url_b" -c "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL")" = 0 ]; }
cursors_at_head() {
    [ "$(on "$url_b" -c "SELECT count(*) FROM outbox.lifecycle_consumer_cursors c
                         JOIN outbox.lifecycle_project_heads h USING (project_id)
                         WHERE c.project_id = 'p' AND c.last_acked_sequence = h.head_sequence")" = "${#consumers[@]}" ]
}
# log_epoch TIMESTAMP: an RFC 3339 log timestamp as seconds since the epoch.
log_epoch() { date -u -d "$1" +%s.%N; }
# outage_lines CONSUMER: the WARN lines of its log without timestamp, span, paths and the
# fields that differ between processes (the error is kept).
outage_lines() {
    grep ' WARN ' "$work/$1.err" | sed -E 's/^[^ ]+ +WARN +//; s/^.*(outbox_[a-z_:]+: )/\1/;
        s/ (project|consumer|holder|generation|expires_in|retry_in)=("[^"]*"|[^ ]*)//g; s#/[^ :]*#…#g' || true
}
# ready_at: when the standby's server log says it accepts read-write connections (the end of
# its promotion; pg_ctl promote -w notices it up to 100 ms later).
ready_at() {
    local stamp
    stamp=$(grep 'database system is ready to accept connections' "$base-b/server.log" | tail -n 1 | awk '{print $1 " " $2 " " $3}')
    [ -z "$stamp" ] || log_epoch "$stamp"
}
ready_logged() { grep -q 'database system is ready to accept connections' "$base-b/server.log"; }
ms() { echo "($1 - $2) * 1000" | bc -l | xargs printf '%.0f'; }

logs=$base-logs
rm -rf "$logs"
: >"$work/outage-lines"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$EPOCHREALTIME
rows=()           # one markdown table row per round and consumer
latency_ms=()     # per consumer: "c ms"
twice_of=()       # per consumer: "c n"
promote_ms=()
probe_ms=()

# round KIND N: one failover. KIND `caught-up`: the consumers keep up with the writers; the
# probe measures promotion to delivery. KIND `draining`: the consumers start behind a backlog
# of $backlog events (committed in one transaction before they start) and the primary is
# stopped while they drain it in full batches, with the writers going on: the case where a
# whole batch may be in flight.
round() {
    local kind=$1 c status
    round=$2
    log "round $round of $rounds ($kind): a fresh primary and a synchronous standby"
    new_pair
    rm -f "$work"/acked-*
    if [ "$kind" = draining ]; then
        sql -c "SELECT outbox.write_task_deleted('p', 'r$round-backlog-' || g, now(), 'bench-writer')
                FROM generate_series(1, $backlog) AS g" >"$work/acked-backlog"
    fi
    consumers=(bench-1 bench-2)
    [ "$kind" = caught-up ] || consumers+=(bench-3)
    consumer_pids=()
    for c in "${consumers[@]}"; do start_consumer "$c"; done
    start_writers
    writers_started=$EPOCHREALTIME
    local threshold=$warm_events
    [ "$kind" = caught-up ] || threshold=$drain_stop_at
    poll_interval=0.01 wait_for 120 "$threshold events delivered to each consumer" each_delivered_at_least "$threshold"

    log "round $round ($kind): stopping the primary (immediate), promoting the standby"
    if [ "$kind" = draining ]; then
        kill -KILL "${consumer_pids[bench-3]}"
        wait "${consumer_pids[bench-3]}" 2>/dev/null || true
    fi
    as_owner "$bindir/pg_ctl" -D "$base-a/data" -m immediate -w stop >/dev/null
    stopped=$EPOCHREALTIME
    declare -A at_stop=()
    for c in "${consumers[@]}"; do at_stop[$c]=$(delivered "$c"); done
    as_owner "$bindir/pg_ctl" -D "$base-b/data" -w -t 60 promote >/dev/null
    [ "$kind" = caught-up ] || start_consumer bench-3 ">>"
    declare -A arrived=()
    if [ "$kind" = caught-up ]; then
        # The probe: the first event committed on the new primary that this script controls
        # (a writer may get one in a moment earlier; the probe's delivery bounds theirs).
        probe=
        for _ in $(seq 1 100); do
            probe=$(on "$url_b" -c "SELECT outbox.write_task_deleted('p', 'probe-$round', now(), 'bench-probe')" 2>/dev/null) && break
            sleep 0.1
        done
        [ -n "$probe" ] || fail "round $round ($kind): the probe could not be written on the promoted standby"
        probe_written=$EPOCHREALTIME
        poll_interval=0.01 wait_for 120 "the probe written on the promoted standby to reach both consumers" probe_seen
    fi
    # pg_ctl sees the promotion in postmaster.pid, which may come before the log line.
    wait_for 10 "'ready to accept connections' in $base-b/server.log after the promotion" ready_logged
    promoted=$(ready_at)
    local promote
    promote=$(ms "$promoted" "$stopped")
    promote_ms+=("$promote")

    sleep "$after_seconds"
    stop_writers
    local write_seconds
    write_seconds=$(echo "$EPOCHREALTIME - $writers_started" | bc -l)
    wait_for 120 "the sequencer to number every event on the new primary" all_numbered
    wait_for 120 "both consumers' cursors to reach the head" cursors_at_head
    for c in "${consumers[@]}"; do
        kill -INT "${consumer_pids[$c]}"
    done
    for c in "${consumers[@]}"; do
        status=0
        wait "${consumer_pids[$c]}" || status=$?
        [ "$status" = 0 ] || fail "round $round ($kind): $c exited with $status on SIGINT"
    done
    consumer_pids=()
    mkdir -p "$logs/$kind-$round"
    for c in "${consumers[@]}"; do cp "$work/$c.err" "$logs/$kind-$round/$c.log"; done
    cp "$base-b/server.log" "$logs/$kind-$round/standby-server.log"

    # What the new primary has, what the writers were told was committed, what arrived.
    on "$url_b" -c "SELECT event_id FROM outbox.lifecycle_outbox WHERE project_id = 'p'" | sort >"$work/on-b"
    sort -u "$work"/acked-* >"$work/acked"
    local acked total lost diverged
    acked=$(wc -l <"$work/acked")
    lost=$(comm -23 "$work/acked" "$work/on-b" | wc -l)
    [ "$lost" = 0 ] || fail "round $round ($kind): $lost events acknowledged to a writer are not on the new primary"
    diverged=$(on "$url_b" -c "SELECT count(*) FROM outbox.lifecycle_audit WHERE kind = 'lifecycle-observation:history-diverged'")
    [ "$diverged" = 0 ] || fail "round $round ($kind): $diverged history divergences recorded across a synchronous failover"
    total=$(wc -l <"$work/on-b")
    local rate missing extra reconciled twice warnings lat
    rate=$(printf '%.0f' "$(echo "($acked - $(cat "$work/acked-backlog" 2>/dev/null | wc -l)) / $write_seconds" | bc -l)")
    for c in "${consumers[@]}"; do
        event_ids "$c" | sort >"$work/$c.ids"
        sort -u "$work/$c.ids" >"$work/$c.distinct"
        missing=$(comm -23 "$work/on-b" "$work/$c.distinct" | wc -l)
        extra=$(comm -13 "$work/on-b" "$work/$c.distinct" | wc -l)
        reconciled=$(grep -c '"type":"reconcile"' "$work/$c.out" || true)
        [ "$missing" = 0 ] || fail "round $round ($kind): $c missed $missing of the new primary's $total events"
        [ "$extra" = 0 ] || fail "round $round ($kind): $c delivered $extra events the new primary does not have"
        [ "$reconciled" = 0 ] || fail "round $round ($kind): $c reconciled across a synchronous failover"
        twice=$(($(wc -l <"$work/$c.ids") - $(wc -l <"$work/$c.distinct")))
        twice_of+=("$c $twice")
        outage_lines "$c" >>"$work/outage-lines"
        if grep -q 'does not allow writes' "$work/$c.err"; then
            refused_runs=$((refused_runs + 1))
            grep -q 'the database is unavailable' "$work/$c.err" || refused_unnoticed=$((refused_unnoticed + 1))
        fi
        warnings=$(outage_lines "$c" | wc -l)
        if [ "$kind" = caught-up ]; then
            lat=$(ms "${arrived[$c]}" "$promoted")
            latency_ms+=("$c $lat")
            rows+=("| $round | $c | $promote | $(ms "$probe_written" "$promoted") | **$lat** | $twice | $warnings | $total | $acked | $rate |")
            log "round $round, $c: promotion to probe delivered $lat ms; $twice delivered twice; all $total events delivered, none reconciled"
        else
            drain_rows+=("| $round | $c | $promote | ${at_stop[$c]} | $twice | $warnings | $total | $acked | $rate |")
            log "round $round, $c: ${at_stop[$c]} delivered at the stop; $twice delivered twice; all $total events delivered, none reconciled"
        fi
    done
    unset arrived at_stop
}
probe_seen() {
    local c
    for c in "${consumers[@]}"; do
        [ -n "${arrived[$c]:-}" ] && continue
        if grep -qF "\"event_id\":\"$probe\"" "$work/$c.out"; then arrived[$c]=$EPOCHREALTIME; fi
    done
    [ "${#arrived[@]}" = "${#consumers[@]}" ]
}

drain_rows=()
refused_runs=0      # consumer runs whose log shows the standby refusing a read-write session
refused_unnoticed=0 # ... of which never logged the database as unavailable
for n in $(seq 1 "$rounds"); do round caught-up "$n"; done
for n in $(seq 1 "$rounds"); do round draining "$n"; done
elapsed=$(printf '%.0f' "$(echo "$EPOCHREALTIME - $started" | bc -l)")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
goal_ms=$((2 * ttl_seconds * 1000))
summary=()
for c in "${all_consumers[@]}"; do
    med=$(printf '%s\n' "${latency_ms[@]}" | awk -v c="$c" '$1 == c { print $2 }' | median)
    worst=$(printf '%s\n' "${latency_ms[@]}" | awk -v c="$c" '$1 == c { print $2 }' | sort -n | tail -n 1)
    max_twice=$(printf '%s\n' "${twice_of[@]}" | awk -v c="$c" '$1 == c { print $2 }' | sort -n | tail -n 1)
    [ -n "$max_twice" ] || continue
    if [ -n "$worst" ]; then
        med=$(printf '%.0f' "$med")
        met=met; [ "$med" -le "$goal_ms" ] || met="NOT met"
    else
        med="-" worst="-" met="(killed and restarted: not measured)"
    fi
    twice_met=met; [ "$max_twice" -le "$batch_size" ] || twice_met="NOT met"
    summary+=("| $c | $med | $worst | $met | $max_twice | $twice_met |")
done
median_promote=$(printf '%s\n' "${promote_ms[@]}" | median)

report=$(cat <<EOF
# Failover benchmark

\`bench/failover.sh\`$([ "$quick" = 1 ] && echo " with \`BENCH_QUICK=1\`") ($(date -u +%Y-%m-%d), $(nproc) cores,
PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $rounds rounds of each kind in $elapsed s; load average
$load_before before, $load_after after, on a machine shared with other work).

Each round: a fresh primary and a standby made from it with \`pg_basebackup -R\`, streaming over
a Unix socket, synchronous (\`synchronous_standby_names = '*'\`, \`synchronous_commit = on\`).
Two writers commit events through the multi-host URL (\`host=A,B\`,
\`target_session_attrs=read-write\`) with \`outbox.write_task_deleted\`, one autocommit statement
per event, in \`psql\` sessions of 50 statements and a 50 ms pause (a new session after a failed
one); an event counts as acknowledged when its statement's result came back. Two
\`outbox consume\` processes on the same URL, \`bench-1\` (\`--project p\`) and \`bench-2\`
(\`--all-projects\`), and in the draining rounds a third, each with lease TTL **$lease_ttl** (heartbeat ${heartbeat_ms} ms, sequencer
lease TTL $lease_ttl, batch size **$batch_size**, the embedded elected sequencer, LISTEN). The
primary is stopped at once (\`pg_ctl stop -m immediate\`) and the standby promoted
(\`pg_ctl promote -w\`). The writers go on for $after_seconds s after that; then the round waits
until both cursors reach the new primary's head, stops the consumers with SIGINT (exit 0) and
checks every event.

## Promotion to the first event of the new primary delivered

Caught-up rounds: the primary stops once each consumer has delivered $warm_events events; right
after the promotion the script writes a probe event on the new primary and polls each
consumer's stdout for its line every 10 ms.

- **stop → promoted**: from the return of \`pg_ctl stop -m immediate\` to the standby's log line
  \`database system is ready to accept connections\` (the end of the promotion, the origin of
  the next two columns; \`pg_ctl promote -w\` notices it up to 100 ms later).
- **probe written**: when the probe's commit returned on the new primary.
- **promotion → probe delivered**: to the probe's line on the consumer's stdout (an upper bound
  for the first event of the new primary: a writer may commit one a moment before the probe).
- **delivered twice**: event lines the consumer printed a second time (redeliveries of events
  delivered on the old primary whose acknowledgement did not reach the standby).
- **warnings**: WARN lines in the consumer's log during the round.
- **events/s**: the writers' acknowledged commits per second over the round.

| round | consumer | stop → promoted (ms) | probe written (ms) | promotion → probe delivered (ms) | delivered twice | warnings | events on the new primary | acknowledged to writers | events/s |
|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")

## Events delivered twice with a batch in flight

Draining rounds: $backlog events are committed (one transaction) before the consumers start;
the primary stops once each consumer has delivered $drain_stop_at of them, while they drain the
rest in full batches of $batch_size and the writers go on. A third consumer, \`bench-3\`
(\`--project p\`), is killed with SIGKILL just before the primary stops and started again as
soon as the standby is promoted: a crash across the failover, the case in which a batch can be
repeated. \`bench-1\` and \`bench-2\` live through the failover: a process that could not write
an acknowledgement writes it again before it reads anything else, so it never prints an event
twice (docs/decisions/0003-handled-prefix-acknowledgement.md).

| round | consumer | stop → promoted (ms) | delivered at the stop | delivered twice | warnings | events on the new primary | acknowledged to writers | writers' events/s |
|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${drain_rows[@]}")

## Summary

| consumer | median promotion → probe delivered (ms) | worst (ms) | goal ≤ 2 × lease TTL = $goal_ms ms | most delivered twice in a round (both kinds) | goal ≤ one batch ($batch_size) |
|---|---|---|---|---|---|
$(printf '%s\n' "${summary[@]}")

- Median stop → promoted: $median_promote ms (the server's promotion, outside the consumers).
- The consumers' warnings over all rounds (count, message; fields left out):
$(sort "$work/outage-lines" | uniq -c | sort -rn | awk '{ n = $1; $1 = ""; printf "  - %d ×%s\n", n, $0 }')
- $refused_runs of the consumer runs met the standby refusing read-write sessions before its
  promotion (\`database does not allow writes\`: the multi-host URL's
  \`target_session_attrs=read-write\` at work); $refused_unnoticed of them never logged \`the database
  is unavailable\` (such a refusal is retried by each part, but not counted as an outage).
- Every round: every event acknowledged to a writer is on the new primary, each consumer
  delivered every event of the new primary and none that it lacks, nothing reconciled, and no
  \`lifecycle-observation:history-diverged\` row was written (the script stops otherwise).
EOF
)
echo "$report"
echo "$report" >"$results"
