#!/usr/bin/env bash
# The one-call GPU check (docs/performance.md). On a machine with an NVIDIA GPU and a CUDA
# torch in python3: configure against torch.utils.cmake_prefix_path, build cpkit with its
# CUDA kernels for sm_90, run the gpu-labelled tests and the GPU benchmarks, and write a
# summary plus JSON to $OUT (or ./gpu-out). Needs .deps/gpu from scripts/prepare-gpu-deps.sh
# (run here first; carry it). Without a GPU it still configures and builds, and says so.
# Budget: well under 8 minutes on 16 cores.
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

say "gpu-check: $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary" || say "gpu: none (nvidia-smi absent)"
say "torch: $("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1)"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
[[ -d $deps ]] || say "warning: $deps missing (run scripts/prepare-gpu-deps.sh here and carry .deps/gpu)"

set -o pipefail
if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCPKIT_TORCH_PYTHON="$python" -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_PREFIX_PATH="$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share" \
    -DEigen3_DIR="$deps/usr/share/eigen3/cmake" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include" \
    -DCPKIT_WERROR=OFF > "$out/configure.log" 2>&1; then
  say "configure: FAILED (see configure.log)"; tail -20 "$out/configure.log"; exit 1
fi
say "configure: ok ($(grep -o 'CUDA kernels[^(]*' "$out/configure.log" | head -1))"
if ! cmake --build "$build" --parallel "$jobs" --target cpkit_gpu_tests cpkit-gpu-bench \
    > "$out/build.log" 2>&1; then
  say "build: FAILED (see build.log)"; grep -m5 -B2 -A5 "error" "$out/build.log"; exit 1
fi
say "build: ok in $(( $(date +%s) - start )) s"

"$build/tests/gpu/cpkit_gpu_tests" --gtest_output=json:"$out/gpu-tests.json" > "$out/gpu-tests.log" 2>&1
rc=$?
case $rc in
  0) say "gpu tests: passed ($(grep -c '\[       OK' "$out/gpu-tests.log") tests)" ;;
  77) say "gpu tests: SKIPPED, no CUDA device here ($(head -1 "$out/gpu-tests.log"))" ;;
  *) say "gpu tests: FAILED (rc $rc)"; grep -A5 "Failure" "$out/gpu-tests.log" | head -40 | tee -a "$summary" ;;
esac

if [[ $rc -eq 0 ]]; then
  timeout 300 "$build/bench/cpkit-gpu-bench" --benchmark_format=json \
    --benchmark_out="$out/gpu-bench.json" --benchmark_out_format=json > "$out/gpu-bench.txt" 2>&1
  say "gpu bench (rc $?):"
  grep -E "^BM_" "$out/gpu-bench.txt" | tee -a "$summary"
else
  say "gpu bench: not run (no GPU)"
fi
say "gpu-check: done in $(( $(date +%s) - start )) s"
[[ $rc -eq 0 || $rc -eq 77 ]]
