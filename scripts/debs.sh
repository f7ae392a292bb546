#!/usr/bin/env bash
# Builds rlbus's Debian packages and checks them with lintian:
#
#   bash scripts/debs.sh [OUT]     OUT: where the .deb files go (default: dist/)
#
# rlbus-broker (the broker, rlbus-ctl, rlbus-demo, the systemd unit, /etc/rlbus), librlbus0
# (the SDK's shared library), librlbus-dev (headers, static library, rlbus.pc) and
# python3-rlbus. It installs the build dependencies it lacks with apt (root or sudo), builds
# from a copy of the checkout's tracked files (dpkg-buildpackage -b -us -uc: ~8 minutes on
# 2 cores) and fails if lintian reports an error.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
out=$(realpath -m "${1:-dist}")

need=(build-essential debhelper dh-python lintian fakeroot python3-all python3-setuptools
      meson ninja-build pkg-config libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libspdlog-dev
      libfmt-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev zlib1g-dev
      libcpp-httplib-dev libssl-dev libjs-chart.js)
# shellcheck source=scripts/apt.sh
. scripts/apt.sh
apt_install_missing "rlbus debs" "${need[@]}"

work=$(mktemp -d /tmp/rlbus-debs-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/rlbus"
# the files git tracks (a checkout), else everything but build trees
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$src" ls-files -z | (cd "$src" && xargs -0 cp --parents -t "$work/rlbus")
else
  tar -C "$src" --exclude='./build*' --exclude='./dist' -cf - . | tar -C "$work/rlbus" -xf -
fi
echo "rlbus debs: building in $work/rlbus (dpkg-buildpackage -b -us -uc; its log: $out/build.log)"
mkdir -p "$out"
if ! (cd "$work/rlbus" && dpkg-buildpackage -b -us -uc) > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log" >&2
  echo "rlbus debs: dpkg-buildpackage failed (whole log: $out/build.log)" >&2
  exit 1
fi
cp "$work"/*.deb "$work"/*.changes "$out"/
echo "rlbus debs: lintian"
lintian --tag-display-limit 0 "$work"/*.changes | tee "$out/lintian.txt" || true
if grep -q '^E:' "$out/lintian.txt"; then
  echo "rlbus debs: lintian reports errors (above)" >&2
  exit 1
fi
ls -1 "$out"/*.deb
