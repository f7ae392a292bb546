#!/usr/bin/env bash
# Sets everything up, then runs the demo with its defaults: the broker (tcp://127.0.0.1:7235),
# a learner and three collectors as separate processes training cart-pole until it is
# solved. Extra arguments go to the demo; see `build/examples/demo/rlbus-demo --help`. Ctrl-C stops
# everything cleanly. The broker alone: build/src/rlbus-broker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh run  # the build tools and libraries; the broker, rlbus-ctl and the demo
exec build/examples/demo/rlbus-demo run "$@"
