#!/usr/bin/env bash
# The lock (requirements/lock*.txt) pins wheels for one interpreter: refuse another one up front,
# with what to do, instead of a pip error about hashes or missing wheels half-way.
# usage: check_python.sh PYTHON WANT (e.g. python3 3.11)
set -euo pipefail
python="$1"; want="$2"
if ! have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "error: '$python' is not a working Python; pass one with make PYTHON=/path/to/python$want" >&2
    exit 1
fi
machine=$("$python" -c 'import platform; print(platform.machine())')
if [ "$have" != "$want" ] || [ "$machine" != "x86_64" ]; then
    echo "error: the lock (requirements/lock.txt) is for CPython $want on x86_64 Linux;" >&2
    echo "  '$python' is $have on $machine. Use make PYTHON=python$want ..., or install the" >&2
    echo "  package with its version ranges instead: pip install -e '.[export,serve,dev]'" >&2
    exit 1
fi
