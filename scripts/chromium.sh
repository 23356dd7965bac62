#!/usr/bin/env bash
# Makes sure a headless-capable Chromium is installed for the dashboard's browser test, and
# prints its path. Installs Debian's `chromium` with apt-get when it is missing; fails loudly
# (non-zero exit, message on stderr) when it cannot.
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

find_chromium() {
    local candidate
    for candidate in chromium chromium-browser; do
        if command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if path=$(find_chromium); then
    echo "$path"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "Chromium is not installed and cannot be installed here (needs root and apt-get);"
    log "install the Debian package 'chromium' and run again"
    exit 1
fi
log "Chromium not found; installing it with apt-get"
# Another engineer's script may hold the dpkg lock for a while; apt-get waits for it.
DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || log "apt-get update failed; trying the cached lists"
if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2; then
    log "apt-get could not install chromium"
    exit 1
fi
if ! path=$(find_chromium); then
    log "chromium was installed but is not on PATH"
    exit 1
fi
echo "$path"
