#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds tests/consumer against it, runs it.
# Usage: build_and_run.sh BUILD_DIR TORCH_CMAKE_PREFIX
set -euo pipefail
build=$1
torch_prefix=$2
here=$(cd "$(dirname "$0")" && pwd)
prefix="$build/consumer-install"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$here" -B "$build/consumer-build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
cmake --build "$build/consumer-build"
"$build/consumer-build/consumer"
