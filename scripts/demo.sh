#!/usr/bin/env bash
# Installs dependencies, builds kiln and runs its main job on built-in models: summarize
# resnet50, then run mnist_cnn and resnet18 eagerly on seeded inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh --target kiln
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
set -x
"$KILN" info resnet50
"$KILN" run mnist_cnn --eager --batch 4
"$KILN" run resnet18 --eager
