#!/usr/bin/env bash
# kiln from Python, timed side by side in one process (tools/peers/bench_python.py): the call
# overhead of a compiled mlp from Python against the C++ API, and torch.compile(backend="kiln")
# against backend="inductor" and eager on resnet18, resnet50 and the BERT layer (first call and
# steady state), plus resnet18 with one graph break. A benchmark, not a test.
#   scripts/bench-python.sh [--threads N] [--json out.json] [--skip-inductor] [--iters N]
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(tools/peers/setup.sh --python)
KILN_PYTHON_EXECUTABLE=$python scripts/build.sh --target kiln kiln_python >/dev/null
PYTHONPATH=build/python exec "$python" tools/peers/bench_python.py "$@"
