#!/usr/bin/env bash
# Data-parallel training throughput over MPI, side by side in one run: `kiln train` in one
# process against `mpirun -np 2 kiln train --ddp` (the same batch per rank, 1 compute thread per
# process), with the all-reduces started during the backward (the default) and after it
# (--no-overlap). Prints samples/s, the scaling over one process, and how much of the
# communication the backward hid: 1 - (wait after the backward with overlap) / (the same wait
# without). A benchmark, not a test.
#   scripts/bench-ddp.sh [--steps N] [--bucket-mb M]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=30 bucket=25
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --bucket-mb) bucket=$2; shift 2 ;;
    *) echo "usage: scripts/bench-ddp.sh [--steps N] [--bucket-mb M]" >&2; exit 2 ;;
  esac
done
scripts/build.sh --target kiln >/dev/null
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; $(mpirun --version | head -1)"
printf '%-10s %6s %12s %12s %8s %12s %12s %12s %10s\n' model batch 1proc_sps 2ranks_sps scaling \
  fwd_bwd_ms wait_ms no_overlap_ms hidden
for spec in mnist_cnn:64:$steps resnet18:16:$(( steps < 6 ? steps : 6 )); do
  IFS=: read -r name batch n <<<"$spec"
  args=(train "$name" --batch "$batch" --steps "$n" --threads 1 --no-dropout --json)
  OMP_NUM_THREADS=1 "$KILN" "${args[@]}" > "$tmp/one.json"
  "${mpi[@]}" "$KILN" "${args[@]}" --ddp --bucket-mb "$bucket" > "$tmp/ddp.json"
  "${mpi[@]}" "$KILN" "${args[@]}" --ddp --bucket-mb "$bucket" --no-overlap > "$tmp/serial.json"
  python3 - "$tmp" "$name" "$batch" <<'PY'
import json, sys
d, name, batch = sys.argv[1], sys.argv[2], sys.argv[3]
one, ddp, serial = (json.load(open(f"{d}/{n}.json")) for n in ("one", "ddp", "serial"))
p, q = ddp["data_parallel"], serial["data_parallel"]
wait, full = p["median_exposed_allreduce_ms"], q["median_exposed_allreduce_ms"]
hidden = 1 - wait / full if full > 0 else float("nan")
print(f"{name:<10} {batch:>6} {one['samples_per_s']:12.1f} {ddp['samples_per_s']:12.1f} "
      f"{ddp['samples_per_s'] / one['samples_per_s']:7.2f}x {p['median_forward_backward_ms']:12.2f} "
      f"{wait:12.2f} {full:12.2f} {100 * hidden:9.0f}%   "
      f"({p['buckets']} buckets, {p['allreduce_bytes'] / 1e6:.1f} MB)")
PY
done
