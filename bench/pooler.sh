#!/usr/bin/env bash
# Catch-up through PgBouncer (transaction mode) beside catch-up on a direct connection.
#
#   bench/pooler.sh                     1M-event backlog, 3 repetitions of each side
#   BENCH_EVENTS=200000 BENCH_REPS=1 bench/pooler.sh
#
# Environment:
#   BENCH_EVENTS, BENCH_REPS            backlog size and repetitions (defaults 1000000, 3)
#   OUTBOX_BENCH_PG_DIR                 cluster directory (default <project>/.pg-bench-pooler)
#   OUTBOX_BENCH_PG_PORT                cluster port (default 54333; Unix socket only)
#   OUTBOX_BENCH_PGBOUNCER_PORT         PgBouncer's TCP port on 127.0.0.1 (default 16432)
#   OUTBOX_BENCH_POOL_SIZE              PgBouncer default_pool_size (default 3)
#
# It resets its own disposable cluster, starts its own PgBouncer (as the postgres user when
# run as root; scripts/test-deps.sh installs it), and stops both on exit. The markdown report
# goes to stdout and bench/RESULTS-pooler.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pg_dir=${OUTBOX_BENCH_PG_DIR:-$root/.pg-bench-pooler}
pg_port=${OUTBOX_BENCH_PG_PORT:-54333}
bouncer_port=${OUTBOX_BENCH_PGBOUNCER_PORT:-16432}
pool_size=${OUTBOX_BENCH_POOL_SIZE:-3}

log() { echo "pooler.sh: $*" >&2; }
pg() { OUTBOX_PG_DIR=$pg_dir OUTBOX_PG_PORT=$pg_port scripts/pg.sh "$@"; }

exec 9>"$pg_dir.lock"
if ! flock -n 9; then
    log "another run is using $pg_dir; set OUTBOX_BENCH_PG_DIR and OUTBOX_BENCH_PG_PORT"
    exit 1
fi

bash scripts/test-deps.sh
bouncer_dir=$(mktemp -d /tmp/outbox-bench-pgbouncer.XXXXXX)
cleanup() {
    local status=$?
    if [ -f "$bouncer_dir/pgbouncer.pid" ]; then
        kill -TERM "$(cat "$bouncer_dir/pgbouncer.pid")" 2>/dev/null || true
        sleep 0.5
    fi
    rm -rf "$bouncer_dir"
    pg down >/dev/null 2>&1 || log "could not stop the bench cluster in $pg_dir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building outbox-bench (release)"
cargo build --release -p outbox-bench >&2

log "resetting the bench cluster in $pg_dir (port $pg_port)"
url=$(pg reset)
socket_dir=$(sed -E 's/.*host=([^&]*).*/\1/' <<<"$url")
user=$(sed -E 's|postgresql://([^@]*)@.*|\1|' <<<"$url")

cat >"$bouncer_dir/pgbouncer.ini" <<INI
[databases]
* = host=$socket_dir port=$pg_port user=$user
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $bouncer_dir/users.txt
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 200
server_reset_query =
logfile = $bouncer_dir/pgbouncer.log
pidfile = $bouncer_dir/pgbouncer.pid
INI
echo "\"$user\" \"\"" >"$bouncer_dir/users.txt"
if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres: "$bouncer_dir"
    runuser -u postgres -- pgbouncer -d "$bouncer_dir/pgbouncer.ini"
else
    pgbouncer -d "$bouncer_dir/pgbouncer.ini"
fi
for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$bouncer_port") 2>/dev/null && break
    sleep 0.1
done
log "pgbouncer on 127.0.0.1:$bouncer_port (transaction mode, pool of $pool_size)"

BENCH_REVISION=${BENCH_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}
export BENCH_REVISION

"$root/target/release/outbox-bench" pooler-compare \
    --database-url "$url" \
    --pooler-url "postgresql://$user@127.0.0.1:$bouncer_port/postgres?sslmode=disable" \
    --pooler "PgBouncer $(pgbouncer --version | head -n1 | awk '{print $2}'), pool_mode = transaction, default_pool_size = $pool_size" \
    "$@" | tee "$root/bench/RESULTS-pooler.md"
