#!/usr/bin/env bash
# The one-call GPU check (docs/performance.md). On a machine with an NVIDIA GPU and a CUDA
# torch in python3: configure against torch.utils.cmake_prefix_path, build cpkit with its
# CUDA kernels for sm_90, run the GPU tests, the GPU benchmarks, then the CP 2/4 tests, and
# write a summary to $OUT (or ./gpu-out). Needs .deps/gpu from scripts/prepare-gpu-deps.sh
# (run here first; carry it).
#
# What the device tool allows shapes it: at most 8 files come back (this writes 5:
# summary.txt, the two test logs, the bench's text, and logs.tar.gz with everything else),
# and a command may run 600 s, so every step takes its limit from one deadline
# (CPKIT_GPU_DEADLINE_S, default 540 s from the start) and a step with too little time left
# is reported as not run. The summary says what ran, what failed and why; a test binary that
# skips (exit 77) while torch sees a GPU is a failure, not a pass.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
work=$(mktemp -d)  # logs that travel only inside logs.tar.gz
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
python=${CPKIT_GPU_PYTHON:-$(command -v python3)}
deps="$root/.deps/gpu"
build="$root/build-gpu"
jobs=$(nproc)
start=$(date +%s)
deadline=$((start + ${CPKIT_GPU_DEADLINE_S:-540}))
failed=()

finish() {
  tar -czf "$out/logs.tar.gz" -C "$work" . 2>/dev/null
  rm -rf "$work"
  say "gpu-check: done in $(($(date +%s) - start)) s; failed: ${failed[*]:-nothing}"
  [[ ${#failed[@]} -eq 0 ]]
  exit
}

# Runs a step for at most its cap or what is left before the deadline, less a 15 s margin
# for the summary and the archive; returns 125 without running it when under 20 s is left.
# Sets `secs` to the limit it ran under. Args: cap, command...
timed() {
  local left=$((deadline - $(date +%s) - 15))
  secs=$((left < $1 ? left : $1))
  shift
  ((secs >= 20)) || return 125
  timeout "$secs" "$@"
}

# Runs a test binary under the deadline and reports it. Args: name, cap, binary, log name.
run_tests() {
  local name=$1 cap=$2 binary=$3 log="$out/$4.log" rc
  timed "$cap" "$binary" --gtest_output=json:"$work/$4.json" > "$log" 2>&1
  rc=$?
  case $rc in
    125) say "$name: NOT RUN, the deadline was reached"; failed+=("$name") ;;
    0)
      local passed
      passed=$(grep -c '^\[       OK' "$log")
      if ((passed > 0)); then
        say "$name: passed ($passed tests)"
      else
        say "$name: FAILED, exit 0 but no test passed"; failed+=("$name")
      fi
      ;;
    77)
      if ((has_gpu)); then
        say "$name: FAILED, skipped as if no GPU while torch sees one: $(head -1 "$log")"
        failed+=("$name")
      else
        say "$name: SKIPPED, no CUDA device ($(head -1 "$log"))"
      fi
      ;;
    124) say "$name: TIMED OUT after $secs s; last lines:"; tail -5 "$log" | tee -a "$summary"; failed+=("$name") ;;
    *)
      say "$name: FAILED (rc $rc); failing tests:"
      grep -E '^\[  FAILED  \]' "$log" | sort -u | tee -a "$summary"
      grep -B2 -A6 "Failure" "$log" | head -60 | tee -a "$summary"
      failed+=("$name")
      ;;
  esac
}

say "gpu-check: $(date -u +%FT%TZ) on $(hostname), deadline $((deadline - start)) s"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader 2>/dev/null \
  | sed 's/^/gpu (name, memory, driver, compute mode): /' | tee -a "$summary" \
  || say "gpu: none (nvidia-smi absent)"
say "torch: $("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1)"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
has_gpu=0
"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && has_gpu=1
[[ -d $deps ]] || say "warning: $deps missing (run scripts/prepare-gpu-deps.sh here and carry .deps/gpu)"

if ! timed 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCPKIT_TORCH_PYTHON="$python" -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DCMAKE_PREFIX_PATH="$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share" \
    -DEigen3_DIR="$deps/usr/share/eigen3/cmake" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include" \
    -DCPKIT_WERROR=OFF > "$work/configure.log" 2>&1; then
  say "configure: FAILED (configure.log in logs.tar.gz); its last lines:"
  tail -20 "$work/configure.log" | tee -a "$summary"; failed+=(configure); finish
fi
kernels=$(grep -o 'cpkit: CUDA kernels.*' "$work/configure.log" | head -1)
say "configure: ok (${kernels:-no CUDA kernels line})"
if [[ $kernels != *"kernels and NCCL backend ON"* ]]; then
  say "stopping: the CUDA kernels are OFF, so nothing GPU-side can be built or run"
  failed+=(configure); finish
fi
if ! timed 330 cmake --build "$build" --parallel "$jobs" \
    --target cpkit_gpu_tests cpkit_gpu_cp_tests cpkit-gpu-bench > "$work/build.log" 2>&1; then
  say "build: FAILED or timed out (build.log in logs.tar.gz); the diagnostics:"
  grep -E -m12 -A4 "error:|fatal error|undefined reference|ld returned|ninja: build stopped" \
    "$work/build.log" | tee -a "$summary"
  failed+=(build); finish
fi
say "build: ok, $(($(date +%s) - start)) s from the start"

run_tests "gpu tests" 150 "$build/tests/gpu/cpkit_gpu_tests" gpu-tests

# The benchmark runs whenever there is a GPU, whatever the tests said (its numbers are
# reported next to the test outcome, never withheld), and before the CP tests so a slow
# CP run cannot cost it.
if ((has_gpu)); then
  timed 200 "$build/bench/cpkit-gpu-bench" --benchmark_format=console \
    --benchmark_out="$work/gpu-bench.json" --benchmark_out_format=json > "$out/gpu-bench.txt" 2>&1
  brc=$?
  ((brc == 0)) || failed+=(bench)
  case $brc in
    0) say "gpu bench: ok" ;;
    124) say "gpu bench: TIMED OUT after $secs s (what it printed is below)" ;;
    125) say "gpu bench: NOT RUN, the deadline was reached" ;;
    *) say "gpu bench: FAILED (rc $brc); its last lines:"; tail -5 "$out/gpu-bench.txt" | tee -a "$summary" ;;
  esac
  grep -E "^BM_" "$out/gpu-bench.txt" | tee -a "$summary"
else
  say "gpu bench: not run (torch sees no CUDA device)"
fi

# CP = 2 and 4 on the one GPU (rank processes share it over a host-staged Gloo mesh; a GPU
# in EXCLUSIVE_PROCESS compute mode refuses the second process).
run_tests "gpu CP 2/4 tests" 120 "$build/tests/gpu/cpkit_gpu_cp_tests" gpu-cp-tests
finish
