#!/usr/bin/env bash
# `kiln train --ddp` end to end on real data (the digits of tools/data/make-digits.sh), 2 ranks
# of 1 thread under mpirun:
#  - 2 ranks x batch 32 follow 1 process x batch 64 (the loader's shards, dropout by global sample
#    index): the same losses within 1e-4 after 20 steps;
#  - a run stopped at step 10 and resumed (--checkpoint, --resume, rank 0 saves) ends with
#    bitwise the loss of the uninterrupted one;
#  - the all-reduce figures are reported.
# Exits 77 (skipped) when the Python environment for the data cannot be made.
#   ddp_train.sh KILN_BINARY MPIRUN
set -euo pipefail
KILN=$1
MPIRUN=$2
cd "$(dirname "$0")/../.."
data=$(tools/data/make-digits.sh) || exit $?
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=("$MPIRUN" --oversubscribe -np 2 -x OMP_NUM_THREADS=1)
common=(train mnist_cnn --data "idx:$data" --steps 20 --threads 1 --val-split 0 --json)
"$KILN" "${common[@]}" --batch 64 > "$tmp/single.json"
"${mpi[@]}" "$KILN" "${common[@]}" --batch 32 --ddp --bucket-mb 1 > "$tmp/ddp.json"
"${mpi[@]}" "$KILN" train mnist_cnn --data "idx:$data" --steps 10 --threads 1 --val-split 0 \
  --batch 32 --ddp --bucket-mb 1 --checkpoint "$tmp/ckpt" --json > /dev/null
"${mpi[@]}" "$KILN" "${common[@]}" --batch 32 --ddp --bucket-mb 1 --checkpoint "$tmp/ckpt" \
  --resume > "$tmp/resumed.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
single, ddp, resumed = (json.load(open(f"{d}/{n}.json")) for n in ("single", "ddp", "resumed"))
p = ddp["data_parallel"]
print(f"1 process x 64: loss {single['first_loss']:.6f} -> {single['final_loss']:.6f}")
print(f"2 ranks x 32:   loss {ddp['first_loss']:.6f} -> {ddp['final_loss']:.6f}; "
      f"{p['buckets']} buckets, {p['buckets_started_during_backward']} started during the "
      f"backward, forward+backward {p['median_forward_backward_ms']:.2f} ms, waited "
      f"{p['median_exposed_allreduce_ms']:.2f} ms, update {p['median_update_ms']:.2f} ms")
assert p["ranks"] == 2 and p["global_batch"] == 64, p
for k in ("first_loss", "final_loss"):
    assert abs(ddp[k] - single[k]) <= 1e-4 * abs(single[k]), (k, ddp[k], single[k])
assert resumed["final_loss"] == ddp["final_loss"], (resumed["final_loss"], ddp["final_loss"])
print("resumed at step 10: the same final loss, bitwise")
PY
