#!/usr/bin/env bash
# The ONNX conformance suite through kiln: the backend node tests that ship in the `onnx` Python
# package, each run eagerly and compiled by kiln and compared at its rtol/atol
# (tests/tools/onnx_conformance.cpp), against the list of expected failures
# (tests/data/onnx_expected_failures.txt, every entry a clear error with its reason).
#
#   scripts/onnx-conformance.sh                   run, check the list; exit 1 on any difference
#   scripts/onnx-conformance.sh --write-expected  rewrite the list from this run
#   scripts/onnx-conformance.sh --only test_abs --verbose
#   scripts/onnx-conformance.sh --device emu      the CUDA backend (emu, or cuda on a GPU), same list
#   scripts/onnx-conformance.sh --cases-dir       print where the cases of these pins live
#
# The Python environment (onnx and numpy, pinned) and the generated cases live outside the
# clone, in ${KILN_CACHE_DIR:-~/.cache/kiln}/, keyed by the pins, and are reused when present.
# Exits 77 (ctest: skipped) only when the environment cannot be created (no PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
runner=$build/tests/kiln_onnx_conformance
expected=tests/data/onnx_expected_failures.txt
pins="onnx==1.23.2 numpy==2.4.6"
key=$(printf '%s' "$pins" | sha256sum | cut -c1-12)
cache=${KILN_CACHE_DIR:-$HOME/.cache/kiln}
venv=$cache/onnx-venv-$key
cases=$cache/onnx-node-tests-$key

if [ "${1:-}" = --cases-dir ]; then
  echo "$cases"
  exit 0
fi
if [ ! -x "$runner" ]; then
  echo "onnx-conformance: $runner is missing (build it: cmake --build $build --target kiln_onnx_conformance)" >&2
  exit 2
fi
if [ ! -f "$venv/.complete" ]; then
  echo "onnx-conformance: creating $venv ($pins)"
  rm -rf "$venv"
  mkdir -p "$cache"
  if ! python3 -m venv "$venv" || ! "$venv/bin/python" -m pip install --quiet --progress-bar off $pins; then
    echo "onnx-conformance: cannot create the Python environment (is PyPI reachable?); skipped" >&2
    rm -rf "$venv"
    exit 77
  fi
  touch "$venv/.complete"
fi
if [ ! -f "$cases/cases.txt" ]; then
  rm -rf "$cases.tmp"
  "$venv/bin/python" tools/onnx/gen_node_tests.py "$cases.tmp"
  rm -rf "$cases"
  mv "$cases.tmp" "$cases"
fi

args=()
write=0
for a in "$@"; do
  if [ "$a" = "--write-expected" ]; then write=1; else args+=("$a"); fi
done
if [ $write = 1 ]; then
  "$runner" "$cases" --write-expected "$expected" "${args[@]}" || true
  echo "onnx-conformance: wrote $expected"
  exit 0
fi
exec "$runner" "$cases" --expected "$expected" "${args[@]}"
