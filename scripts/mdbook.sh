#!/usr/bin/env bash
# mdBook, which builds the docs book (docs/).
#
#   scripts/mdbook.sh ensure   print the path of an mdbook binary (version 0.4.52), installing
#                              it with `cargo install --locked` when missing, into
#                              $OUTBOX_TOOLS (default ~/.cache/lifecycle-outbox/tools: outside
#                              the checkout, so a fresh clone on the same machine reuses it)
#   scripts/mdbook.sh build    build the book into docs/book/, failing on any warning
#   scripts/mdbook.sh check    build, then the book's tests (outbox-cli/tests/docs_book/): no
#                              dead relative link in the book or README.md, every page in
#                              SUMMARY.md, the CLI reference what `outbox --help` prints;
#                              and the benchmark plots what bench/plots.sh draws
#
# The version is pinned so the book renders the same everywhere; an mdbook on $PATH is used
# only when it is that version.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.4.52
root=${OUTBOX_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-outbox/tools}
log() { echo "mdbook.sh: $*" >&2; }

is_pinned() { [ -x "$1" ] && [ "$("$1" --version 2>/dev/null)" = "mdbook v$version" ]; }

ensure() {
    if [ -n "${OUTBOX_MDBOOK:-}" ] && is_pinned "$OUTBOX_MDBOOK"; then
        echo "$OUTBOX_MDBOOK"
        return 0
    fi
    if on_path=$(command -v mdbook 2>/dev/null) && is_pinned "$on_path"; then
        echo "$on_path"
        return 0
    fi
    if ! is_pinned "$root/bin/mdbook"; then
        log "mdbook $version not found; installing it into $root (one-time, a few minutes)"
        cargo install mdbook --version "$version" --locked --root "$root" >&2
    fi
    is_pinned "$root/bin/mdbook" || { log "mdbook $version did not install into $root"; exit 1; }
    echo "$root/bin/mdbook"
}

case "${1:-ensure}" in
    ensure) ensure ;;
    build | check)
        bin=$(ensure)
        out=$(mktemp)
        # mdBook reports a missing page, a bad SUMMARY entry or a failed include as a WARN or
        # ERROR line but may still exit 0: any such line fails the build here.
        if ! "$bin" build docs 2>&1 | tee "$out" >&2; then
            rm -f "$out"
            log "mdbook build failed"
            exit 1
        fi
        if grep -E '\[(WARN|ERROR)\]' "$out" >/dev/null; then
            rm -f "$out"
            log "mdbook printed warnings or errors (above); the book must build cleanly"
            exit 1
        fi
        rm -f "$out"
        log "book built: $PWD/docs/book/index.html"
        if [ "$1" = check ]; then
            bash bench/plots.sh --check
            cargo test -p outbox-cli --test docs_book --quiet >&2
        fi
        ;;
    *) echo "usage: $0 ensure|build|check" >&2; exit 2 ;;
esac
