#!/usr/bin/env bash
# Configures and builds kiln in build/ (Release, Ninja, ccache). Extra arguments are passed to
# the build (e.g. --target kiln). Used by demo.sh and test.sh so both share one build.
# With KILN_PYTHON_EXECUTABLE set (test.sh sets it to the project's venv, tools/peers/setup.sh
# --python), the Python package is built too, into build/python/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths relative to the checkout, so that every clone (CI's included) shares cache hits.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
configure=()
if [ -n "${KILN_PYTHON_EXECUTABLE:-}" ] &&
   ! grep -qxF "KILN_PYTHON_EXECUTABLE:FILEPATH=$KILN_PYTHON_EXECUTABLE" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  configure=(-DKILN_PYTHON_EXECUTABLE="$KILN_PYTHON_EXECUTABLE")
fi
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ ${#configure[@]} -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
    "${configure[@]}" >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" "$@"
