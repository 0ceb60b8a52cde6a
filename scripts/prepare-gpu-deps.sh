#!/usr/bin/env bash
# Run HERE (not on the GPU machine): copies what the GPU machine lacks and the build needs
# (Eigen, RapidCheck, GoogleTest, Google Benchmark, nlohmann-json, Gloo headers: Debian's
# headers, static libraries and CMake configs) into the git-ignored .deps/gpu, keeping the
# /usr layout so the CMake configs' relative paths still hold. Pass `carry: [".deps/gpu"]`
# to the device tool. Size: a few MB.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" >/dev/null
dest="$root/.deps/gpu"
rm -rf "$dest" && mkdir -p "$dest"
copy() { for p in "$@"; do mkdir -p "$dest$(dirname "$p")" && cp -a "$p" "$dest$p"; done; }
arch=lib/x86_64-linux-gnu
copy /usr/include/eigen3 /usr/share/eigen3
copy /usr/include/rapidcheck /usr/include/rapidcheck.h /usr/$arch/cmake/rapidcheck /usr/$arch/librapidcheck*.a
copy /usr/include/gtest /usr/include/gmock /usr/$arch/cmake/GTest /usr/$arch/libgtest*.a /usr/$arch/libgmock*.a
copy /usr/include/benchmark /usr/$arch/cmake/benchmark /usr/$arch/libbenchmark*
copy /usr/include/nlohmann /usr/share/cmake/nlohmann_json
copy /usr/include/gloo
du -sh "$dest"
