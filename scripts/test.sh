#!/usr/bin/env bash
# The whole test suite against one fresh disposable PostgreSQL cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/test-deps.sh

# Each run gets its own cluster, so leftovers of an earlier run cannot leak into this one.
export OUTBOX_PG_DIR=${OUTBOX_PG_DIR:-$PWD/.pg-test}
export OUTBOX_PG_PORT=${OUTBOX_PG_PORT:-54330}
url=$(bash scripts/pg.sh reset)
trap 'bash scripts/pg.sh down || true' EXIT
export OUTBOX_TEST_DATABASE_URL=$url
echo "test cluster: $url"
# The relay's tests start their own nats-servers (JetStream, temporary store, free port), each
# relay suite on two: Debian's (2.9.10) and a current release from PyPI (pinned, installed into
# a virtual environment outside the checkout when missing; fails loudly when it cannot be).
OUTBOX_NATS_SERVER=$(bash scripts/nats.sh ensure)
export OUTBOX_NATS_SERVER
OUTBOX_NATS_SERVER_CURRENT=$(bash scripts/nats.sh ensure-current)
export OUTBOX_NATS_SERVER_CURRENT
echo "nats-server: $OUTBOX_NATS_SERVER ($("$OUTBOX_NATS_SERVER" --version)), $OUTBOX_NATS_SERVER_CURRENT ($("$OUTBOX_NATS_SERVER_CURRENT" --version))"

# The dashboard's browser test needs Chromium; installed here when missing (fails loudly when
# it cannot be).
OUTBOX_CHROMIUM=$(bash scripts/chromium.sh)
export OUTBOX_CHROMIUM
echo "chromium: $OUTBOX_CHROMIUM"

# The alert-rule and metrics-format tests need promtool, the man-page test man and groff;
# installed here when missing (fails loudly when they cannot be).
OUTBOX_PROMTOOL=$(bash scripts/promtool.sh ensure)
export OUTBOX_PROMTOOL
echo "promtool: $OUTBOX_PROMTOOL"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The docs book builds without a warning, has no dead relative link and its CLI reference is
# current (mdBook is installed the first time, see scripts/mdbook.sh).
bash scripts/mdbook.sh check
log=$(mktemp)
# Three tests at a time: many start processes, clusters and nats-servers of their own, and on a
# two-core machine a fourth left the relay tests' NATS clusters too starved to elect leaders.
cargo test --workspace --no-fail-fast -- --test-threads "${OUTBOX_TEST_THREADS:-3}" 2>&1 | tee "$log"
# One closing line for the whole suite (cargo prints one per test binary, the last of which
# is often an empty doc-test run).
awk '/^test result:/ { p += $4; f += $6 } END { printf "suite: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
