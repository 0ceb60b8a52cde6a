#!/usr/bin/env bash
# Builds the libFuzzer target with clang (ASan + UBSan), replays tests/fuzz/regressions (every
# crash ever found, kept as a regression test), then fuzzes for $1 seconds (default 60) from
# the seed corpus. A crash fails the script and leaves crash-* files to move into regressions/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
out="$root/build-fuzz"
mkdir -p "$out"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/reference/include" -I"$root/optimized/src" -isystem /usr/include/eigen3 \
  "$root/tests/fuzz/packed_layout_fuzzer.cpp" "$root"/reference/src/*.cpp \
  -o "$out/packed_layout_fuzzer"
shopt -s nullglob
regressions=("$root"/tests/fuzz/regressions/*)
if ((${#regressions[@]})); then
  "$out/packed_layout_fuzzer" "${regressions[@]}"
fi
work="$out/corpus"
mkdir -p "$work"
cp -n "$root"/tests/fuzz/corpus/* "$work"/
cd "$out"
"$out/packed_layout_fuzzer" -max_total_time="$seconds" -print_final_stats=1 "$work" 2>&1 | tail -15
