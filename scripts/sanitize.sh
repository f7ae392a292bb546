#!/usr/bin/env bash
# Builds the broker, its tools and the C++ test binary again with sanitizers and runs the C++
# suites there. Any report fails the run, whichever process made it: the test binary, or a
# broker, rlbus-ctl or demo it started.
#
#   bash scripts/sanitize.sh            AddressSanitizer + UndefinedBehaviorSanitizer, in
#                                       build-sanitize/: unit, protocol, integration
#   bash scripts/sanitize.sh --thread   ThreadSanitizer, in build-tsan/: unit, protocol,
#                                       integration
#
# Further arguments go to `meson test` in place of the three suites (e.g. --suite unit, or a
# test's name). `scripts/test.sh` runs both after the default suite. The builds are unity
# builds at -O1: four times faster to compile than one file at a time, fast enough to run.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=address
if [ "${1:-}" = --thread ]; then kind=thread; shift; fi
bash scripts/setup.sh all

if [ "$kind" = address ]; then
  dir=build-sanitize sanitize=address,undefined
else
  dir=build-tsan sanitize=thread
fi
# (-Wno-subobject-linkage: in a unity build g++ takes each file for a header, and warns when a
# class of it holds a type of the file's own anonymous namespace. -Wno-maybe-uninitialized:
# with the sanitizers' instrumentation g++ 12 warns so inside std::regex and std::function.)
if [ ! -f "$dir/build.ninja" ]; then
  echo "rlbus sanitize: configuring $dir/ (-fsanitize=$sanitize)"
  meson setup "$dir" --buildtype=debug -Doptimization=1 -Db_sanitize="$sanitize" \
    -Db_lundef=false -Dunity=on -Dunity_size=10 -Dtests=true \
    -Dcpp_args='-g1 -Wno-subobject-linkage -Wno-maybe-uninitialized' >/dev/null
fi
# What the C++ suites run: the test binary and the programs it starts.
# (Not the bench: its quick run, the suite's bench-smoke, times the broker rather than checks it,
# and is left out here.)
targets=(tests/rlbus-tests tests/rlbus-fuzz-replay tests/fuzz-seeds
         src/rlbus-broker src/rlbus-ctl examples/demo/rlbus-demo)
echo "rlbus sanitize: building ${targets[*]} in $dir/ (the first time: ~10 minutes on 2 cores)"
if ! ninja -C "$dir" "${targets[@]}" >"$dir/build.log" 2>&1; then
  tail -n 40 "$dir/build.log" >&2
  echo "rlbus sanitize: the build failed (all of its output: $dir/build.log)" >&2
  exit 1
fi

# Every sanitized process writes its reports into one folder, so a report from a broker a test
# started (whose stderr the test may not show) still fails the run.
reports="$PWD/$dir/meson-logs/sanitizer-reports"
rm -rf "$reports" && mkdir -p "$reports"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$reports/tsan:suppressions=$PWD/tests/tsan.supp"
if [ $# -eq 0 ]; then
  # The C++ suites, the SDKs' threads against the real broker included (ThreadSanitizer slows
  # them 5-15 times; a test that a slow machine breaks is a defect of the test, and is fixed).
  suites=(--suite unit --suite protocol --suite integration)
  mapfile -t tests < <(meson test -C "$dir" --no-rebuild --list "${suites[@]}" 2>/dev/null |
    sed -n 's|^.* / ||p' | grep -vx bench-smoke)
  if [ ${#tests[@]} -eq 0 ]; then
    echo "rlbus sanitize: $dir/ lists no test of ${suites[*]}" >&2
    exit 1
  fi
  set -- "${tests[@]}"
fi
status=0
# meson's per-test timeouts only catch a hang; a sanitized build runs 2-15 times slower, and on
# a busy machine slower again, so they are tripled here.
meson test -C "$dir" --no-rebuild --print-errorlogs --timeout-multiplier 3 "$@" || status=1
if compgen -G "$reports/*" >/dev/null; then
  for f in "$reports"/*; do
    echo "==== $f" >&2
    head -n 80 "$f" >&2
  done
  echo "rlbus sanitize: the sanitizer reported (above; the reports: $reports)" >&2
  status=1
fi
exit $status
