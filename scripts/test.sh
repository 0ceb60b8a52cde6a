#!/usr/bin/env bash
# The tests: set up, check formatting, build, run every CTest test; then rebuild with
# AddressSanitizer + UndefinedBehaviorSanitizer in a second tree and run the tests again;
# then replay the fuzz regressions and fuzz the packed-layout planner for 60 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
"$root/scripts/setup.sh"

echo "== clang-format"
"$root/scripts/format.sh" --check

echo "== build (RelWithDebInfo, warnings are errors)"
"$root/scripts/build.sh" "$root/build"
echo "== ctest"
ctest --test-dir "$root/build" --output-on-failure -j "$jobs"

echo "== build (ASan + UBSan)"
"$root/scripts/build.sh" "$root/build-asan" -DCPKIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
echo "== ctest under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build-asan" --output-on-failure -j "$jobs"

echo "== fuzz: regressions, then 60 s"
"$root/scripts/fuzz.sh" 60
