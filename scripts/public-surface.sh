#!/usr/bin/env bash
# The public surface of each library crate, counted from its `src/lib.rs`: how many names a user
# sees at the crate's root.
#
# Counting rule: the top-level `pub` items of lib.rs, that is
#   - each name a root `pub use` re-exports (a braced list counts each leaf; `a as b` counts
#     once, as `b`; a glob `*` counts once), and
#   - each root item declared `pub` (`pub mod`, `pub fn`, `pub struct`, `pub enum`,
#     `pub trait`, `pub type`, `pub const`, `pub static`, `pub async fn`, `pub union`),
# where "root" means a statement starting in the first column (rustfmt's layout), so items
# inside inline modules or functions are not counted. `pub(crate)` and narrower are not
# public. Line comments are ignored. Items behind a `#[cfg(...)]` (a feature) count as if it
# were on. Items under `#[doc(hidden)]` count like any other and are also shown apart, since
# they are reachable but not documented (a crate's `internal` module: one name).
#
#   scripts/public-surface.sh            one line per crate: crate, root names, of which hidden
#   scripts/public-surface.sh -v         also list the names
set -euo pipefail
cd "$(dirname "$0")/.."

verbose=0
[ "${1:-}" = "-v" ] && verbose=1

crates=(outbox-core outbox-consumer outbox-service outbox-serve outbox-relay)

count() {
    # Prints one name per line, prefixed `hidden ` when a `#[doc(hidden)]` attribute sits
    # directly above the statement.
    awk '
        function emit(name) {
            if (name == "") return
            print (hidden ? "hidden " : "shown ") name
        }
        function leaves(list,    n, parts, i, t, m) {
            n = split(list, parts, /[{},]/)
            for (i = 1; i <= n; i++) {
                t = parts[i]
                gsub(/^[ \t]+|[ \t]+$/, "", t)
                if (t == "" || t ~ /::$/) continue
                if (match(t, / as [A-Za-z_][A-Za-z0-9_]*$/)) t = substr(t, RSTART + 4)
                sub(/^.*::/, "", t)
                emit(t)
            }
        }
        {
            line = $0
            sub(/\/\/.*$/, "", line)
        }
        in_use {
            buf = buf " " line
            if (buf ~ /;/) { sub(/;.*$/, "", buf); leaves(buf); in_use = 0; hidden = 0 }
            next
        }
        /^#\[doc\(hidden\)\]/ { hidden = 1; next }
        /^#\[/ { next }
        /^pub use / {
            buf = line
            sub(/^pub use /, "", buf)
            if (buf ~ /;/) { sub(/;.*$/, "", buf); leaves(buf); hidden = 0 }
            else in_use = 1
            next
        }
        /^pub (async )?(mod|fn|struct|enum|trait|type|const|static|union) / {
            t = line
            sub(/^pub (async )?(mod|fn|struct|enum|trait|type|const|static|union) /, "", t)
            sub(/[^A-Za-z0-9_].*$/, "", t)
            emit(t)
            hidden = 0
            next
        }
        /^[^ \t\/]/ { hidden = 0 }
    ' "$1"
}

printf '%-16s %5s %7s\n' crate names hidden
for crate in "${crates[@]}"; do
    names=$(count "$crate/src/lib.rs")
    total=$(grep -c . <<<"$names" || true)
    hidden=$(grep -c '^hidden ' <<<"$names" || true)
    printf '%-16s %5d %7d\n' "$crate" "$total" "$hidden"
    if [ "$verbose" -eq 1 ]; then
        sed 's/^/    /' <<<"$names"
    fi
done
