#!/usr/bin/env bash
# Configures and builds kiln in build/ (Release, Ninja, ccache). Extra arguments are passed to
# the build (e.g. --target kiln). Used by demo.sh and test.sh so both share one build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths relative to the checkout, so that every clone (CI's included) shares cache hits.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" "$@"
