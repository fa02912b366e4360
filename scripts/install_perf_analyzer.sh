#!/usr/bin/env bash
# Install Triton's perf_analyzer next to the virtualenv, from registries only:
#   - the C++ binary ships in the tritonclient wheel of the same release as the embedded
#     tritonserver (2.51.0); the PyPI package "perf-analyzer" is an empty placeholder;
#   - it links libcudart.so.12 even for CPU-only use (PyPI: nvidia-cuda-runtime-cu12)
#     and libb64.so.0d (Debian: libb64-0d).
# Both wheels are pinned with their sha256 in requirements/lock-tools.txt (`make lock`).
# Usage: scripts/install_perf_analyzer.sh [DEST]   (default: .venv/tools/perf_analyzer)
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
DEST=${1:-.venv/tools/perf_analyzer}
LOCK=${LOCK_TOOLS:-requirements/lock-tools.txt}

mkdir -p "$DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$LOCK" -d "$tmp"
"$PY" - "$tmp" "$DEST" <<'PYEOF'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "tritonclient-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/bin/perf_analyzer"))
    data = z.read(member)
out = os.path.join(sys.argv[2], "perf_analyzer")
with open(out + ".tmp", "wb") as f:
    f.write(data)
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)  # never a half-written binary
PYEOF
"$PY" -m pip install -q --no-deps --upgrade --target "$DEST/cudart" "$tmp"/nvidia_cuda_runtime_cu12-*.whl

if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq libb64-0d
  else
    echo "perf_analyzer needs libb64: run 'sudo apt-get install libb64-0d', then rerun" >&2
    exit 1
  fi
fi
LD_LIBRARY_PATH="$DEST/cudart/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$DEST/perf_analyzer" --version
