#!/usr/bin/env bash
# No library source file over the limit (600 lines): the crates' `src/` trees, not their tests
# (`outbox-cli/tests/`, the test kit in `tests/`) nor the benchmarks (`bench/`). A file that
# grows past it is split by responsibility, not cut mechanically.
#
#   scripts/file-length.sh    list every file over the limit and exit 1, or exit 0 when none is
set -euo pipefail
cd "$(dirname "$0")/.."

limit=${OUTBOX_MAX_LINES:-600}
over=0
while IFS= read -r file; do
    lines=$(wc -l < "$file")
    if [ "$lines" -gt "$limit" ]; then
        echo "file-length.sh: $file has $lines lines (limit $limit): split it by responsibility" >&2
        over=1
    fi
done < <(find outbox-*/src -name '*.rs' | sort)
if [ "$over" -ne 0 ]; then
    exit 1
fi
echo "file-length.sh: no library file over $limit lines" >&2
