#!/usr/bin/env bash
# The browser the dashboard's tests drive (tests/browser): Debian's chromium, installed with apt when missing (root
# only), its path printed. Playwright (a dev dependency) drives it through executable_path: no browser download.
set -euo pipefail
say() { echo "[chromium.sh] $*" >&2; }
found() { command -v chromium || command -v chromium-browser || true; }
path=$(found)
if [ -z "$path" ]; then
    [ "$(id -u)" = 0 ] || { say "chromium is not installed and only root can install it (apt-get install chromium)"; exit 1; }
    apt-cache show chromium >/dev/null 2>&1 || apt-get update -qq
    if ! apt-get install -y -qq --no-install-recommends chromium >/tmp/chromium-apt.log 2>&1; then
        say "apt-get install failed; refreshing package lists and retrying"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends chromium >/tmp/chromium-apt.log 2>&1 \
            || { tail -20 /tmp/chromium-apt.log >&2; exit 1; }
    fi
    path=$(found)
fi
[ -n "$path" ] || { say "chromium installed but not on PATH"; exit 1; }
echo "$path"
