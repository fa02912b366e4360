#!/usr/bin/env bash
# Debian's Xvfb and the X libraries PyQt5's xcb platform plugin links, for the napari plugin's
# tests (tests/integration/test_napari_plugin.py starts its own Xvfb): Qt's offscreen platform
# cannot draw napari's OpenGL canvas, an X server with Mesa's software GL can. Installed only
# when something is missing. Idempotent; needs root (or sudo) and the Debian package index.
set -euo pipefail
PACKAGES="xvfb libgl1-mesa-dri libegl1 libfontconfig1 libdbus-1-3 libxkbcommon-x11-0
  libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0
  libxcb-shape0 libxcb-xinerama0 libxcb-xfixes0 libxcb-xkb1 libxcb-util1"
missing=""
for p in $PACKAGES; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install_qt_tools: need root or sudo to apt-get install$missing" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the package list is meant to split
$SUDO apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q --no-install-recommends $missing >/dev/null
}
command -v Xvfb >/dev/null
echo "install_qt_tools: installed$missing"
