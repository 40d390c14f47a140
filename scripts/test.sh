#!/usr/bin/env bash
# Installs dependencies, builds kiln and runs the whole test suite through ctest, then, when
# KILN_FUZZ_SECONDS is set (CI sets 60), every fuzz target for that many seconds each
# (scripts/fuzz.sh). The `peer` tests run when tools/peers/setup.sh has made the peer exports,
# and are skipped otherwise. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd "${KILN_BUILD_DIR:-build}" && ctest --output-on-failure -j"$(nproc)" "$@")
fuzz_seconds=${KILN_FUZZ_SECONDS:-0}
if [ "$fuzz_seconds" -gt 0 ]; then
  # A loaded CI machine can stall one input for seconds: a hang here is 30 s, not 10.
  scripts/fuzz.sh all "$fuzz_seconds" -timeout=30
fi
