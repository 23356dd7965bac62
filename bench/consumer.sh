#!/usr/bin/env bash
# Consumer benchmark: catch-up throughput and peak RSS (with and without failures; the
# adaptive read batch against today's fixed batches of 500, side by side), and
# end-to-end latency from writer commit to handler, with LISTEN and poll-only.
#
#   bench/consumer.sh                   full run: 1M-event backlog, 3 repetitions, 10 s per
#                                       latency scenario
#   BENCH_QUICK=1 bench/consumer.sh     smoke run: 1 repetition, 3 s per latency scenario
#
# Environment (each also a flag of outbox-bench; see `outbox-bench --help`):
#   BENCH_EVENTS           events in the catch-up backlog (default 1000000)
#   BENCH_REPS             repetitions of each catch-up run (default 3; 1 with BENCH_QUICK=1)
#   BENCH_LATENCY_SECONDS  seconds of writing per latency scenario (default 10; 3 quick)
#   BENCH_MAX_BATCH_SIZES  other maxima of the adaptive read batch to run beside the default
#                          in every repetition, e.g. 4000,8000 (default none)
#   OUTBOX_BENCH_PG_DIR    cluster directory (default <project>/.pg-bench-consumer)
#   OUTBOX_BENCH_PG_PORT   cluster port (default 54332)
# Extra arguments are passed to outbox-bench (e.g. --batch-sizes 100,2000,10000).
#
# It resets its own disposable cluster (never the shared .pg one) and stops it on exit. The
# markdown report goes to stdout and to bench/RESULTS-consumer.md; progress to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-consumer}
pg_port=${OUTBOX_BENCH_PG_PORT:-54332}

bench_name=consumer.sh
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

# Two runs on one cluster directory would reset each other's cluster mid-run (and the first
# to finish would stop the other's): refuse a second one. Taken before the trap is set, so a
# refused run leaves the running one's cluster alone. Use OUTBOX_BENCH_PG_DIR/_PORT to run
# side by side (though two benchmarks on one machine measure each other).
bench_lock "$pg_dir"

trap bench_cleanup EXIT
trap 'exit 130' INT TERM

log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2

log "resetting the bench cluster in $pg_dir (port $pg_port)"
url=$(pg reset)

# Names the code measured in the report (with -dirty when the working tree has changes).
BENCH_REVISION=${BENCH_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}
export BENCH_REVISION

"$root/target/release/outbox-bench" --database-url "$url" "$@"
