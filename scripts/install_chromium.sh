#!/usr/bin/env bash
# Debian's headless-capable chromium and its chromedriver for the browser test of the web
# annotator (tests/integration/test_web_page.py). Installed only when either is missing.
# Idempotent; needs root (or sudo) and the Debian package index.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ]; }
if have chromium && have chromedriver; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install_chromium: need root or sudo to apt-get install chromium chromium-driver" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# --no-install-recommends: the browser alone, without fonts and desktop integration the
# headless test never uses.
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null
}
have chromium && have chromedriver
echo "install_chromium: $(chromium --version 2>/dev/null) / $(chromedriver --version 2>/dev/null | head -1)"
