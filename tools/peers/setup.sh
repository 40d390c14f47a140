#!/usr/bin/env bash
# Creates the peer environment and the peer exports that kiln's `peer` tests compare against:
# a Python virtual environment with PyTorch, torchvision, ONNX and ONNX Runtime from PyPI
# (.peers/venv, about 6 GB with PyTorch's CUDA wheels; 5 minutes here), then every model in
# tools/peers/models.txt exported to ONNX with PyTorch's and ONNX Runtime's outputs
# (.peers/models/<name>/, see export.py). Idempotent: what exists is kept.
#   tools/peers/setup.sh [--force] [--only name,name]
# Afterwards `scripts/test.sh` (or `ctest -L peer` in build/) runs the peer tests.
# KILN_PEERS_DIR moves .peers/models elsewhere (the tests read the same variable).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.peers/venv
out=${KILN_PEERS_DIR:-.peers/models}

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, torchvision, onnx, onnxruntime' 2>/dev/null; then
  echo "peers: creating $venv (PyTorch, torchvision, ONNX, ONNX Runtime from PyPI)"
  python3 -m venv "$venv"
  # The versions the committed notes were measured with.
  "$venv/bin/pip" install --quiet --progress-bar off torch==2.15.0 torchvision==0.29.2 \
    onnx==1.23.2 onnxruntime==1.31.1 numpy==2.4.6
fi
"$venv/bin/python" tools/peers/export.py "$out" "$@"
"$venv/bin/python" tools/peers/train_export.py "$out" "$@"
