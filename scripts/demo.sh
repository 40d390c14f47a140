#!/usr/bin/env bash
# Installs dependencies, builds kiln and runs its main job on built-in models: summarize
# resnet50, compile it (showing fusion, layout and memory plan), and benchmark eager against
# compiled execution side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh --target kiln
KILN=${KILN_BUILD_DIR:-build}/tools/kiln
set -x
"$KILN" info resnet50
"$KILN" compile resnet50 --explain-algos
"$KILN" bench resnet18 --runs 5
"$KILN" bench bert_layer --runs 5
