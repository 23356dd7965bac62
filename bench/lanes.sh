#!/usr/bin/env bash
# Lanes benchmark: a handler sleeping 10 ms with 1, 8 and 64 lanes; a no-op catch-up with 16
# lanes beside 1; commit-to-handler latency at 2,000 events/s with 8 lanes and a 2 ms handler.
#
#   bench/lanes.sh                   full run: 3 repetitions, 5 s per run
#   BENCH_QUICK=1 bench/lanes.sh     smoke run: 1 repetition, 2 s per run
#   bench/lanes.sh --only latency    one part (sleeping, catch-up, latency; comma-separated)
#
# Environment: BENCH_REPS, BENCH_LATENCY_SECONDS (see `outbox-bench lanes --help`),
# OUTBOX_BENCH_PG_DIR (default <project>/.pg-bench-lanes), OUTBOX_BENCH_PG_PORT (default 54336).
# The markdown report goes to stdout and to bench/RESULTS-lanes.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-lanes}
pg_port=${OUTBOX_BENCH_PG_PORT:-54336}

bench_name=lanes.sh
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

bench_lock "$pg_dir"

trap bench_cleanup EXIT
trap 'exit 130' INT TERM

log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2

log "resetting the bench cluster in $pg_dir (port $pg_port)"
url=$(pg reset)

BENCH_REVISION=${BENCH_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}
export BENCH_REVISION

"$root/target/release/outbox-bench" lanes --database-url "$url" "$@"
