#!/usr/bin/env bash
# Installs what rlbus needs from Debian's packages (only what is missing; needs root or
# sudo for that) and builds everything into build/. Safe to run again: it only redoes
# what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ meson ninja-build pkg-config
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libspdlog-dev libfmt-dev libsodium-dev
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev catch2 zlib1g-dev
  libcpp-httplib-dev              # the broker's HTTP endpoint (/metrics, /healthz, /readyz)
  python3 python3-msgpack python3-zmq python3-pytest  # the Python package and its tests
  python3-yaml                    # the deployment manifests' test (deploy/tests)
  python3-pip python3-wheel      # the test that installs the package with pip
  python3-flask python3-requests  # rlbus-bench's HTTP baseline (bench/http_baseline.py)
  valgrind                        # rlbus-bench cost (callgrind), smoke-tested by the suite
)
# Optional, for PNG plots of the bench (bench/plot.py): apt-get install gnuplot-nox
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "rlbus setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized >/dev/null
fi
echo "rlbus setup: building"
ninja -C build >/dev/null
echo "rlbus setup: built build/src/rlbus-broker"
