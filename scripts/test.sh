#!/usr/bin/env bash
# Installs dependencies, builds kiln and runs the whole test suite through ctest, then, when
# KILN_FUZZ_SECONDS is set (CI sets 45), every fuzz target for that many seconds each
# (scripts/fuzz.sh). The `peer` tests first run tools/peers/setup.sh (ctest `peer: setup`), which
# makes or reuses the pinned PyTorch / ONNX Runtime environment and the exports under
# ~/.cache/kiln; they are skipped only when it cannot be made (no PyPI). The ONNX conformance test
# does the same for its own environment. The Python package (python/) is built against that
# environment (tools/peers/setup.sh --python) and its pytest suite runs as the ctest test
# "python: pytest"; without PyPI both are skipped. Exits non-zero on any failure.
#   scripts/test.sh [ctest args...]
#   scripts/test.sh --sanitize address|thread [ctest args...]
# --sanitize builds the test binaries the ctest label `sanitize` needs with ASan+UBSan
# (build-asan/) or TSan (build-tsan/) and runs that label: the fast unit tests and the
# concurrency tests (tests/CMakeLists.txt; suppressions in tests/sanitizers/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

if [ "${1:-}" = --sanitize ]; then
  mode=${2:-}
  shift 2 || true
  case $mode in
    address) dir=build-asan; targets=(test_ir test_runtime test_codegen test_compiler test_frontends test_gpu) ;;
    thread) dir=build-tsan; targets=(test_codegen test_compiler test_frontends test_gpu) ;;
    *) echo "usage: scripts/test.sh --sanitize address|thread [ctest args...]" >&2; exit 2 ;;
  esac
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
      -DKILN_SANITIZE="$mode" >/dev/null
  fi
  cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
  (cd "$dir" && ctest --output-on-failure -j"$(nproc)" -L sanitize "$@")
  exit 0
fi

if python=$(tools/peers/setup.sh --python); then
  export KILN_PYTHON_EXECUTABLE=$python
else
  echo "test.sh: no Python environment; the Python package is not built or tested" >&2
fi
scripts/build.sh
(cd "${KILN_BUILD_DIR:-build}" && ctest --output-on-failure -j"$(nproc)" "$@")
fuzz_seconds=${KILN_FUZZ_SECONDS:-0}
if [ "$fuzz_seconds" -gt 0 ]; then
  # A loaded CI machine can stall one input for seconds: a hang here is 30 s, not 10.
  scripts/fuzz.sh all "$fuzz_seconds" -timeout=30
fi
