#!/usr/bin/env bash
# Installs what rlbus needs from Debian's packages (only what is missing; needs root or
# sudo for that) and builds into build/. Safe to run again: it only redoes what changed.
#
#   bash scripts/setup.sh run    what the demo needs: the build tools and libraries, then
#                                the broker, rlbus-ctl and the demo only
#   bash scripts/setup.sh        everything: also Catch2, the Python packages the tests use
#                                and valgrind, then every target, the test suites included
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case "$mode" in run | all) ;; *) echo "usage: scripts/setup.sh [run|all]" >&2; exit 2 ;; esac

# To build and run the broker, its tools and the demo:
packages=(
  g++ meson ninja-build pkg-config
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libspdlog-dev libfmt-dev libsodium-dev
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev zlib1g-dev
  libcpp-httplib-dev              # the broker's HTTP endpoint (/metrics, /healthz, /readyz)
  libssl-dev                      # base64 for etcd's API (standby brokers)
  libjs-chart.js                  # the web view's charts, compiled into the broker
)
# And for the test suites:
if [ "$mode" = all ]; then
  packages+=(
    catch2                          # the C++ tests
    python3 python3-msgpack python3-zmq python3-pytest  # the Python package and its tests
    python3-yaml                    # the deployment manifests' test (deploy/tests)
    python3-torch python3-numpy     # the cart-pole example's test (examples/)
    python3-pip python3-wheel       # the test that installs the package with pip
    python3-flask python3-requests  # rlbus-bench's HTTP baseline (bench/http_baseline.py)
    valgrind                        # rlbus-bench cost (callgrind), in the bench suite
    etcd-server                     # the cluster tests: a real etcd elects the leading broker
    clang-format pyflakes3 mypy     # the lint suite (tests/lint/lint.py)
    clang-tidy                      # its tidy suite (meson test --setup tidy --suite tidy)
    chromium chromium-driver python3-selenium  # the web view's tests, in a real browser
  )
fi
# Optional, for PNG plots of the bench (bench/plot.py): apt-get install gnuplot-nox
# shellcheck source=scripts/apt.sh
. scripts/apt.sh
apt_install_missing "rlbus setup" "${packages[@]}"

tests=$([ "$mode" = all ] && echo true || echo false)
if [ ! -f build/build.ninja ]; then
  echo "rlbus setup: configuring build/"
  meson setup build --buildtype=debugoptimized -Dtests="$tests" >/dev/null
elif [ "$mode" = all ]; then
  built_with=$(meson introspect build --buildoptions |
    /usr/bin/python3 -c 'import json, sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "tests"][0])')
  # a build made by `setup.sh run` has no tests yet
  [ "$built_with" = True ] || meson configure build -Dtests=true >/dev/null
fi
if [ "$mode" = run ]; then
  targets=(src/rlbus-broker src/rlbus-ctl examples/demo/rlbus-demo)
  echo "rlbus setup: building the broker, rlbus-ctl and the demo (the first time: a few minutes)"
else
  targets=()
  echo "rlbus setup: building everything, the tests included (the first time: ~10 minutes on 2 cores)"
fi
# ninja's progress, a [done/total] line per step; its whole output is kept in build/setup.log
if ! ninja -C build "${targets[@]}" 2>&1 | tee build/setup.log |
    { grep --line-buffered -E '^\[[0-9]+/[0-9]+\]' || true; }; then
  tail -n 40 build/setup.log >&2
  echo "rlbus setup: the build failed (all of its output: build/setup.log)" >&2
  exit 1
fi
echo "rlbus setup: built build/src/rlbus-broker"
