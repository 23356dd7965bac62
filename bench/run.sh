#!/usr/bin/env bash
# make bench: every benchmark, each on a disposable cluster of its own, one after another (the
# machine has two cores; running them side by side would measure the contention instead).
# Figures go to stdout and to bench/RESULTS-*.md. BENCH_QUICK=1 shortens every run.
set -euo pipefail
cd "$(dirname "$0")/.."

for bench in writer contracts consumer lanes pooler prune relay scale serve multi peers equal-latency peers-harness tick-cost tick-pacing scaling old-snapshot numbering-prototypes failover; do
    script=bench/$bench.sh
    [ -f "$script" ] || continue
    echo
    echo "################ $bench ################"
    bash "$script"
done
