#!/usr/bin/env bash
# The one-call GPU check (docs/performance.md). On a machine with an NVIDIA GPU and a CUDA
# torch in python3: configure against torch.utils.cmake_prefix_path, build cpkit with its
# CUDA kernels for sm_90, run the gpu-labelled tests and the GPU benchmarks, and write a
# summary plus JSON to $OUT (or ./gpu-out). Needs .deps/gpu from scripts/prepare-gpu-deps.sh
# (run here first; carry it). The summary always says what ran, what failed and why; every
# step has a time limit so the whole check ends in under 8 minutes on 16 cores.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
python=${CPKIT_GPU_PYTHON:-$(command -v python3)}
deps="$root/.deps/gpu"
build="$root/build-gpu"
jobs=$(nproc)
start=$(date +%s)
failed=()

say "gpu-check: $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary" || say "gpu: none (nvidia-smi absent)"
say "torch: $("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1)"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
has_gpu=0
"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && has_gpu=1
[[ -d $deps ]] || say "warning: $deps missing (run scripts/prepare-gpu-deps.sh here and carry .deps/gpu)"

if ! timeout 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCPKIT_TORCH_PYTHON="$python" -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DCMAKE_PREFIX_PATH="$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share" \
    -DEigen3_DIR="$deps/usr/share/eigen3/cmake" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include" \
    -DCPKIT_WERROR=OFF > "$out/configure.log" 2>&1; then
  say "configure: FAILED (see configure.log)"; tail -20 "$out/configure.log" | tee -a "$summary"; exit 1
fi
kernels=$(grep -o 'cpkit: CUDA kernels.*' "$out/configure.log" | head -1)
say "configure: ok (${kernels:-no CUDA kernels line})"
if [[ $kernels != *"kernels and NCCL backend ON"* ]]; then
  say "stopping: the CUDA kernels are OFF, so nothing GPU-side can be built or run ($kernels)"
  exit 1
fi
if ! timeout 300 cmake --build "$build" --parallel "$jobs" --target cpkit_gpu_tests cpkit_gpu_cp_tests cpkit-gpu-bench \
    > "$out/build.log" 2>&1; then
  say "build: FAILED or timed out (see build.log)"; grep -m5 -B2 -A5 "error" "$out/build.log" | tee -a "$summary"; exit 1
fi
say "build: ok in $(( $(date +%s) - start )) s"

timeout 150 "$build/tests/gpu/cpkit_gpu_tests" --gtest_output=json:"$out/gpu-tests.json" > "$out/gpu-tests.log" 2>&1
rc=$?
case $rc in
  0) say "gpu tests: passed ($(grep -c '\[       OK' "$out/gpu-tests.log") tests)" ;;
  77) say "gpu tests: SKIPPED, no CUDA device here ($(head -1 "$out/gpu-tests.log"))" ;;
  124) say "gpu tests: TIMED OUT after 150 s; last lines:"; tail -5 "$out/gpu-tests.log" | tee -a "$summary"; failed+=(tests) ;;
  *) say "gpu tests: FAILED (rc $rc)"; grep -B1 -A5 "Failure\|FAILED" "$out/gpu-tests.log" | head -40 | tee -a "$summary"; failed+=(tests) ;;
esac

# CP = 2 and 4 on the one GPU (rank processes share it over a host-staged Gloo mesh).
timeout 120 "$build/tests/gpu/cpkit_gpu_cp_tests" --gtest_output=json:"$out/gpu-cp-tests.json" > "$out/gpu-cp-tests.log" 2>&1
crc=$?
case $crc in
  0) say "gpu CP 2/4 tests: passed ($(grep -c '\[       OK' "$out/gpu-cp-tests.log") tests)" ;;
  77) say "gpu CP 2/4 tests: SKIPPED, no CUDA device" ;;
  124) say "gpu CP 2/4 tests: TIMED OUT after 120 s"; tail -5 "$out/gpu-cp-tests.log" | tee -a "$summary"; failed+=(cp-tests) ;;
  *) say "gpu CP 2/4 tests: FAILED (rc $crc)"; grep -B1 -A5 "Failure\|FAILED\|rank " "$out/gpu-cp-tests.log" | head -30 | tee -a "$summary"; failed+=(cp-tests) ;;
esac

# The benchmark runs whenever there is a GPU, whatever the tests said: its numbers are
# reported next to the test outcome, never withheld.
if [[ $has_gpu -eq 1 ]]; then
  timeout 200 "$build/bench/cpkit-gpu-bench" --benchmark_format=console \
    --benchmark_out="$out/gpu-bench.json" --benchmark_out_format=json > "$out/gpu-bench.txt" 2>&1
  brc=$?
  [[ $brc -eq 0 ]] || failed+=(bench)
  say "gpu bench: rc $brc$([[ $brc -eq 124 ]] && echo ' (timed out after 200 s)')"
  grep -E "^BM_" "$out/gpu-bench.txt" | tee -a "$summary"
else
  say "gpu bench: not run (torch sees no CUDA device)"
fi
say "gpu-check: done in $(( $(date +%s) - start )) s; failed: ${failed[*]:-nothing}"
[[ ${#failed[@]} -eq 0 ]]
