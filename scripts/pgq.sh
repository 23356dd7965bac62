#!/usr/bin/env bash
# PgQ, the peer the writer and consumer benchmarks compare against (bench/peers.sh).
#
#   scripts/pgq.sh ensure   print the path of PgQ's extension control file, installing
#                           Debian's postgresql-<major>-pgq3 package with apt-get when missing
#
# The major version is that of the server binaries scripts/pg.sh uses (the newest under
# /usr/lib/postgresql, or pg_config's). The benchmark then runs `CREATE EXTENSION pgq` on its
# own cluster and drives the ticker itself, so nothing here runs a daemon.
set -euo pipefail

log() { echo "pgq.sh: $*" >&2; }

major() {
    local bindir=
    if command -v pg_config >/dev/null 2>&1; then
        bindir=$(pg_config --bindir 2>/dev/null || true)
    fi
    if [ -z "$bindir" ] || [ ! -x "$bindir/postgres" ]; then
        bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r | head -n 1)
    fi
    [ -n "$bindir" ] && [ -x "$bindir/postgres" ] || { log "no PostgreSQL server binaries found (scripts/pg.sh installs them)"; exit 1; }
    "$bindir/postgres" --version | sed -n 's/.* \([0-9][0-9]*\)\..*/\1/p'
}

find_control() {
    local sharedir
    sharedir=/usr/share/postgresql/$1/extension
    [ -f "$sharedir/pgq.control" ] && echo "$sharedir/pgq.control"
}

case "${1:-ensure}" in
    ensure)
        version=$(major)
        if path=$(find_control "$version"); then
            echo "$path"
            exit 0
        fi
        package=postgresql-$version-pgq3
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            log "PgQ not found for PostgreSQL $version; installing $package with apt-get"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >&2
            if path=$(find_control "$version"); then
                echo "$path"
                exit 0
            fi
        fi
        log "PgQ not found for PostgreSQL $version (install Debian's $package package as root)"
        exit 1
        ;;
    *)
        log "usage: scripts/pgq.sh ensure"
        exit 2
        ;;
esac
