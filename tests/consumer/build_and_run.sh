#!/usr/bin/env bash
# Installs the build tree into a scratch prefix; checks the installed library's RUNPATH holds
# no build-machine path; builds tests/consumer and examples/trainer_step against the install
# with only the documented CMAKE_PREFIX_PATH; runs the consumer, then the example under
# torchrun with 4 ranks.
# Usage: build_and_run.sh BUILD_DIR TORCH_CMAKE_PREFIX TORCHRUN
set -euo pipefail
build=$(cd "$1" && pwd)
torch_prefix=$2
torchrun=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prefix="$build/consumer-install"
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

library="$prefix/lib/libcpkit_optimized.so"
runpath=$(readelf -d "$library" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
echo "installed RUNPATH: ${runpath:-<none>}"
if [[ "$runpath" != '$ORIGIN' ]]; then
  echo "FAIL: $library carries RUNPATH '$runpath' (expected only \$ORIGIN)" >&2
  exit 1
fi

# The consumer takes both libraries; the example only cpkit::optimized, configured here as if
# Eigen were not installed (CMAKE_DISABLE_FIND_PACKAGE_Eigen3): the optimized library alone
# must not need it.
cmake -S "$here" -B "$build/consumer-consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
cmake -S "$root/examples/trainer_step" -B "$build/consumer-trainer_step" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=TRUE >/dev/null
for name in consumer trainer_step; do cmake --build "$build/consumer-$name"; done
"$build/consumer-consumer/consumer"
OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node=4 --no-python \
  "$build/consumer-trainer_step/trainer_step"

# The torch pin: a cpkit built against another torch refuses this one, naming both versions
# (the installed config with its pinned version changed, in a scratch prefix).
pinned="$build/consumer-pinned/lib/cmake/cpkit"
rm -rf "$build/consumer-pinned" && mkdir -p "$pinned"
sed 's/set(cpkit_TORCH_VERSION "[^"]*")/set(cpkit_TORCH_VERSION "2.10.0")/' \
  "$prefix/lib/cmake/cpkit/cpkitConfig.cmake" > "$pinned/cpkitConfig.cmake"
cp "$prefix/lib/cmake/cpkit/cpkitConfigVersion.cmake" "$pinned/"
if output=$(cmake -S "$here" -B "$build/consumer-pinned/build" -G Ninja \
    -DCMAKE_PREFIX_PATH="$build/consumer-pinned;$torch_prefix" 2>&1); then
  echo "FAIL: a cpkit pinned to torch 2.10.0 accepted another torch" >&2
  exit 1
fi
grep -q "cpkit was built against torch 2.10.0 but found torch" <<<"$output" || {
  echo "FAIL: the version mismatch was not named:" >&2
  echo "$output" | tail -20 >&2
  exit 1
}
echo "torch pin: a cpkit built against torch 2.10.0 refuses this torch, naming both versions"
