#!/usr/bin/env bash
# Real data end to end: mnist_cnn trained by `kiln train` on the 1,797 handwritten digit scans of
# scikit-learn, converted to MNIST's IDX format (tools/data/make-digits.sh; 1,500 to train, 297
# to validate), must reach 97% validation accuracy, and the step must not wait for data more than
# 5% of the time; the same data read from digits.npz trains exactly as from the IDX files. Exits
# 77 (skipped) when the Python environment cannot be made.
#   train_digits.sh KILN_BINARY
set -euo pipefail
KILN=$1
cd "$(dirname "$0")/../.."
data=$(tools/data/make-digits.sh) || exit $?
out=$("$KILN" train mnist_cnn --data "idx:$data" --optimizer adam --epochs 15 --batch 64 --json)
# The same data as a NumPy archive (digits.npz, deflated, u8 [M, 28, 28] images): the same run.
short=(train mnist_cnn --optimizer adam --epochs 1 --batch 64 --json)
idx_loss=$("$KILN" "${short[@]}" --data "idx:$data" | grep '"final_loss"')
npz_loss=$("$KILN" "${short[@]}" --data "npz:$data/digits.npz" | grep '"final_loss"')
echo "one epoch from IDX files and from digits.npz: $idx_loss / $npz_loss"
[ "$idx_loss" = "$npz_loss" ] || { echo "npz: a different run than IDX" >&2; exit 1; }
python3 - "$out" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
curve = " ".join(f"{e['val_accuracy']:.3f}" for e in r["epoch_log"])
print(f"validation accuracy per epoch: {curve}")
print(f"data wait {100 * r['data_wait_fraction']:.2f}% of the run, {r['samples_per_s']:.0f} samples/s")
assert r["val_accuracy"] >= 0.97, f"validation accuracy {r['val_accuracy']:.3f} < 0.97"
assert r["data_wait_fraction"] < 0.05, f"data wait {r['data_wait_fraction']:.3f} >= 5%"
PY
