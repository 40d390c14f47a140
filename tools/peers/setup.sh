#!/usr/bin/env bash
# Creates the peer environment and the peer exports that kiln's `peer` tests compare against:
# a Python virtual environment with PyTorch, torchvision, ONNX, onnxscript and ONNX Runtime from
# PyPI (about 6 GB with PyTorch's CUDA wheels; 5 minutes here), then every model in
# tools/peers/models.txt exported to ONNX twice — by PyTorch's default exporter (torch.export,
# opset 20, weights as external data) and by the legacy TorchScript exporter (opset 17) — with
# PyTorch's and ONNX Runtime's outputs (see export.py), and the training references
# (train_export.py). Both live under ~/.cache/kiln, keyed by their pins (tools/peers/env.sh), so
# that clones and CI runs reuse them. Idempotent: what exists is kept.
#   tools/peers/setup.sh [--force] [--only name,name]
#   tools/peers/setup.sh --print-dir     print the exports folder and exit
#   tools/peers/setup.sh --python        only the environment, with python_pins (env.sh) added
#                                        for kiln's Python package; prints its Python
# Afterwards `scripts/test.sh` (or `ctest -L peer` in build/) runs the peer tests; ctest runs
# this script first (test "peer: setup"). Exits 77 (ctest: skipped) only when the environment
# cannot be created (no PyPI).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/peers/env.sh
if [ "${1:-}" = --print-dir ]; then echo "$peers_dir"; exit 0; fi
python_only=0
if [ "${1:-}" = --python ]; then python_only=1; shift; fi

if [ ! -f "$peers_venv/.complete" ]; then
  echo "peers: creating $peers_venv ($peers_pins)" >&2
  rm -rf "$peers_venv"
  mkdir -p "$(dirname "$peers_venv")"
  # shellcheck disable=SC2086
  if ! python3 -m venv "$peers_venv" ||
     ! "$peers_venv/bin/python" -m pip install --quiet --progress-bar off $peers_pins >&2; then
    echo "peers: cannot create the Python environment (is PyPI reachable?); skipped" >&2
    rm -rf "$peers_venv"
    exit 77
  fi
  touch "$peers_venv/.complete"
fi
if [ ! -f "$peers_venv/$python_marker" ]; then
  echo "peers: adding $python_pins to $peers_venv" >&2
  # shellcheck disable=SC2086
  if ! "$peers_venv/bin/python" -m pip install --quiet --progress-bar off $python_pins >&2; then
    echo "peers: cannot install $python_pins (is PyPI reachable?); skipped" >&2
    exit 77
  fi
  touch "$peers_venv/$python_marker"
fi
if [ "$python_only" = 1 ]; then echo "$peers_venv/bin/python"; exit 0; fi
mkdir -p "$peers_dir"
"$peers_venv/bin/python" tools/peers/export.py "$peers_dir" "$@"
"$peers_venv/bin/python" tools/peers/train_export.py "$peers_dir" "$@"
# Optimizer variants (AdamW, Nesterov): their own script hash in each folder, not in the key.
"$peers_venv/bin/python" tools/peers/optim_export.py "$peers_dir"
