#!/usr/bin/env bash
# A disposable PostgreSQL cluster for the demo, the tests and the benchmarks.
#
#   scripts/pg.sh up      start (initialising if needed); prints the connection URL
#   scripts/pg.sh down    stop (fast shutdown; `down immediate` for an immediate one, as a crash)
#   scripts/pg.sh reset   stop, wipe, start fresh; prints the connection URL
#   scripts/pg.sh url     print the connection URL
#   scripts/pg.sh status  exit 0 when running
#
# The cluster lives in .pg/ in the project (override with OUTBOX_PG_DIR) and listens only on a
# Unix socket in that directory (port OUTBOX_PG_PORT, default 54329). Binaries come from
# pg_config --bindir or /usr/lib/postgresql/*/bin; when none are found they are installed with
# apt-get. Run as root, the server runs as the `postgres` OS user.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
port=${OUTBOX_PG_PORT:-54329}
dir=${OUTBOX_PG_DIR:-$root/.pg}

log() { echo "pg.sh: $*" >&2; }

find_bindir() {
    local candidate
    if command -v pg_config >/dev/null 2>&1; then
        candidate=$(pg_config --bindir 2>/dev/null || true)
        if [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ]; then
            echo "$candidate"
            return 0
        fi
    fi
    for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$candidate/initdb" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

ensure_binaries() {
    if bindir=$(find_bindir); then
        return 0
    fi
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "PostgreSQL server binaries not found; installing with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib >&2
        bindir=$(find_bindir) && return 0
    fi
    log "PostgreSQL server binaries not found (install the postgresql package)"
    exit 1
}

# As root, PostgreSQL refuses to run; it runs as `postgres`, which must be able to reach $dir.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

prepare_dir() {
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
        mkdir -p "$dir"
        chown postgres: "$dir"
        if ! runuser -u postgres -- test -w "$dir"; then
            # The project lies under a directory the postgres user cannot enter (/root, say).
            local hash
            hash=$(printf '%s' "$root" | cksum | cut -d' ' -f1)
            dir=/tmp/lifecycle-outbox-pg-$hash
            mkdir -p "$dir"
            chown postgres: "$dir"
        fi
    else
        mkdir -p "$dir"
    fi
}

url() {
    local user=postgres
    [ "$(id -u)" -eq 0 ] || user=$(id -un)
    echo "postgresql://$user@/postgres?host=$dir/run&port=$port"
}

running() {
    [ -f "$dir/data/postmaster.pid" ] && as_owner "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1
}

up() {
    ensure_binaries
    prepare_dir
    if running; then
        url
        return 0
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_owner mkdir -p "$dir/data" "$dir/run"
        as_owner "$bindir/initdb" -D "$dir/data" -U "$( [ "$(id -u)" -eq 0 ] && echo postgres || id -un )" \
            --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
        cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir/run'
port = $port
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
max_wal_size = 4GB
log_min_messages = warning
log_line_prefix = '%m [%p] '
CONF
    fi
    as_owner mkdir -p "$dir/run"
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
        || { tail -n 30 "$dir/server.log" >&2; exit 1; }
    url
}

down() {
    ensure_binaries
    prepare_dir
    if running; then
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m "${1:-fast}" -w stop >/dev/null
    fi
}

case "${1:-}" in
    up) up ;;
    down) down "${2:-fast}" ;;
    reset) down; rm -rf "${dir:?}/data" "${dir:?}/run"; up ;;
    url) ensure_binaries; prepare_dir; url ;;
    status) ensure_binaries; prepare_dir; running ;;
    *) echo "usage: scripts/pg.sh up|down|reset|url|status" >&2; exit 2 ;;
esac
