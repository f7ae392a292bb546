#!/usr/bin/env bash
# Builds the project with AddressSanitizer and UndefinedBehaviorSanitizer in build-sanitize/
# and runs the unit and protocol suites there: any leak, overflow, use after free or undefined
# behaviour they reach fails the run. Slower than the default suite (a second full build), so
# it is a command of its own. Extra arguments go to `meson test` (e.g. --suite unit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
if [ ! -f build-sanitize/build.ninja ]; then
  meson setup build-sanitize --buildtype=debug -Db_sanitize=address,undefined \
    -Db_lundef=false -Dtests=true >/dev/null
fi
ninja -C build-sanitize
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if [ $# -eq 0 ]; then set -- --suite unit --suite protocol; fi
meson test -C build-sanitize --print-errorlogs "$@" || exit 1
