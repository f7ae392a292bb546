#!/usr/bin/env bash
# Sets everything up, then runs the broker with its built-in defaults (router on
# tcp://127.0.0.1:7235, events on tcp://127.0.0.1:7236). Extra arguments go to the broker;
# see `build/src/rlbus-broker --help`. Ctrl-C stops it cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec build/src/rlbus-broker "$@"
