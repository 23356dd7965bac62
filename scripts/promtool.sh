#!/usr/bin/env bash
# promtool, for the alert-rule and metrics-format tests, and the man-page renderer (groff) for
# the man-page test.
#
#   scripts/promtool.sh ensure   print the path of a promtool binary, installing Debian's
#                                prometheus package (and groff-base/man-db for `man`) with
#                                apt-get when missing
#
# Nothing here starts a Prometheus server; the tests run promtool on the rule files and on
# live scrapes.
set -euo pipefail

log() { echo "promtool.sh: $*" >&2; }

find_binary() {
    if [ -n "${OUTBOX_PROMTOOL:-}" ] && [ -x "$OUTBOX_PROMTOOL" ]; then
        echo "$OUTBOX_PROMTOOL"
        return 0
    fi
    command -v promtool 2>/dev/null && return 0
    [ -x /usr/bin/promtool ] && echo /usr/bin/promtool && return 0
    return 1
}

have_man() { command -v man >/dev/null 2>&1 && command -v groff >/dev/null 2>&1; }

case "${1:-ensure}" in
    ensure)
        if path=$(find_binary) && have_man; then
            echo "$path"
            exit 0
        fi
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            log "promtool or man/groff not found; installing prometheus, man-db and groff with apt-get"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                prometheus man-db groff >&2
            if path=$(find_binary) && have_man; then
                echo "$path"
                exit 0
            fi
        fi
        log "promtool, man or groff not found (install Debian's prometheus, man-db and groff packages)"
        exit 1
        ;;
    *)
        log "usage: scripts/promtool.sh ensure"
        exit 2
        ;;
esac
