#!/usr/bin/env bash
# Serving side by side: `kiln bench EXPORT --concurrency C` and ONNX Runtime's session called
# from C Python threads (serve_bench.py), on the peer exports (tools/peers/setup.sh), the same
# compute-thread count, one concurrency level of each in turn. A benchmark, not a test.
#   tools/peers/serve_bench.sh [--models resnet18,bert_layer] [--concurrency 1,2,4]
#                              [--duration S] [--threads T]
set -euo pipefail
cd "$(dirname "$0")/../.."
models=resnet18,bert_layer levels=1,2,4 duration=5 threads=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --concurrency) levels=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "usage: tools/peers/serve_bench.sh [--models a,b] [--concurrency 1,2,4] [--duration S] [--threads T]" >&2; exit 2 ;;
  esac
done
source tools/peers/env.sh
dir=$peers_dir
[ -f "$peers_venv/.complete" ] && [ -d "$dir" ] || {
  echo "peers: no peer environment; run tools/peers/setup.sh first" >&2; exit 2; }
scripts/build.sh --target kiln >/dev/null
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); r=d['levels'][0] if 'levels' in d else d; print('%.1f %.2f %.2f %.2f' % (r['requests_per_s'], r['p50_ms'], r['p90_ms'], r['p99_ms']))"; }
printf '%-12s %5s | %10s %8s %8s %8s | %10s %8s %8s %8s\n' model conc kiln_req/s p50 p90 p99 \
  ort_req/s p50 p90 p99
for m in ${models//,/ }; do
  for c in ${levels//,/ }; do
    k=$("$KILN" bench "$dir/$m/model.onnx" --threads "$threads" --concurrency "$c" \
      --duration "$duration" --json 2>/dev/null | field)
    o=$("$peers_venv/bin/python" tools/peers/serve_bench.py "$dir/$m/model.onnx" \
      --concurrency "$c" --duration "$duration" --threads "$threads" | field)
    read -r kt k50 k90 k99 <<<"$k"
    read -r ot o50 o90 o99 <<<"$o"
    printf '%-12s %5s | %10s %8s %8s %8s | %10s %8s %8s %8s\n' "$m" "$c" "$kt" "$k50" "$k90" \
      "$k99" "$ot" "$o50" "$o90" "$o99"
  done
done
