#!/usr/bin/env bash
# kiln against its peers on the peer models (tools/peers/setup.sh makes them): `kiln bench` on
# each ONNX export (eager and compiled) and PyTorch eager / ONNX Runtime (bench.py), all with the
# same thread count, in one run. Benchmarks, not tests: quote the medians on a quiet machine.
#   tools/peers/bench.sh [--batch B] [--threads T] [--runs R] [--only name,name]
set -euo pipefail
cd "$(dirname "$0")/../.."
batch=1 threads=$(nproc) runs=10 only=""
while [ $# -gt 0 ]; do
  case $1 in
    --batch) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: tools/peers/bench.sh [--batch B] [--threads T] [--runs R] [--only a,b]" >&2; exit 2 ;;
  esac
done
source tools/peers/env.sh
models=$peers_dir
[ -f "$peers_venv/.complete" ] && [ -d "$models" ] || {
  echo "peers: no peer environment; run tools/peers/setup.sh first" >&2; exit 2; }
scripts/build.sh --target kiln >/dev/null
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
names=$(if [ -n "$only" ]; then echo "$only" | tr , '\n'; else cat tools/peers/models.txt; fi)

declare -A torch_ms ort_ms
while read -r line; do
  name=$(echo "$line" | sed 's/.*"model": "\([^"]*\)".*/\1/')
  torch_ms[$name]=$(echo "$line" | sed 's/.*"torch_eager_ms": \([0-9.]*\).*/\1/')
  ort_ms[$name]=$(echo "$line" | sed 's/.*"onnxruntime_ms": \([0-9.]*\).*/\1/')
done < <("$peers_venv/bin/python" tools/peers/bench.py "$models" --threads "$threads" --runs "$runs" \
  --batch "$batch" --only "$(echo $names | tr ' ' ,)")

printf '%-20s %5s %10s %12s %8s %10s %10s %10s\n' model batch kiln_eager kiln_compiled speedup \
  torch_eager onnxruntime compile_ms
for name in $names; do
  json=$("$KILN" bench "$models/$name/model.onnx" --batch "$batch" --threads "$threads" \
    --runs "$runs" --json)
  get() { echo "$2" | grep -m1 "\"$1\"" | sed 's/.*: //; s/,$//'; }
  eager=$(echo "$json" | sed -n '/"eager"/,/}/p')
  compiled=$(echo "$json" | sed -n '/"compiled"/,/}/p')
  printf '%-20s %5s %10.2f %12.2f %8.2f %10.2f %10.2f %10.1f\n' "$name" "$batch" \
    "$(get median_ms "$eager")" "$(get median_ms "$compiled")" "$(get speedup "$json")" \
    "${torch_ms[$name]}" "${ort_ms[$name]}" "$(get compile_cold_ms "$compiled")"
done
echo "(medians in ms over $runs runs, $threads threads)"
