// The LM head plus the shifted loss, forward + backward (d hidden and d weight), fp32 on this
// CPU: cpkit's fused op against the materialised path it replaces (matmul into [T, V]
// logits, then shifted_cp_loss) and the LibTorch composite a user would write (matmul +
// log_softmax + nll_loss + autograd). Time per step, and the measured peak resident memory
// of one step above the level before it (peak_memory.hpp), minus the gradients every path
// returns (d hidden, d weight) as `extra_bytes`. Args: H, T, V.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>

#include "bench_util.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "peak_memory.hpp"

namespace {

struct HeadInputs {
  at::Tensor hidden, weight, labels, valid;
};

HeadInputs make_inputs(int64_t H, int64_t T, int64_t V) {
  at::manual_seed(0);
  HeadInputs in;
  in.hidden = at::randn({1, T, H}).requires_grad_(true);
  in.weight = (at::randn({V, H}) * (2.0 / std::sqrt(static_cast<double>(H)))).requires_grad_(true);
  in.labels = at::randint(0, V, {1, T}, at::kLong);
  in.valid = at::ones({T}, at::kBool);
  return in;
}

using Loss = std::function<at::Tensor(const HeadInputs&)>;

// One training step's worth: the loss and both gradients, held until the step ends.
void step(const HeadInputs& in, const Loss& loss) {
  const auto grads = torch::autograd::grad({loss(in)}, {in.hidden, in.weight});
  benchmark::DoNotOptimize(grads[0].data_ptr());
  benchmark::DoNotOptimize(grads[1].data_ptr());
}

void run(benchmark::State& state, const Loss& loss) {
  static const bool once = (cpkit::bench::return_freed_memory(), true);
  (void)once;
  const int64_t H = state.range(0), T = state.range(1), V = state.range(2);
  const HeadInputs in = make_inputs(H, T, V);
  const double peak = cpkit::bench::peak_bytes_above_baseline([&] { step(in, loss); });
  step(in, loss);  // warm, as in training: steady state is what the loop measures
  for (auto _ : state) step(in, loss);
  const double grads = static_cast<double>((in.hidden.numel() + in.weight.numel()) * 4);
  state.counters["peak_bytes"] = peak;
  state.counters["extra_bytes"] = peak - grads;
  state.counters["logits_bytes"] = static_cast<double>(T * V * 4);
  state.counters["flop"] = 6.0 * static_cast<double>(H * T * V);  // three [T, H, V] matmuls
}

void BM_Head_Fused(benchmark::State& state) {
  run(state, [](const HeadInputs& in) {
    return cpkit::shifted_cp_linear_loss(in.hidden, in.weight, in.labels, in.valid, nullptr);
  });
}

void BM_Head_Materialized(benchmark::State& state) {
  run(state, [](const HeadInputs& in) {
    const at::Tensor logits = at::matmul(in.hidden, in.weight.t());
    return cpkit::shifted_cp_loss(logits, in.labels, in.valid, nullptr);
  });
}

void BM_Head_Torch(benchmark::State& state) {
  run(state, [](const HeadInputs& in) {
    const int64_t T = in.hidden.size(1), V = in.weight.size(0);
    const at::Tensor logits = at::matmul(in.hidden, in.weight.t());
    const at::Tensor z = logits.narrow(1, 0, T - 1).reshape({-1, V});
    return at::nll_loss(at::log_softmax(z, 1), in.labels.narrow(1, 1, T - 1).reshape({-1}));
  });
}

void head_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t V : {131072, 204800})
    for (int64_t H : {512, 1024})
      for (int64_t T : {512, 2048}) b->Args({H, T, V});
  for (int64_t T : {1024, 4096}) b->Args({512, T, 131072});  // memory against T
  b->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
}

BENCHMARK(BM_Head_Fused)->Apply(head_sizes);
BENCHMARK(BM_Head_Materialized)->Apply(head_sizes);
BENCHMARK(BM_Head_Torch)->Apply(head_sizes);

}  // namespace
