// Shifted CE forward + backward on [T, V] float32 logits: cpkit's fused kernel, the LibTorch
// composite a user would write (log_softmax + nll_loss + autograd), and the reference.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "bench_util.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/reference/loss.hpp"

namespace {

struct CeInputs {
  at::Tensor logits, labels, valid;
};

CeInputs make_inputs(int64_t T, int64_t V) {
  at::manual_seed(0);
  CeInputs in;
  in.logits = (at::randn({1, T, V}) * 4).requires_grad_(true);
  in.labels = at::randint(0, V, {1, T}, at::kLong);
  in.valid = at::ones({T}, at::kBool);
  return in;
}

void run_optimized(benchmark::State& state) {
  const CeInputs in = make_inputs(state.range(0), state.range(1));
  const double softcap = static_cast<double>(state.range(2));
  const auto step = [&] {
    const at::Tensor loss =
        cpkit::shifted_cp_loss(in.logits, in.labels, in.valid, nullptr, {.softcap = softcap});
    const auto grad = torch::autograd::grad({loss}, {in.logits});
    benchmark::DoNotOptimize(grad[0].data_ptr());
  };
  step();  // untimed first step, as in training: steady state is what the loop measures
  for (auto _ : state) step();
  cpkit::bench::set_bytes(state, 8.0 * static_cast<double>(in.logits.numel()));
}

// Args: T, V, softcap (0 or 30)
void BM_CE_Optimized(benchmark::State& state) { run_optimized(state); }

void BM_CE_OptimizedNoCache(benchmark::State& state) {
  const cpkit::bench::HostCacheOff off;
  run_optimized(state);
}

void BM_CE_Torch(benchmark::State& state) {
  const CeInputs in = make_inputs(state.range(0), state.range(1));
  const int64_t T = state.range(0), V = state.range(1);
  const double softcap = static_cast<double>(state.range(2));
  const auto step = [&] {
    at::Tensor z = in.logits.narrow(1, 0, T - 1).reshape({-1, V});
    if (softcap > 0) z = softcap * at::tanh(z / softcap);
    const at::Tensor loss =
        at::nll_loss(at::log_softmax(z, 1), in.labels.narrow(1, 1, T - 1).reshape({-1}));
    const auto grad = torch::autograd::grad({loss}, {in.logits});
    benchmark::DoNotOptimize(grad[0].data_ptr());
  };
  step();  // the same untimed first step
  for (auto _ : state) step();
  cpkit::bench::set_bytes(state, 8.0 * static_cast<double>(in.logits.numel()));
}

void BM_CE_Reference(benchmark::State& state) {
  const CeInputs in = make_inputs(state.range(0), state.range(1));
  const int64_t T = state.range(0), V = state.range(1);
  const cpkit::reference::FloatMatrix logits =
      Eigen::Map<const cpkit::reference::FloatMatrix>(in.logits.detach().data_ptr<float>(), T, V);
  cpkit::reference::IntMatrix labels =
      Eigen::Map<const cpkit::reference::IntMatrix>(in.labels.data_ptr<int64_t>(), 1, T);
  const cpkit::reference::BoolVector valid = cpkit::reference::BoolVector::Ones(T);
  for (auto _ : state) {
    const auto losses = cpkit::reference::shifted_cp_loss({logits}, {labels}, {valid},
                                                          {static_cast<double>(state.range(2))});
    benchmark::DoNotOptimize(losses[0].grad_logits.data());
  }
  cpkit::bench::set_bytes(state, 8.0 * static_cast<double>(T * V));
}

// One fused forward (loss and gradient, no autograd) at a small size: the C++ side of the
// Python op's call overhead (bench/python_bench.py times torch.ops.cpkit.shifted_cp_loss on
// the same shape). Args: T, V.
void BM_CE_CallSmall(benchmark::State& state) {
  const CeInputs in = make_inputs(state.range(0), state.range(1));
  const at::Tensor logits = in.logits.detach();
  for (auto _ : state) {
    const cpkit::LossWithGrad out =
        cpkit::shifted_cp_loss_with_grad(logits, in.labels, in.valid, nullptr);
    benchmark::DoNotOptimize(out.grad_logits.data_ptr());
  }
}
BENCHMARK(BM_CE_CallSmall)->Args({16, 1024})->Unit(benchmark::kMicrosecond)->MinTime(0.5);

void ce_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t T : {512, 1024, 2048, 4096})
    for (int64_t V : {32768, 65536, 131072}) b->Args({T, V, 0});
  b->Args({2048, 131072, 30});
  b->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

void ce_reference_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t T : {512, 1024})
    for (int64_t V : {32768, 131072}) b->Args({T, V, 0});
  b->Unit(benchmark::kMillisecond)->Iterations(1);
}

void ce_no_cache_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t T : {512, 1024, 4096}) b->Args({T, 131072, 0});
  b->Args({512, 32768, 0});
  b->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

BENCHMARK(BM_CE_Optimized)->Apply(ce_sizes);
BENCHMARK(BM_CE_OptimizedNoCache)->Apply(ce_no_cache_sizes);
BENCHMARK(BM_CE_Torch)->Apply(ce_sizes);
BENCHMARK(BM_CE_Reference)->Apply(ce_reference_sizes);

}  // namespace
