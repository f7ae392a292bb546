#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (unit, protocol, integration).
# Extra arguments go to `meson test` (e.g. --suite unit, or a test name).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
# meson test exits with the number of tests that failed; this exits 0 or 1.
meson test -C build --print-errorlogs "$@" || exit 1
