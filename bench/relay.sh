#!/usr/bin/env bash
# Relay benchmark: `outbox relay nats` throughput over a backlog, and commit-to-JetStream-
# consumer latency at 2,000 events/s, on one nats-server and on a three-node cluster with
# streams of three replicas, with every --fence (stream, the default; subject; none) and the
# direct-publish floor, on two nats-server versions: Debian's (scripts/nats.sh ensure) and a
# current release (scripts/nats.sh ensure-current).
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
#                          PORT+11..PORT+13; the current version's servers on the same
#                          layout from PORT+20
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
nats_server_current=$(bash scripts/nats.sh ensure-current)

log "building outbox and outbox-relay-bench (release)"
cargo build --release -p outbox-cli -p outbox-relay-bench >&2

log "resetting the bench cluster in $pg_dir (port $pg_port)"
url=$(pg reset)

store=$(mktemp -d "${TMPDIR:-/tmp}/outbox-bench-nats.XXXXXX")

# start_nats BINARY NAME PORT ARGS...: a nats-server with JetStream on 127.0.0.1:PORT.
start_nats() {
    local binary=$1 name=$2 port=$3
    shift 3
    "$binary" -js -a 127.0.0.1 -p "$port" -sd "$store/$name" "$@" >"$store/$name.log" 2>&1 &
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

# start_servers BINARY TAG BASE: one node on BASE and a three-node cluster on BASE+1..3
# (routes BASE+11..13); sets single_url and cluster_url.
start_servers() {
    local binary=$1 tag=$2 base=$3
    log "starting $tag nats-server on 127.0.0.1:$base (store $store)"
    start_nats "$binary" "$tag-single" "$base"
    local routes=() urls=() i others
    for i in 1 2 3; do
        routes+=("nats://127.0.0.1:$((base + 10 + i))")
    done
    for i in 1 2 3; do
        others=$(printf '%s\n' "${routes[@]}" | grep -v ":$((base + 10 + i))\$" | paste -sd, -)
        log "starting $tag cluster node n$i on 127.0.0.1:$((base + i))"
        start_nats "$binary" "$tag-n$i" "$((base + i))" --server_name "n$i" --cluster_name "bench$tag" \
            --cluster "nats://127.0.0.1:$((base + 10 + i))" --routes "$others"
        urls+=("nats://127.0.0.1:$((base + i))")
    done
    # The cluster is usable once it has elected a JetStream meta leader.
    for _ in $(seq 1 200); do
        if grep -q "JetStream cluster new metadata leader" "$store/$tag"-n*.log 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    single_url="nats://127.0.0.1:$base"
    cluster_url=$(IFS=,; echo "${urls[*]}")
}

start_servers "$nats_server" debian "$nats_port"
debian_single=$single_url debian_cluster=$cluster_url
start_servers "$nats_server_current" current "$((nats_port + 20))"
current_single=$single_url current_cluster=$cluster_url

BENCH_REVISION=${BENCH_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}
export BENCH_REVISION

"$root/target/release/outbox-relay-bench" --database-url "$url" \
    --nats-url "$debian_single" --cluster-url "$debian_cluster" \
    --current-nats-url "$current_single" --current-cluster-url "$current_cluster" \
    --outbox "$root/target/release/outbox" "$@"
