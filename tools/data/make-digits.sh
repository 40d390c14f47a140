#!/usr/bin/env bash
# Makes (or reuses) the digits dataset in MNIST's IDX format under
# ${KILN_CACHE_DIR:-~/.cache/kiln}/data/digits-<key>/ (key: the converter and the pins) with the
# project's Python environment (tools/peers/setup.sh --python, which has scikit-learn), and
# prints the folder: `kiln train mnist_cnn --data idx:$(tools/data/make-digits.sh) --epochs 10`.
# Exits 77 when the environment cannot be made (no PyPI).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/peers/env.sh
python=$(tools/peers/setup.sh --python) || exit $?
key=$( (printf '%s' "$python_pins"; cat tools/data/digits_to_idx.py) | sha256sum | cut -c1-12)
out=${KILN_CACHE_DIR:-$HOME/.cache/kiln}/data/digits-$key
if [ ! -f "$out/.complete" ]; then
  "$python" tools/data/digits_to_idx.py "$out" >&2
  touch "$out/.complete"
fi
echo "$out"
