#!/usr/bin/env bash
# Installs dependencies, builds kiln and runs the whole test suite through ctest.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${KILN_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" "$@"
