#!/usr/bin/env bash
# cargo-deny, which checks the dependency policy in deny.toml (licences, advisories, duplicate
# versions, sources).
#
#   scripts/deny.sh ensure     print the path of a cargo-deny binary (version 0.20.2), installing
#                              it with `cargo install --locked` when missing, into $OUTBOX_TOOLS
#                              (default ~/.cache/lifecycle-outbox/tools, as scripts/mdbook.sh)
#   scripts/deny.sh check      the whole policy: licences, bans, sources and advisories. The
#                              advisories need the RustSec advisory database, fetched from its
#                              git repository into ~/.cargo/advisory-dbs; when it cannot be
#                              fetched the check FAILS, saying so (a policy that could not be
#                              checked has not passed)
#   scripts/deny.sh offline    licences, bans and sources only: what needs no network
#
# OUTBOX_ADVISORY_DB_OFFLINE=1 makes `check` read the advisory database already in
# ~/.cargo/advisory-dbs instead of fetching it (for a machine that cannot reach its repository;
# the copy's date is printed, and the check fails when there is none).
#
# The version is pinned so the policy means the same everywhere; a cargo-deny on $PATH is used
# only when it is that version.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.20.2
root=${OUTBOX_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-outbox/tools}
log() { echo "deny.sh: $*" >&2; }

is_pinned() { [ -x "$1" ] && [ "$("$1" --version 2>/dev/null)" = "cargo-deny $version" ]; }

ensure() {
    if [ -n "${OUTBOX_CARGO_DENY:-}" ] && is_pinned "$OUTBOX_CARGO_DENY"; then
        echo "$OUTBOX_CARGO_DENY"
        return 0
    fi
    if on_path=$(command -v cargo-deny 2>/dev/null) && is_pinned "$on_path"; then
        echo "$on_path"
        return 0
    fi
    if ! is_pinned "$root/bin/cargo-deny"; then
        log "cargo-deny $version not found; installing it into $root (one-time, several minutes)"
        cargo install cargo-deny --version "$version" --locked --root "$root" >&2
    fi
    is_pinned "$root/bin/cargo-deny" || {
        log "cargo-deny $version did not install into $root"
        exit 1
    }
    echo "$root/bin/cargo-deny"
}

case "${1:-ensure}" in
    ensure) ensure ;;
    check)
        bin=$(ensure)
        "$bin" --locked check --show-stats licenses bans sources
        if [ "${OUTBOX_ADVISORY_DB_OFFLINE:-}" = 1 ]; then
            db=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/advisory-dbs/advisory-db-*/.git 2>/dev/null | head -1 || true)
            if [ -z "$db" ]; then
                log "FAILED: OUTBOX_ADVISORY_DB_OFFLINE=1 but no advisory database in ${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
                exit 1
            fi
            log "advisories from the copy in ${db%/.git}, last changed $(git --git-dir "$db" log -1 --format=%cs)"
            "$bin" --offline --locked check --show-stats advisories
        elif ! "$bin" --locked check --show-stats advisories; then
            log "FAILED: advisories not checked or not clean. If the lines above say the advisory"
            log "database could not be fetched, this machine cannot reach its git repository;"
            log "the licence, duplicate and source checks above passed, the advisory check did not run."
            exit 1
        fi
        ;;
    offline)
        bin=$(ensure)
        "$bin" --locked check --show-stats licenses bans sources
        ;;
    *) echo "usage: $0 ensure|check|offline" >&2; exit 2 ;;
esac
