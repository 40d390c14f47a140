#!/usr/bin/env bash
# Benchmarks eager against compiled execution on every zoo model at batch 1 and 32:
# `kiln bench --json` per model into OUT_DIR (default bench-results/), and a summary table.
# Benchmarks are not tests: run this on a quiet machine and quote the medians it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results}
scripts/install-deps.sh
scripts/build.sh --target kiln >/dev/null
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
mkdir -p "$OUT"
printf '%-11s %5s %12s %12s %8s %12s %12s %10s %10s\n' model batch eager_ms compiled_ms speedup eager_MB compiled_MB cold_ms warm_ms
for batch in 1 32; do
  for model in mlp mnist_cnn resnet18 resnet50 bert_layer; do
    runs=10
    [ "$batch" = 32 ] && runs=5
    f="$OUT/$model-b$batch.json"
    "$KILN" bench "$model" --batch "$batch" --runs "$runs" --json > "$f"
    # One line per run from the JSON (kiln prints one key per line).
    get() { grep -m1 "\"$1\"" "$2" | sed 's/.*: //; s/,$//'; }
    eager=$(sed -n '/"eager"/,/}/p' "$f")
    compiled=$(sed -n '/"compiled"/,/}/p' "$f")
    printf '%-11s %5s %12.2f %12.2f %8.2f %12.2f %12.2f %10.1f %10.1f\n' "$model" "$batch" \
      "$(get median_ms <(echo "$eager"))" "$(get median_ms <(echo "$compiled"))" "$(get speedup "$f")" \
      "$(awk -v b="$(get peak_activation_bytes <(echo "$eager"))" 'BEGIN { print b / 1e6 }')" \
      "$(awk -v b="$(get peak_activation_bytes <(echo "$compiled"))" 'BEGIN { print b / 1e6 }')" \
      "$(get compile_cold_ms <(echo "$compiled"))" "$(get compile_warm_ms <(echo "$compiled"))"
  done
done
