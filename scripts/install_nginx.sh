#!/usr/bin/env bash
# nginx for the image-affine proxy tests (tests/integration/test_replicas.py) and
# `triton-sam bench replicas`: Debian's nginx-light, installed only when nginx is missing.
# Idempotent; needs root (or sudo) and the Debian package index.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install_nginx: need root or sudo to apt-get install nginx-light" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q nginx-light >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q nginx-light >/dev/null
}
# The package starts a system nginx on port 80; the tests start their own on free ports.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
    $SUDO systemctl stop nginx || true
fi
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]
echo "install_nginx: $(/usr/sbin/nginx -v 2>&1)"
