#!/usr/bin/env bash
# Installs what the test suite needs beyond PostgreSQL (which scripts/pg.sh installs): the
# Debian pgbouncer package for the transaction-pooler tests. Does nothing when present.
set -euo pipefail

missing=()
[ -x /usr/sbin/pgbouncer ] || [ -x /usr/bin/pgbouncer ] || missing+=(pgbouncer)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test-deps.sh: missing ${missing[*]}; install with: apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "test-deps.sh: installing ${missing[*]} with apt-get" >&2
DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
