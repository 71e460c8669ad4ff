#!/usr/bin/env bash
# Makes Debian's Chromium available for the browser tests (Playwright drives it by path;
# `playwright install` would download a browser, which these machines cannot do).
# Installs only when it is missing and we are root with apt-get; otherwise says why and
# leaves the decision to the tests (they skip loudly, or fail under HEED_REQUIRE_BROWSER=1).
set -uo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_browser: installing Debian's chromium for the browser tests..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
        && exit 0
    echo "ensure_browser: apt-get could not install chromium" >&2
else
    echo "ensure_browser: chromium is missing and cannot be installed here (need root and apt-get)" >&2
fi
exit 0
