#!/usr/bin/env bash
# kiln against PyTorch eager, torch.compile (Inductor, freezing on) and ONNX Runtime, side by
# side in one run on the same ONNX export, threads and inputs: every peer model
# (tools/peers/models.txt) at batch 1, resnet50 at 32 and the BERT layer at 8, with this
# machine's FMA peak and copy bandwidth. Writes OUT/bench-peers.json and OUT/bench-peers.md
# (default OUT: bench-peers/) and prints the table. A benchmark, not a test: about 15 minutes
# on 2 cores (torch.compile compiles each model); run it on a quiet machine.
#   scripts/bench-peers.sh [--out DIR] [--threads T] [--runs R] [--warmup W] [--min-round-s S]
#                          [--block-s S] [--gap-s S] [--rounds N] [--cases resnet18:1,resnet50:32] [--max-autotune]
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench-peers
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --threads | --runs | --warmup | --min-round-s | --block-s | --gap-s | --rounds | --cases) args+=("$1" "$2"); shift 2 ;;
    --max-autotune) args+=("$1"); shift ;;
    *) echo "usage: scripts/bench-peers.sh [--out DIR] [--threads T] [--runs R] [--warmup W]" \
         "[--min-round-s S] [--block-s S] [--gap-s S] [--rounds N] [--cases name:batch,...] [--max-autotune]" >&2; exit 2 ;;
  esac
done
scripts/install-deps.sh >/dev/null
tools/peers/setup.sh >/dev/null  # The pinned environment and the exports, made or reused.
# kiln is timed through its Python package, in the same process as the peers.
KILN_PYTHON_EXECUTABLE=$(tools/peers/setup.sh --python) \
  scripts/build.sh --target kiln --target kiln_python >/dev/null
source tools/peers/env.sh
version=$(git describe --always --dirty 2>/dev/null || echo unknown)
build=${KILN_BUILD_DIR:-build}
exec "$peers_venv/bin/python" tools/peers/bench_peers.py --kiln "$build/tools/kiln" \
  --kiln-python "$build/python" --peers-dir "$peers_dir" --out "$out" --kiln-version "$version" "${args[@]}"
