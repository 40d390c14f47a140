#!/usr/bin/env bash
# Training throughput and memory, side by side in one run: `kiln train --json` compiled and
# --eager, and PyTorch eager on the CPU (train_export.py --bench: same model, SGD momentum 0.9,
# cross-entropy, the same thread count), for mnist_cnn at batch 64 and resnet18 at batch 32
# (224x224). kiln's memory is the peak of intermediate buffers (compiled: the planned arena;
# eager: the allocator's high-water mark); PyTorch's is the rise of the process's peak RSS.
# Benchmarks, not tests.
#   tools/peers/train_bench.sh [--steps N] [--threads T]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=10 threads=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "usage: tools/peers/train_bench.sh [--steps N] [--threads T]" >&2; exit 2 ;;
  esac
done
scripts/build.sh --target kiln >/dev/null
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
source tools/peers/env.sh
have_torch=0
[ -f "$peers_venv/.complete" ] && have_torch=1
get() { echo "$2" | grep -m1 "\"$1\"" | sed 's/.*: //; s/,$//'; }
printf '%-10s %5s %14s %14s %8s %14s %12s %12s %12s\n' model batch kiln_compiled kiln_eager ratio \
  torch_eager compiled_MB eager_MB torch_MB
for spec in mnist_cnn:64:28 resnet18:32:224; do
  IFS=: read -r name batch image <<<"$spec"
  n=$steps
  [ "$name" = resnet18 ] && n=$(( steps < 8 ? steps : 8 ))  # ~1-1.5 s per step.
  compiled=$(OMP_NUM_THREADS=$threads "$KILN" train "$name" --batch "$batch" --steps "$n" --json)
  eager=$(OMP_NUM_THREADS=$threads "$KILN" train "$name" --batch "$batch" --steps "$n" --eager --json)
  c=$(get samples_per_s "$compiled") e=$(get samples_per_s "$eager")
  cm=$(get peak_activation_bytes "$compiled") em=$(get peak_activation_bytes "$eager")
  t=- tm=-
  if [ $have_torch = 1 ]; then
    torch=$(KILN_THREADS=$threads "$peers_venv/bin/python" tools/peers/train_export.py --bench "$name" \
      --batch "$batch" --image "$image" --steps "$n")
    t=$(echo "$torch" | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/')
    t=$(awk -v v="$t" 'BEGIN { printf "%.1f", v }')
    tm=$(echo "$torch" | sed 's/.*"peak_rss_increase_bytes": \([0-9]*\).*/\1/')
    tm=$(awk -v b="$tm" 'BEGIN { printf "%.0f", b / 1e6 }')
  fi
  printf '%-10s %5s %14.1f %14.1f %8.2f %14s %12.0f %12.0f %12s\n' "$name" "$batch" "$c" "$e" \
    "$(awk -v a="$c" -v b="$e" 'BEGIN { print a / b }')" "$t" "$(awk -v b="$cm" 'BEGIN { print b / 1e6 }')" \
    "$(awk -v b="$em" 'BEGIN { print b / 1e6 }')" "$tm"
done
echo "samples/s (median step, the first left out); memory in MB; $threads threads"
