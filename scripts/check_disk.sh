#!/usr/bin/env bash
# Refuse to start the virtualenv install on a disk that cannot hold it: pip would otherwise fail
# half-way with "No space left on device" and leave a broken .venv behind.
# usage: check_disk.sh DIR NEED_GB
set -euo pipefail
dir="$1"; need_gb="$2"
while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done  # the venv's parent may not exist yet
avail_kb=$(df -Pk "$dir" | awk 'NR==2 {print $4}')
need_kb=$((need_gb * 1024 * 1024))
if [ "$avail_kb" -lt "$need_kb" ]; then
    echo "error: the install needs about ${need_gb} GB free in ${dir}, only $((avail_kb / 1024 / 1024)) GB is." >&2
    echo "  Free some space (old .venv copies, /tmp/pytest-of-\$USER), or put the virtualenv" >&2
    echo "  elsewhere: make VENV=/bigdisk/triton-sam-venv test   (NEED_GB=... to override)" >&2
    exit 1
fi
