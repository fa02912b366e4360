#!/usr/bin/env bash
# Build Triton's own onnxruntime backend (CPU only) for the embedded tritonserver of the
# nvidia-pytriton wheel, against the libonnxruntime of the installed onnxruntime wheel, so
# `triton-sam serve` can run the production (onnxruntime_onnx) model repository.
#
# Usage: scripts/build_onnxruntime_backend.sh [--check] OUT_DIR
#   OUT_DIR   the backend folder to write (replaced); `make onnxruntime-backend` uses
#             .venv/tools/triton-onnxruntime-backend/onnxruntime, where triton-sam looks first
#   --check   check the preconditions and print what would be built from what; build nothing
#
# Environment (all optional):
#   PYTHON              interpreter whose onnxruntime and nvidia-pytriton wheels are used
#                       (default: python3)
#   TRITON_BRANCH       Triton release branch of the wheel's tritonserver (default: derived
#                       from the nvidia-pytriton version; 0.7.x ships tritonserver 2.51 = r24.10)
#   SOURCES_DIR         a folder holding onnxruntime_backend/ backend/ core/ common/ checked
#                       out at TRITON_BRANCH (offline builds); default: shallow `git clone`s of
#                       github.com/triton-inference-server/<name> into a temporary folder
#   ORT_HEADERS         a folder holding onnxruntime_c_api.h (offline builds); default: that
#                       header of ORT_HEADER_VERSION from github.com/microsoft/onnxruntime
#   ORT_HEADER_VERSION  default 1.21.0. The C API is versioned (ORT_API_VERSION = minor), so
#                       any header up to the library's version works; 1.21.0 is the one this
#                       recipe was verified with against onnxruntime 1.32.0.
#   JOBS                parallel compile jobs (default: nproc)
# Needs: git (unless SOURCES_DIR), curl (unless ORT_HEADERS), cmake >= 3.17, g++ (C++17),
# readelf, and the RapidJSON headers + CMake config (Debian/Ubuntu: rapidjson-dev).
# Takes about 20 s on 2 cores once the sources are there.
set -euo pipefail

CHECK_ONLY=0
if [ "${1:-}" = "--check" ]; then CHECK_ONLY=1; shift; fi
if [ $# -ne 1 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
  exit 2
fi
OUT=$1
PYTHON=${PYTHON:-python3}
ORT_HEADER_VERSION=${ORT_HEADER_VERSION:-1.21.0}
JOBS=${JOBS:-$(nproc)}
REPOS="onnxruntime_backend backend core common"

fail() { echo "build_onnxruntime_backend: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || fail "$1 not found: $2"; }

# -- preconditions ------------------------------------------------------------------------
need cmake "install cmake >= 3.17 (apt-get install cmake)"
need g++ "install a C++17 compiler (apt-get install g++)"
need readelf "install binutils"
[ -n "${SOURCES_DIR:-}" ] || need git "install git, or set SOURCES_DIR to checked-out sources"
[ -n "${ORT_HEADERS:-}" ] || need curl "install curl, or set ORT_HEADERS to a folder with onnxruntime_c_api.h"
cmake_version=$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
[ "$(printf '%s\n3.17\n' "$cmake_version" | sort -V | head -1)" = 3.17 ] \
  || fail "cmake $cmake_version is too old: the backend needs >= 3.17"
echo '#include <rapidjson/document.h>' | g++ -x c++ -fsyntax-only - 2>/dev/null \
  || fail "RapidJSON headers not found: apt-get install rapidjson-dev"

# What the installed wheels provide: the onnxruntime library and the server's release.
read -r ORT_VERSION ORT_LIB PYTRITON_VERSION < <("$PYTHON" - <<'PYEOF'
import glob, importlib.metadata as md, os, sys
try:
    import onnxruntime
except ImportError:
    sys.exit("no onnxruntime in this interpreter: pip install onnxruntime")
libs = sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.*")))
if not libs:
    sys.exit("the onnxruntime wheel has no capi/libonnxruntime.so.*")
try:
    pytriton = md.version("nvidia-pytriton")
except md.PackageNotFoundError:
    sys.exit("no nvidia-pytriton in this interpreter: pip install nvidia-pytriton")
print(onnxruntime.__version__, libs[-1], pytriton)
PYEOF
) || fail "cannot read the installed wheels with $PYTHON"
if [ -z "${TRITON_BRANCH:-}" ]; then
  case "$PYTRITON_VERSION" in
    0.7.*) TRITON_BRANCH=r24.10 ;;  # tritonserver 2.51
    *) fail "nvidia-pytriton $PYTRITON_VERSION: unknown tritonserver release; set TRITON_BRANCH=r<YY.MM> (its Triton release branch)" ;;
  esac
fi
ORT_SONAME=$(readelf -d "$ORT_LIB" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ -n "$ORT_SONAME" ] || fail "$ORT_LIB has no SONAME"
lib_minor=$(echo "$ORT_VERSION" | cut -d. -f2)
if [ -n "${ORT_HEADERS:-}" ]; then
  [ -f "$ORT_HEADERS/onnxruntime_c_api.h" ] || fail "ORT_HEADERS=$ORT_HEADERS has no onnxruntime_c_api.h"
  header_api=$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/\1/p' "$ORT_HEADERS/onnxruntime_c_api.h")
else
  header_api=$(echo "$ORT_HEADER_VERSION" | cut -d. -f2)
fi
[ -n "$header_api" ] && [ "$header_api" -le "$lib_minor" ] \
  || fail "onnxruntime C API header version $header_api is newer than the library ($ORT_VERSION): the library would refuse it; use a header <= 1.$lib_minor"
if [ -n "${SOURCES_DIR:-}" ]; then
  for repo in $REPOS; do
    [ -f "$SOURCES_DIR/$repo/CMakeLists.txt" ] || fail "SOURCES_DIR=$SOURCES_DIR has no $repo/CMakeLists.txt"
  done
fi

echo "triton branch:    $TRITON_BRANCH (nvidia-pytriton $PYTRITON_VERSION)"
sources="git clone --depth 1 --branch $TRITON_BRANCH github.com/triton-inference-server/{${REPOS// /,}}"
echo "sources:          ${SOURCES_DIR:-$sources}"
echo "onnxruntime:      $ORT_LIB ($ORT_VERSION, soname $ORT_SONAME)"
echo "C API header:     ${ORT_HEADERS:-microsoft/onnxruntime v$ORT_HEADER_VERSION} (API $header_api)"
echo "output:           $OUT"
[ "$CHECK_ONLY" = 1 ] && exit 0

# -- sources ------------------------------------------------------------------------------
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/src" "$WORK/include" "$WORK/lib"
for repo in $REPOS; do
  if [ -n "${SOURCES_DIR:-}" ]; then
    cp -r "$SOURCES_DIR/$repo" "$WORK/src/$repo"
  else
    git clone -q --depth 1 --branch "$TRITON_BRANCH" \
      "https://github.com/triton-inference-server/$repo.git" "$WORK/src/$repo"
  fi
done
if [ -n "${ORT_HEADERS:-}" ]; then
  cp "$ORT_HEADERS/onnxruntime_c_api.h" "$WORK/include/"
else
  curl -fsSL -o "$WORK/include/onnxruntime_c_api.h" \
    "https://raw.githubusercontent.com/microsoft/onnxruntime/v$ORT_HEADER_VERSION/include/onnxruntime/core/session/onnxruntime_c_api.h"
fi

# Two edits to the private copy, each checked to have applied (a changed upstream file fails
# here, not in a confusing link error later):
# 1. common's unit tests fetch googletest at configure time and are not needed here.
edit() {  # FILE SED-EXPRESSION GREP-PATTERN-THAT-MUST-VANISH
  grep -q "$3" "$1" || fail "$1: expected '$3' (upstream changed?)"
  sed -i "$2" "$1"
  ! grep -q "$3" "$1" || fail "$1: could not remove '$3'"
}
edit "$WORK/src/common/src/CMakeLists.txt" 's/^add_subdirectory(test)/# &/' '^add_subdirectory(test)'
# 2. The backend links core's libtritonserver.so stub, so it would need a file of that name
#    at load time. The wheel ships the server core under another name; the TRITONSERVER_* /
#    TRITONBACKEND_* symbols resolve from the running tritonserver process instead.
edit "$WORK/src/onnxruntime_backend/CMakeLists.txt" '/^ *triton-core-serverstub /d' '^ *triton-core-serverstub '
ln -s "$ORT_LIB" "$WORK/lib/libonnxruntime.so"  # what find_library(onnxruntime) looks for

# -- build --------------------------------------------------------------------------------
# Prefix maps keep this machine's paths out of the binary (__FILE__ in its log messages).
cmake -S "$WORK/src/onnxruntime_backend" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-ffile-prefix-map=$WORK/src/=triton/ -fmacro-prefix-map=$WORK/src/=triton/" \
  -DTRITON_ENABLE_GPU=OFF -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF \
  -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF \
  -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$WORK/include" -DTRITON_ONNXRUNTIME_LIB_PATHS="$WORK/lib" \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$WORK/src/common" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$WORK/src/core" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$WORK/src/backend" >"$WORK/cmake.log" 2>&1 \
  || { tail -30 "$WORK/cmake.log" >&2; fail "cmake configure failed"; }
cmake --build "$WORK/build" --target triton-onnxruntime-backend -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { grep -E 'error|Error' "$WORK/build.log" | head -30 >&2; fail "build failed"; }

# -- the backend folder -------------------------------------------------------------------
# libtriton_onnxruntime.so finds libonnxruntime.so.1 beside itself (RUNPATH $ORIGIN).
readelf -d "$WORK/build/libtriton_onnxruntime.so" | grep -q 'RUNPATH.*ORIGIN' \
  || fail "libtriton_onnxruntime.so has no \$ORIGIN RUNPATH"
STAGE="$OUT.tmp.$$"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp "$WORK/build/libtriton_onnxruntime.so" "$ORT_LIB" "$STAGE/"
base=$(basename "$ORT_LIB")
[ "$ORT_SONAME" = "$base" ] || ln -s "$base" "$STAGE/$ORT_SONAME"
[ "$ORT_SONAME" = libonnxruntime.so ] || ln -s "$ORT_SONAME" "$STAGE/libonnxruntime.so"
if ldd "$STAGE/libtriton_onnxruntime.so" | grep 'not found' >&2; then
  rm -rf "$STAGE"
  fail "libtriton_onnxruntime.so has unresolved libraries (above)"
fi
cat >"$STAGE/PROVENANCE" <<EOF
Triton onnxruntime backend, CPU only, built by triton-sam scripts/build_onnxruntime_backend.sh
branch $TRITON_BRANCH: $(for r in $REPOS; do printf '%s ' "$r=$(git -C "$WORK/src/$r" rev-parse --short HEAD 2>/dev/null || echo unknown)"; done)
onnxruntime $ORT_VERSION ($base, from the wheel); C API header API version $header_api
for the tritonserver of nvidia-pytriton $PYTRITON_VERSION
EOF
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
mv "$STAGE" "$OUT"  # never a half-written backend folder
echo "built $OUT"
