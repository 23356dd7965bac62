#!/usr/bin/env bash
# The whole test suite against one fresh disposable PostgreSQL cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each run gets its own cluster, so leftovers of an earlier run cannot leak into this one.
export OUTBOX_PG_DIR=${OUTBOX_PG_DIR:-$PWD/.pg-test}
export OUTBOX_PG_PORT=${OUTBOX_PG_PORT:-54330}
url=$(bash scripts/pg.sh reset)
trap 'bash scripts/pg.sh down || true' EXIT
export OUTBOX_TEST_DATABASE_URL=$url
echo "test cluster: $url"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins
cargo test --workspace -- --test-threads "${OUTBOX_TEST_THREADS:-4}"
