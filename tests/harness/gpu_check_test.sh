#!/usr/bin/env bash
# harness/gpu-check.sh's rules, checked on the CPU with stub tools (nvidia-smi, python3,
# cmake, and the test and bench binaries the stub build writes): at most 8 files come back,
# a skip (exit 77) or a pass with no test while torch sees a GPU is a failure, one deadline
# bounds every step and a step past it is reported NOT RUN, the bench runs before the CP tests.
set -euo pipefail
script=$(cd "$(dirname "$0")/../.." && pwd)/harness/gpu-check.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root/harness" "$tmp/bin"
cp "$script" "$tmp/root/harness/"
cat > "$tmp/bin/python3" <<'STUB'
#!/bin/bash
case "$*" in *sys.exit*) exit 0 ;; *) echo "2.11.0 13.0 True" ;; esac
STUB
printf '#!/bin/bash\necho "NVIDIA H200, 143771 MiB, 580, Default"\n' > "$tmp/bin/nvidia-smi"
# The stub build writes each binary from FAKE_TESTS, FAKE_BENCH and FAKE_CP.
cat > "$tmp/bin/cmake" <<'STUB'
#!/bin/bash
if [[ $1 == --build ]]; then
  mkdir -p "$2/tests/gpu" "$2/bench"
  write() { printf '#!/bin/bash\n%s\n' "$2" > "$1"; chmod +x "$1"; }
  ok='echo "[       OK ] A.b (1 ms)"; exit 0'
  write "$2/tests/gpu/cpkit_gpu_tests" "${FAKE_TESTS:-$ok}"
  write "$2/tests/gpu/cpkit_gpu_cp_tests" "${FAKE_CP:-$ok}"
  write "$2/bench/cpkit-gpu-bench" "${FAKE_BENCH:-echo BM_x 1 ms}"
  exit 0
fi
echo "-- cpkit: CUDA kernels and NCCL backend ON (stub)"
STUB
chmod +x "$tmp/bin/"*

failures=0
checks=0
check() {  # name, condition (a command)
  checks=$((checks + 1))
  if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; failures=$((failures + 1)); fi
}
run() {  # out dir, then VAR=value settings; sets rc
  local out=$1
  shift
  rc=0
  env PATH="$tmp/bin:$PATH" OUT="$out" "$@" bash "$tmp/root/harness/gpu-check.sh" > "$out.log" 2>&1 || rc=$?
}

run "$tmp/pass"
check "a clean run exits 0" '((rc == 0))'
check "at most 8 files come back" '(($(find "$tmp/pass" -type f | wc -l) <= 8))'
check "no folder in OUT" '(($(find "$tmp/pass" -mindepth 1 -type d | wc -l) == 0))'
check "the summary names every step" 'grep -q "gpu tests: passed (1 tests)" "$tmp/pass/summary.txt" &&
  grep -q "gpu bench: ok" "$tmp/pass/summary.txt" && grep -q "gpu CP 2/4 tests: passed" "$tmp/pass/summary.txt"'
check "the bench runs before the CP tests" '(($(grep -n "gpu bench" "$tmp/pass/summary.txt" | cut -d: -f1) <
  $(grep -n "gpu CP" "$tmp/pass/summary.txt" | cut -d: -f1)))'
check "the logs travel in one archive" 'tar tzf "$tmp/pass/logs.tar.gz" | grep build.log > /dev/null'

run "$tmp/skip" FAKE_TESTS='echo "SKIPPED: no CUDA device"; exit 77'
check "a skip on a GPU machine fails the run" '((rc != 0)) && grep -q "gpu tests: FAILED, skipped" "$tmp/skip/summary.txt"'

run "$tmp/empty" FAKE_CP='exit 0'
check "a pass with no test fails the run" '((rc != 0)) && grep -q "no test passed" "$tmp/empty/summary.txt"'

run "$tmp/broken" FAKE_TESTS='echo "[  FAILED  ] A.b"; echo "x.cpp:1: Failure"; exit 1'
check "a failing test is named" '((rc != 0)) && grep -q "^\[  FAILED  \] A.b" "$tmp/broken/summary.txt"'

start=$(date +%s)
run "$tmp/late" CPKIT_GPU_DEADLINE_S=50 FAKE_BENCH='echo BM_y 2 ms; sleep 300'
took=$(($(date +%s) - start))
check "a step is cut at the deadline (took $took s of 50)" '((took < 50))'
check "the cut bench is reported with what it printed" 'grep -q "gpu bench: TIMED OUT" "$tmp/late/summary.txt" &&
  grep -q "BM_y" "$tmp/late/summary.txt"'
check "a step past the deadline is NOT RUN and fails the run" '((rc != 0)) &&
  grep -q "gpu CP 2/4 tests: NOT RUN" "$tmp/late/summary.txt"'

echo "gpu-check rules: $((checks - failures)) passed, $failures failed"
((failures == 0))
