#!/usr/bin/env bash
# clang-tidy over src/ and examples/ (.clang-tidy's checks), read through a unity build of its
# own in build-tidy/: ten sources to a translation unit, so the headers every source includes
# are read once for ten of them (about 2 minutes on 2 cores; one file at a time, as the `tidy`
# suite of build/ does it, takes about 10). It runs as build-tidy/'s meson test `tidy`, so its
# result is in build-tidy/meson-logs/testlog.json with the other parts'. Exits 0 when it finds
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
dir=build-tidy
if [ ! -f "$dir/build.ninja" ]; then
  echo "rlbus tidy: configuring $dir/ (a unity build, read and never compiled)"
  meson setup "$dir" --buildtype=debug -Dunity=on -Dunity_size=10 -Dtests=true >/dev/null
fi
# What the sources include that the build writes: the message model, the defaults and the web
# view's files.
ninja -C "$dir" src/codec/model.hpp include/rlbus/defaults.hpp src/web_assets.cpp >/dev/null
exec meson test -C "$dir" --no-rebuild --print-errorlogs --setup tidy --suite tidy
