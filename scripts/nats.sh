#!/usr/bin/env bash
# The NATS server for the relay's tests and benchmark.
#
#   scripts/nats.sh ensure   print the path of a nats-server binary, installing Debian's
#                            nats-server package with apt-get when none is found
#
# The tests and the benchmark start their own servers from that binary (with -js, a temporary
# store directory and a free port), so nothing here runs a server.
set -euo pipefail

log() { echo "nats.sh: $*" >&2; }

find_binary() {
    if [ -n "${OUTBOX_NATS_SERVER:-}" ] && [ -x "$OUTBOX_NATS_SERVER" ]; then
        echo "$OUTBOX_NATS_SERVER"
        return 0
    fi
    command -v nats-server 2>/dev/null && return 0
    [ -x /usr/bin/nats-server ] && echo /usr/bin/nats-server && return 0
    return 1
}

case "${1:-ensure}" in
    ensure)
        if path=$(find_binary); then
            echo "$path"
            exit 0
        fi
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            log "nats-server not found; installing it with apt-get"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >&2
            if path=$(find_binary); then
                echo "$path"
                exit 0
            fi
        fi
        log "nats-server not found (install Debian's nats-server package)"
        exit 1
        ;;
    *)
        log "usage: scripts/nats.sh ensure"
        exit 2
        ;;
esac
