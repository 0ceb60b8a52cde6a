// cpkit-gpu-bench: CUDA kernels against PyTorch's own ops and the HBM limit (cudaMemcpy D2D
// of the same bytes), timed with CUDA events on PyTorch's current stream.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/autograd.h>

#include <exception>
#include <functional>

#include "bench_util.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "kernels/cross_entropy_launch.hpp"

namespace {

const at::Device kCuda(at::kCUDA, 0);

// Runs `body` once per benchmark iteration, timing it with CUDA events.
void time_cuda(benchmark::State& state, const std::function<void()>& body) {
  body();  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    body();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

struct Ce {
  at::Tensor logits, labels, valid;
};

Ce ce_inputs(int64_t T, int64_t V) {
  at::manual_seed(0);
  return {(at::randn({1, T, V}, at::TensorOptions().device(kCuda)) * 4).requires_grad_(true),
          at::randint(0, V, {1, T}, at::TensorOptions().dtype(at::kLong).device(kCuda)),
          at::ones({T}, at::TensorOptions().dtype(at::kBool).device(kCuda))};
}

// Args: T, V, softcap
void BM_GpuCE_Optimized(benchmark::State& state) {
  const Ce in = ce_inputs(state.range(0), state.range(1));
  const double softcap = static_cast<double>(state.range(2));
  time_cuda(state, [&] {
    const at::Tensor loss =
        cpkit::shifted_cp_loss(in.logits, in.labels, in.valid, nullptr, {.softcap = softcap});
    benchmark::DoNotOptimize(torch::autograd::grad({loss}, {in.logits})[0].data_ptr());
  });
  cpkit::bench::set_bytes(state, 8.0 * static_cast<double>(in.logits.numel()));
}

// The cluster kernel (asked for; it raises instead of falling back) next to the default
// two-pass one above.
void BM_GpuCE_Cluster(benchmark::State& state) {
  cpkit::kernels::set_cuda_cross_entropy_kernel(cpkit::kernels::CrossEntropyKernel::kCluster);
  try {
    BM_GpuCE_Optimized(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  cpkit::kernels::set_cuda_cross_entropy_kernel(cpkit::kernels::CrossEntropyKernel::kAuto);
}

void BM_GpuCE_Torch(benchmark::State& state) {
  const Ce in = ce_inputs(state.range(0), state.range(1));
  const int64_t T = state.range(0), V = state.range(1);
  const double softcap = static_cast<double>(state.range(2));
  time_cuda(state, [&] {
    at::Tensor z = in.logits.narrow(1, 0, T - 1).reshape({-1, V});
    if (softcap > 0) z = softcap * at::tanh(z / softcap);
    const at::Tensor loss = at::cross_entropy_loss(z, in.labels.narrow(1, 1, T - 1).reshape({-1}));
    benchmark::DoNotOptimize(torch::autograd::grad({loss}, {in.logits})[0].data_ptr());
  });
  cpkit::bench::set_bytes(state, 8.0 * static_cast<double>(in.logits.numel()));
}

// The HBM limit: device-to-device copy of N bytes (N read + N written).
void BM_GpuCopy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const at::Tensor src =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(kCuda));
  at::Tensor dst = at::empty_like(src);
  time_cuda(state, [&] {
    cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice,
                    c10::cuda::getCurrentCUDAStream().stream());
  });
  cpkit::bench::set_bytes(state, 2.0 * static_cast<double>(bytes));
}

// The limit for a BSHD cut: one cudaMemcpy2D of rank 1's columns of [2, S, H] bf16 at CP 4.
// Args: S, H
void BM_GpuCopy2D(benchmark::State& state) {
  const int64_t S = state.range(0), H = state.range(1);
  const at::Tensor src =
      at::empty({2, S, H}, at::TensorOptions().dtype(at::kBFloat16).device(kCuda));
  at::Tensor dst = at::empty({2, S / 4, H}, src.options());
  const std::size_t width = static_cast<std::size_t>(S / 4 * H) * 2;
  time_cuda(state, [&] {
    cudaMemcpy2DAsync(dst.data_ptr(), width, static_cast<char*>(src.data_ptr()) + width,
                      static_cast<std::size_t>(S * H) * 2, width, 2, cudaMemcpyDeviceToDevice,
                      c10::cuda::getCurrentCUDAStream().stream());
  });
  cpkit::bench::set_bytes(state, 2.0 * static_cast<double>(dst.numel() * 2));
}

// Args: S, H (bf16, B = 2, CP = 4, rank 1)
void BM_GpuShardBshd_Optimized(benchmark::State& state) {
  cpkit::CPBatch b;
  b.inputs_embeds =
      at::randn({2, state.range(0), state.range(1)}, at::TensorOptions().device(kCuda))
          .to(at::kBFloat16);
  b.labels = at::randint(0, 32000, {2, state.range(0)},
                         at::TensorOptions().dtype(at::kLong).device(kCuda));
  time_cuda(state, [&] {
    const cpkit::Sharder s = cpkit::prepare_cp_inputs_for(b, 4);
    benchmark::DoNotOptimize(s.local(0, 1).inputs_embeds.data_ptr());
  });
  cpkit::bench::set_bytes(state, 2.0 * 2 * (state.range(0) / 4) * state.range(1) * 2);
}

// The LM head + loss, fwd+bwd, bf16 hidden [1, T, H] and head [V, H]: the fused op against
// the materialised path (bf16 matmul, logits.float(), shifted_cp_loss) and the LibTorch
// composite; peak_bytes is the caching allocator's high-water mark of allocated bytes during
// one step above the level before it (measured, not a formula). Args: H, T, V.
using HeadLoss = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const at::Tensor&)>;

void run_head(benchmark::State& state, const HeadLoss& loss) {
  const int64_t H = state.range(0), T = state.range(1), V = state.range(2);
  at::manual_seed(0);
  const auto bf16 = at::TensorOptions().device(kCuda).dtype(at::kBFloat16);
  const at::Tensor hidden = at::randn({1, T, H}, bf16).requires_grad_(true);
  const at::Tensor weight = (at::randn({V, H}, bf16) * 0.03).requires_grad_(true);
  const at::Tensor labels =
      at::randint(0, V, {1, T}, at::TensorOptions().dtype(at::kLong).device(kCuda));
  const at::Tensor valid = at::ones({T}, at::TensorOptions().dtype(at::kBool).device(kCuda));
  const auto step = [&] {
    const auto grads =
        torch::autograd::grad({loss(hidden, weight, labels, valid)}, {hidden, weight});
    benchmark::DoNotOptimize(grads[1].data_ptr());
  };
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  cudaDeviceSynchronize();
  alloc::resetPeakStats(0);
  const auto before = alloc::getDeviceStats(0).allocated_bytes[aggregate].current;
  step();
  cudaDeviceSynchronize();
  const auto peak = alloc::getDeviceStats(0).allocated_bytes[aggregate].peak;
  state.counters["peak_bytes"] = static_cast<double>(peak - before);
  state.counters["logits_bytes"] = static_cast<double>(T * V * 4);
  time_cuda(state, step);
  state.counters["tflops"] =
      benchmark::Counter(6.0 * H * T * V * static_cast<double>(state.iterations()) / 1e12,
                         benchmark::Counter::kIsRate);
}

void BM_GpuHead_Fused(benchmark::State& state) {
  run_head(state, [](const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels,
                     const at::Tensor& valid) {
    return cpkit::shifted_cp_linear_loss(h, w, labels, valid, nullptr);
  });
}

void BM_GpuHead_Materialized(benchmark::State& state) {
  run_head(state, [](const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels,
                     const at::Tensor& valid) {
    return cpkit::shifted_cp_loss(at::matmul(h, w.t()).to(at::kFloat), labels, valid, nullptr);
  });
}

void BM_GpuHead_Torch(benchmark::State& state) {
  run_head(state, [](const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels,
                     const at::Tensor&) {
    const int64_t T = h.size(1), V = w.size(0);
    const at::Tensor z = at::matmul(h, w.t()).to(at::kFloat).narrow(1, 0, T - 1).reshape({-1, V});
    return at::cross_entropy_loss(z, labels.narrow(1, 1, T - 1).reshape({-1}));
  });
}

BENCHMARK(BM_GpuHead_Fused)
    ->Args({4096, 8192, 204800})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK(BM_GpuHead_Materialized)
    ->Args({4096, 8192, 204800})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK(BM_GpuHead_Torch)
    ->Args({4096, 8192, 204800})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// The CE sizes every contender runs: [T, V] fp32 with and without the cap (T, V, softcap).
void ce_shapes(benchmark::internal::Benchmark* b) {
  b->Args({16384, 131072, 0})
      ->Args({16384, 131072, 30})
      ->Args({8192, 204800, 0})
      ->Args({8192, 204800, 30})
      ->Args({4096, 32768, 0})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(10);
}
BENCHMARK(BM_GpuCE_Optimized)->Apply(ce_shapes);
BENCHMARK(BM_GpuCE_Cluster)->Apply(ce_shapes);
BENCHMARK(BM_GpuCE_Torch)->Apply(ce_shapes);
BENCHMARK(BM_GpuCopy)
    ->Arg(int64_t{8} << 30)            // 4 T V bytes of [16384, 131072] fp32 logits
    ->Arg(int64_t{4} * 8192 * 204800)  // and of [8192, 204800]
    ->Arg(int64_t{512} << 20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10);
BENCHMARK(BM_GpuCopy2D)
    ->Args({32768, 4096})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10);
BENCHMARK(BM_GpuShardBshd_Optimized)
    ->Args({32768, 4096})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10);

}  // namespace

BENCHMARK_MAIN();
