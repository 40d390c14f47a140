#!/usr/bin/env bash
# Runs a command with KILN_PEERS_DIR and KILN_PEERS_VENV set to the peer exports and environment
# (tools/peers/env.sh): how ctest runs the peer checks.
#   tools/peers/with-env.sh COMMAND [ARGS...]
set -euo pipefail
source "$(dirname "$0")/env.sh"
export KILN_PEERS_DIR=$peers_dir KILN_PEERS_VENV=$peers_venv
exec "$@"
