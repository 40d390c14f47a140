# Sourced by the peer scripts: where the peer environment and the peer exports live.
# The Python environment (PyTorch, torchvision, ONNX, onnxscript for PyTorch's default ONNX
# exporter, ONNX Runtime; pinned below) and the exports live outside the clone, under
# ${KILN_CACHE_DIR:-~/.cache/kiln}/, keyed by the pins (and the exports also by the export
# scripts), so that every clone and every CI run reuses them. Sets:
#   peers_pins   the pip requirements
#   peers_venv   the virtual environment ($KILN_PEERS_VENV overrides)
#   peers_dir    the exports, one folder per model ($KILN_PEERS_DIR overrides)
#   python_pins  what building and testing kiln's Python package adds to that environment
#                (nanobind, scikit-build-core, pytest) and the digits data set needs
#                (scikit-learn); installed by setup.sh --python, marked
#                by $peers_venv/.python-<key>, so that changing them does not remake the rest
# shellcheck shell=bash
peers_pins="torch==2.15.0 torchvision==0.29.2 onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.31.1 numpy==2.4.6"
python_pins="nanobind==2.9.2 scikit-build-core==0.11.6 pytest==8.4.2 scikit-learn==1.9.1"
python_marker=.python-$(printf '%s' "$python_pins" | sha256sum | cut -c1-12)
_peers_root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_peers_cache=${KILN_CACHE_DIR:-$HOME/.cache/kiln}
_peers_key=$(printf '%s' "$peers_pins" | sha256sum | cut -c1-12)
_peers_exports_key=$( (printf '%s' "$peers_pins"; cat "$_peers_root"/export.py "$_peers_root"/train_export.py \
  "$_peers_root"/models.py "$_peers_root"/models.txt) | sha256sum | cut -c1-12)
peers_venv=${KILN_PEERS_VENV:-$_peers_cache/peers-venv-$_peers_key}
peers_dir=${KILN_PEERS_DIR:-$_peers_cache/peers-models-$_peers_exports_key}
unset _peers_root _peers_cache _peers_key _peers_exports_key
