#!/usr/bin/env bash
# `outbox serve` fan-out benchmark: 1,000 SSE clients on one server while writers commit
# 2,000 events/s; commit-to-client p50/p99/max, the server's peak RSS and CPU, and whether
# every client received every event; then the same with 10 deliberately slow clients (which
# read nothing and must be dropped without moving the others' p99).
#
#   bench/serve.sh                  full run: 10 s of writing per scenario
#   BENCH_QUICK=1 bench/serve.sh    smoke run: 3 s per scenario, 200 clients
#
# Environment: BENCH_SSE_CLIENTS (1000), BENCH_SSE_RATE (2000), BENCH_SSE_SECONDS (10),
# BENCH_SSE_SERVE_ARGS (options added to `outbox serve`, e.g. "--min-tick-pause 5ms"; none),
# OUTBOX_BENCH_PG_DIR (<project>/.pg-bench-serve), OUTBOX_BENCH_PG_PORT (54335).
# The report goes to stdout and to bench/RESULTS-serve.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-serve}
pg_port=${OUTBOX_BENCH_PG_PORT:-54335}
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    clients=${BENCH_SSE_CLIENTS:-200}
    seconds=${BENCH_SSE_SECONDS:-3}
else
    clients=${BENCH_SSE_CLIENTS:-1000}
    seconds=${BENCH_SSE_SECONDS:-10}
fi
rate=${BENCH_SSE_RATE:-2000}

bench_name=serve.sh
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# Each SSE client is a socket on both ends.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

log "building outbox and outbox-sse-bench (release)"
cargo build --release -p outbox-cli -p outbox-bench >&2
url=$(pg reset)
"$root/target/release/outbox" --database-url "$url" migrate >/dev/null
revision=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
rows=""
timelines=""
serve_args=()
for arg in ${BENCH_SSE_SERVE_ARGS:-}; do serve_args+=("--serve-arg=$arg"); done
# A single client first: the floor of the same path with next to no fan-out. Then the two
# fan-out scenarios alternate twice, so that a change in the host's load shows as a difference
# between repetitions rather than between scenarios.
run=0
for scenario in "1 0" "$clients 0" "$clients 10" "$clients 0" "$clients 10"; do
    read -r n slow <<<"$scenario"
    run=$((run + 1))
    # A fresh database per scenario: each starts from an empty stream.
    db="sse_$run"
    psql "$url" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >&2
    db_url=$(echo "$url" | sed -E "s#(postgresql://[^/]*/)[^?]*#\1$db#")
    "$root/target/release/outbox" --database-url "$db_url" migrate >/dev/null
    psql "$db_url" -qc "CREATE TABLE public.tasks (id text PRIMARY KEY, project_id text NOT NULL,
        deleted_at timestamptz)" >&2
    log "scenario: $n clients, $slow slow, $rate events/s for ${seconds}s"
    row=$("$root/target/release/outbox-sse-bench" --database-url "$db_url" \
        --outbox "$root/target/release/outbox" --clients "$n" --slow-clients "$slow" \
        --rate "$rate" --seconds "$seconds" --label "$run: $n + $slow slow" --timeline \
        ${serve_args[@]+"${serve_args[@]}"} 2>"$pg_dir.timeline") || {
        cat "$pg_dir.timeline" >&2
        die "scenario $run failed"
    }
    grep -v 'committed in second' "$pg_dir.timeline" >&2 || true
    echo "$row" >&2
    rows+="$row"$'\n'
    timelines+="Scenario $run ($n clients, $slow slow):"$'\n\n'
    timelines+=$(grep 'committed in second' "$pg_dir.timeline" | sed 's/^sse-bench: /    /')$'\n\n'
done

report=$(cat <<EOF2
# outbox serve: SSE fan-out

Revision \`$revision\`, $(date -u +%Y-%m-%d), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),
$(psql "$url" -Atc 'SHOW server_version' 2>/dev/null | sed 's/^/PostgreSQL /'), release build.

Method: \`bench/serve.sh\` starts one \`outbox serve --project bench\` and connects $clients SSE
clients (one process, \`outbox-sse-bench\`, which also runs the writers), then 8 writer
connections commit $rate events/s for ${seconds} s on an open-loop schedule, each event in its
own transaction through \`outbox.write_task_deleted\`. Latency is from a writer's commit returning
to a client having read the message, on one monotonic clock. "complete" counts clients that
received every event with consecutive ids. RSS is the server's peak (VmHWM); CPU is server CPU
seconds per wall second over the writing and draining window (1.0 = one core). "dispatched
≤ 50 ms" is the durable side alone: the share of events the server's consumer dispatched within
50 ms of the writer's transaction start (its \`outbox_commit_to_dispatch_seconds\` histogram).
"harness CPU" is the same for the benchmark process (writers and all clients), which competes
with the server for the same cores. "load" is the 1-minute load average at the end. Everything runs on one machine: PostgreSQL, the
server, the writers and all clients share its cores (and other work on the host shows in the
load). The single-client row is the floor: the same path with next to no fan-out.
\`outbox serve\` runs with its defaults${BENCH_SSE_SERVE_ARGS:+ and \`$BENCH_SSE_SERVE_ARGS\`} (each client written at
most once per \`--client-write-interval\`, 20 ms).

| scenario | clients | slow clients | events/s | p50 ms | p99 ms | max ms | dispatched ≤ 50 ms | complete | dropped | gaps | server RSS MiB | server CPU | harness CPU | load |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
${rows%$'\n'}

Goals from the issue: p99 ≤ 50 ms, RSS ≤ 100 MB, no client missing an event; the slow
clients' drop must not move the others' p99. Compare "dispatched ≤ 50 ms" between rows before
blaming the fan-out: when it falls, the durable side itself was starved of CPU (the slow
clients cannot cause that: publishing never waits for a client).

## Where in the run the tail is

Commit-to-client latency of the events committed in each second of the run (second 0 is
when the clients began to connect; writing starts about a second later).

${timelines%$'\n\n'}
EOF2
)
echo "$report"
if [ "${BENCH_QUICK:-0}" != 1 ]; then
    echo "$report" > "$root/bench/RESULTS-serve.md"
    log "wrote bench/RESULTS-serve.md"
fi
