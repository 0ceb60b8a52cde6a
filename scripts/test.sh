#!/usr/bin/env bash
# The tests: set up, check formatting, build, run every CTest test; build the Python package
# with pip and run its pytest suite; then rebuild with
# AddressSanitizer + UndefinedBehaviorSanitizer in a second tree and run the tests again;
# then replay the fuzz regressions and fuzz the packed-layout planner for 60 s.
# Both C++ trees keep line tables only (-g1): about half the compile time of full -g.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
# Each stage's wall time, printed at the end (CI's budget is 30 minutes on 2 cores).
stages=()
stage_began=$SECONDS
stage() {
  local now=$SECONDS
  stages+=("$(printf '%5d s  %s' $((now - stage_began)) "$1")")
  stage_began=$now
}
"$root/scripts/setup.sh"
stage setup

echo "== clang-format"
"$root/scripts/format.sh" --check
stage clang-format

echo "== build (RelWithDebInfo, warnings are errors)"
"$root/scripts/build.sh" "$root/build" -DCPKIT_LINE_TABLES_ONLY=ON
stage build
echo "== ctest"
ctest --test-dir "$root/build" --output-on-failure -j "$jobs"
stage ctest

echo "== python: pip install . into the torch venv (same CMake project), then pytest"
venv=${CPKIT_TORCH_VENV:-$HOME/.cache/cpkit/torch-2.11.0}
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$root"
stage "python package"
(cd "$root/python/tests" && "$venv/bin/python" -m pytest -q -p no:cacheprovider)
stage pytest

echo "== build (ASan + UBSan)"
# The CPU-only configuration (CPKIT_CUDA=OFF): the CUDA kernels compiled in the build above,
# and this one keeps the no-CUDA glue building and tested.
"$root/scripts/build.sh" "$root/build-asan" -DCPKIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCPKIT_BUILD_BENCH=OFF -DCPKIT_LINE_TABLES_ONLY=ON -DCPKIT_CUDA=OFF
stage "build (ASan + UBSan)"
echo "== ctest under ASan + UBSan"
# What the sanitizers must cover: every test of the libraries' code paths, not the
# script-only ones (label "script": no compiled code runs) nor the launcher mappings (label
# "launch": torchrun and Slurm environments read into ranks, run in the tree above; each
# starts 4-6 sanitized processes, ~1 s of leak check apiece).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build-asan" --output-on-failure -j "$jobs" -LE "script|launch"
stage "ctest (ASan + UBSan)"

echo "== fuzz: regressions, then 60 s"
"$root/scripts/fuzz.sh" 60
stage fuzz

echo "== stage times (total $SECONDS s)"
printf '%s\n' "${stages[@]}"
