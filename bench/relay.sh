#!/usr/bin/env bash
# Relay benchmark: `outbox relay nats` throughput over a backlog, and commit-to-JetStream-
# consumer latency at 2,000 events/s.
#
#   bench/relay.sh                   full run: 1M-event backlog, 3 repetitions, 10 s latency run
#   BENCH_QUICK=1 bench/relay.sh     smoke run: 100k events, 1 repetition, 3 s latency run
#
# Environment:
#   BENCH_EVENTS, BENCH_REPS, BENCH_LATENCY_SECONDS   override the sizes above
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-relay)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54356)
#   OUTBOX_BENCH_NATS_PORT nats-server port on 127.0.0.1 (default 16650)
#
# It resets its own disposable PostgreSQL cluster and starts its own nats-server (JetStream,
# a temporary store directory), and stops both on exit. The markdown report goes to stdout and
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

exec 9>"$pg_dir.lock"
if ! flock -n 9; then
    log "another run is using $pg_dir; set OUTBOX_BENCH_PG_DIR and OUTBOX_BENCH_PG_PORT to use another cluster"
    exit 1
fi

nats_pid=
store=
# Run by bench_cleanup (the EXIT trap) before it stops the cluster.
bench_cleanup_extra() {
    if [ -n "$nats_pid" ]; then
        kill "$nats_pid" 2>/dev/null || true
        wait "$nats_pid" 2>/dev/null || true
    fi
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
log "starting nats-server on 127.0.0.1:$nats_port (store $store)"
"$nats_server" -js -a 127.0.0.1 -p "$nats_port" -sd "$store/js" >"$store/server.log" 2>&1 &
nats_pid=$!
for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null; then
        break
    fi
    sleep 0.05
done
if ! kill -0 "$nats_pid" 2>/dev/null; then
    log "nats-server did not start:"
    cat "$store/server.log" >&2
    exit 1
fi

BENCH_REVISION=${BENCH_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}
export BENCH_REVISION

"$root/target/release/outbox-relay-bench" --database-url "$url" \
    --nats-url "nats://127.0.0.1:$nats_port" --outbox "$root/target/release/outbox" "$@"
