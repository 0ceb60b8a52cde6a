// gather_tokens forward + backward over Gloo with 2 and 4 real rank processes, against the
// raw c10d all-gather + reduce-scatter of the same bytes on the same process group.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <sstream>

#include "bench_util.hpp"
#include "cpkit/optimized/gather.hpp"
#include "rank_pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Payload: "cpkit|raw tokens hidden iterations"; reply: rank 0's seconds per iteration.
const cpkit::pool::TaskRegistrar bench_gather("bench_gather", [](const std::string& payload,
                                                                 const cpkit::MeshPtr& mesh,
                                                                 int rank) {
  std::istringstream in(payload);
  std::string mode;
  int64_t tokens = 0, hidden = 0, iterations = 0;
  in >> mode >> tokens >> hidden >> iterations;
  const at::Tensor x = at::randn({tokens, hidden}).requires_grad_(true);
  const at::Tensor upstream = at::randn({mesh->size() * tokens, hidden});
  auto step = [&] {
    if (mode == "cpkit") {
      const at::Tensor g = cpkit::gather_tokens(x, mesh, true);
      benchmark::DoNotOptimize(torch::autograd::grad({g}, {x}, {upstream})[0].data_ptr());
    } else {  // what a user writes with c10d: fresh outputs, the two collectives
      at::Tensor gathered = at::empty({mesh->size() * tokens, hidden});
      at::Tensor reduced = at::empty({tokens, hidden});
      mesh->all_gather(x.data_ptr(), gathered.data_ptr(), x.numel(), cpkit::ScalarKind::kFloat32);
      mesh->reduce_scatter_sum(upstream.data_ptr(), reduced.data_ptr(), reduced.numel(),
                               cpkit::ScalarKind::kFloat32);
    }
  };
  step();  // warm-up: connections, allocations
  int64_t sync = 0;
  mesh->all_reduce_sum(&sync, 1, cpkit::ScalarKind::kInt64);  // start together
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) step();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  (void)rank;
  return std::to_string(seconds / static_cast<double>(iterations));
});

// Args: world, tokens per rank, hidden, mode (1 = cpkit, 0 = raw c10d)
void BM_Gather(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int64_t tokens = state.range(1), hidden = state.range(2);
  const std::string mode = state.range(3) ? "cpkit" : "raw";
  const std::string payload =
      mode + " " + std::to_string(tokens) + " " + std::to_string(hidden) + " 10";
  for (auto _ : state) {
    const auto replies = cpkit::pool::RankPool::instance().run(world, "bench_gather", payload);
    if (!replies[0].ok) {
      state.SkipWithError(replies[0].bytes.c_str());
      return;
    }
    state.SetIterationTime(std::stod(replies[0].bytes));
  }
  // Per rank: all-gather receives (CP - 1) * N * H, reduce-scatter sends as much.
  const double bytes = 2.0 * (world - 1) * static_cast<double>(tokens * hidden) * 4;
  cpkit::bench::set_bytes(state, bytes);
  state.SetLabel(mode);
}

void gather_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t world : {2, 4})
    for (int64_t tokens : {2048, 8192})
      for (int64_t mode : {1, 0}) b->Args({world, tokens, 1024, mode});
  b->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

BENCHMARK(BM_Gather)->Apply(gather_sizes);

}  // namespace
