#!/usr/bin/env bash
# Relay benchmark: `outbox relay nats` throughput over a backlog, and commit-to-JetStream-
# consumer latency at 2,000 events/s, on one nats-server and on a three-node cluster with
# streams of three replicas, each with the expectation header (the default) and without it.
#
#   bench/relay.sh                   full run: 1M-event backlog, 3 repetitions, 10 s latency run
#   BENCH_QUICK=1 bench/relay.sh     smoke run: 100k events, 1 repetition, 3 s latency run
#
# Environment:
#   BENCH_EVENTS, BENCH_REPS, BENCH_LATENCY_SECONDS   override the sizes above
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-relay)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54356)
#   OUTBOX_BENCH_NATS_PORT nats-server port on 127.0.0.1 (default 16650); the cluster's
#                          nodes listen on the three ports after it, their routes on
#                          PORT+11..PORT+13
#
# It resets its own disposable PostgreSQL cluster and starts its own nats-servers (JetStream,
# temporary store directories), and stops them all on exit. The markdown report goes to stdout and
# to bench/RESULTS-relay.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-relay}
pg_port=${OUTBOX_BENCH_PG_PORT:-54356}
nats_port=${OUTBOX_BENCH_NATS_PORT:-16650}

bench_name=relay.sh
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

nats_pids=()
store=
# Run by bench_cleanup (the EXIT trap) before it stops the cluster.
bench_cleanup_extra() {
    for pid in "${nats_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    [ -z "$store" ] || rm -rf "$store"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

nats_server=$(bash scripts/nats.sh ensure)

log "building outbox and outbox-relay-bench (release)"
cargo build --release -p outbox-cli -p outbox-relay-bench >&2

log "resetting the bench cluster in $pg_dir (port $pg_port)"
url=$(pg reset)

store=$(mktemp -d "${TMPDIR:-/tmp}/outbox-bench-nats.XXXXXX")

# start_nats NAME PORT ARGS...: a nats-server with JetStream on 127.0.0.1:PORT.
start_nats() {
    local name=$1 port=$2
    shift 2
    "$nats_server" -js -a 127.0.0.1 -p "$port" -sd "$store/$name" "$@" >"$store/$name.log" 2>&1 &
    nats_pids+=($!)
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    log "nats-server $name did not start:"
    cat "$store/$name.log" >&2
    exit 1
}

log "starting nats-server on 127.0.0.1:$nats_port (store $store)"
start_nats single "$nats_port"
routes=()
for i in 1 2 3; do
    routes+=("nats://127.0.0.1:$((nats_port + 10 + i))")
done
cluster_urls=()
for i in 1 2 3; do
    others=$(printf '%s\n' "${routes[@]}" | grep -v ":$((nats_port + 10 + i))\$" | paste -sd, -)
    log "starting cluster node n$i on 127.0.0.1:$((nats_port + i))"
    start_nats "n$i" "$((nats_port + i))" --server_name "n$i" --cluster_name bench \
        --cluster "nats://127.0.0.1:$((nats_port + 10 + i))" --routes "$others"
    cluster_urls+=("nats://127.0.0.1:$((nats_port + i))")
done
cluster_url=$(IFS=,; echo "${cluster_urls[*]}")
# The cluster is usable once it has elected a JetStream meta leader.
for _ in $(seq 1 200); do
    if grep -q "JetStream cluster new metadata leader" "$store"/n*.log 2>/dev/null; then
        break
    fi
    sleep 0.1
done

BENCH_REVISION=${BENCH_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}
export BENCH_REVISION

"$root/target/release/outbox-relay-bench" --database-url "$url" \
    --nats-url "nats://127.0.0.1:$nats_port" --cluster-url "$cluster_url" \
    --outbox "$root/target/release/outbox" "$@"
