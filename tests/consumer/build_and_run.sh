#!/usr/bin/env bash
# Installs the build tree into a scratch prefix; checks the installed library's RUNPATH holds
# no build-machine path; builds tests/consumer and examples/trainer_step against the install
# with only the documented CMAKE_PREFIX_PATH; runs the consumer, then the example under
# torchrun with 4 ranks.
# Usage: build_and_run.sh BUILD_DIR TORCH_CMAKE_PREFIX TORCHRUN
set -euo pipefail
build=$1
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

for project in "$here" "$root/examples/trainer_step"; do
  name=$(basename "$project")
  cmake -S "$project" -B "$build/consumer-$name" -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
  cmake --build "$build/consumer-$name"
done
"$build/consumer-consumer/consumer"
OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node=4 --no-python \
  "$build/consumer-trainer_step/trainer_step"
