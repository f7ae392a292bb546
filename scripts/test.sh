#!/usr/bin/env bash
# Sets everything up, then runs the tests; exits 0 when all passed, 1 otherwise.
#
#   bash scripts/test.sh            the whole suite: every default suite in build/ (unit,
#                                   protocol, integration, python, deploy, install, lint),
#                                   then the C++ suites again under AddressSanitizer +
#                                   UndefinedBehaviorSanitizer and under ThreadSanitizer
#                                   (scripts/sanitize.sh), and clang-tidy
#                                   over src/ and examples/ (scripts/tidy.sh); about 40
#                                   minutes on 2 cores from a fresh clone
#   bash scripts/test.sh --quick    the inner loop: the unit and protocol suites and the
#                                   Python unit tests (under 2 minutes once built)
#   bash scripts/test.sh ARGS...    `meson test` in build/ with those arguments (a suite, a
#                                   test's name, --setup bench ...)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all

if [ "${1:-}" = --quick ]; then
  shift
  exec meson test -C build --print-errorlogs --suite unit --suite protocol --suite python-unit "$@"
fi
if [ $# -gt 0 ]; then
  meson test -C build --print-errorlogs "$@" || exit 1
  exit 0
fi

# The whole suite. Each part runs whatever the others found; .ci/run counts their logs.
rm -f build/meson-logs/testlog.json build-sanitize/meson-logs/testlog.json \
  build-tsan/meson-logs/testlog.json build-tidy/meson-logs/testlog.json
status=0
part() {  # part NAME COMMAND...: runs one part, says how long it took and how it ended
  local name=$1 started=$SECONDS
  shift
  echo "rlbus test: $name"
  if "$@"; then
    echo "rlbus test: $name passed ($((SECONDS - started)) s)"
  else
    echo "rlbus test: $name FAILED ($((SECONDS - started)) s)"
    status=1
  fi
}
part "the default suites" meson test -C build --print-errorlogs
part "clang-tidy over src/ and examples/" bash scripts/tidy.sh
part "the C++ suites under ASan + UBSan" bash scripts/sanitize.sh
part "the C++ suites under TSan" bash scripts/sanitize.sh --thread
exit $status
