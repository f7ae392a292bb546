#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (unit, protocol, integration).
# Extra arguments go to `meson test` (e.g. --suite unit, or a test name).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
meson test -C build --print-errorlogs "$@"
