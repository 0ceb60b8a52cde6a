// What the CP group's batch agreement costs (docs/spec.md section 6a): sharding one rank's
// shard of a BSHD id batch through a 2-rank Gloo mesh (the agreement exchange, plus the
// checksums under the value checks) against the same sharding without a mesh (no check).
#include <ATen/ATen.h>

#include <chrono>
#include <sstream>

#include "agreement.hpp"
#include "bench_util.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/validation.hpp"
#include "rank_pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Payload: "mesh checks S iterations": mesh 0 shards without a mesh (no agreement), 1 through
// the 2-rank mesh; checks 0 turns the value checks off (the mesh then exchanges the shapes once
// and nothing after), 1 keeps the default (CPU: the value checks, and through the mesh the
// shapes and checksums every call). Reply: rank 0's seconds per sharding.
const cpkit::pool::TaskRegistrar bench_agreement("bench_agreement", [](const std::string& payload,
                                                                       const cpkit::MeshPtr& mesh,
                                                                       int) {
  std::istringstream in(payload);
  int with_mesh = 0, checks = 0;
  int64_t S = 0, iterations = 0;
  in >> with_mesh >> checks >> S >> iterations;
  at::manual_seed(3);  // the same batch on every rank
  cpkit::CPBatch batch;
  batch.input_ids = at::randint(1, 32000, {2, S}, at::kLong);
  batch.labels = batch.input_ids.clone();
  batch.attention_mask = at::ones({2, S}, at::kLong);
  cpkit::set_value_checks(checks == 0 ? cpkit::ValueChecks::kNever : cpkit::ValueChecks::kCpuOnly);
  auto step = [&] {
    const cpkit::Sharder s = with_mesh == 0 ? cpkit::prepare_cp_inputs_for(batch, mesh->size())
                                            : cpkit::prepare_cp_inputs(batch, mesh);
    benchmark::DoNotOptimize(s.local(0, mesh->rank()).input_ids.data_ptr());
  };
  step();  // warm-up: connections, the first sighting
  int64_t sync = 0;
  mesh->all_reduce_sum(&sync, 1, cpkit::ScalarKind::kInt64);  // start together
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) step();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  cpkit::set_value_checks(cpkit::ValueChecks::kCpuOnly);
  return std::to_string(seconds / static_cast<double>(iterations));
});

// Args: S, mesh, checks (see the payload)
void BM_ShardAgreement(benchmark::State& state) {
  const std::string payload = std::to_string(state.range(1)) + " " +
                              std::to_string(state.range(2)) + " " +
                              std::to_string(state.range(0)) + " 30";
  for (auto _ : state) {
    const auto replies = cpkit::pool::RankPool::instance().run(2, "bench_agreement", payload);
    if (!replies[0].ok) {
      state.SkipWithError(replies[0].bytes.c_str());
      return;
    }
    state.SetIterationTime(std::stod(replies[0].bytes));
  }
  state.SetLabel(std::string(state.range(1) ? "mesh" : "no mesh") +
                 (state.range(2) ? ", value checks" : ", no value checks"));
}

void agreement_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t S : {8192, 131072})
    for (int64_t checks : {0, 1})
      for (int64_t mesh : {0, 1}) b->Args({S, mesh, checks});
  b->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(3);
}

BENCHMARK(BM_ShardAgreement)->Apply(agreement_sizes);

// The checksum alone (one int64 stream of n values) against a copy of the same bytes.
void BM_ValueChecksum(benchmark::State& state) {
  const at::Tensor ids = at::randint(0, 32000, {state.range(0)}, at::kLong);
  for (auto _ : state) benchmark::DoNotOptimize(cpkit::detail::value_checksum(ids).data_ptr());
  cpkit::bench::set_bytes(state, static_cast<double>(ids.nbytes()));
}

void BM_ValueChecksumCopy(benchmark::State& state) {
  const at::Tensor ids = at::randint(0, 32000, {state.range(0)}, at::kLong);
  at::Tensor out = at::empty_like(ids);
  for (auto _ : state) benchmark::DoNotOptimize(out.copy_(ids).data_ptr());
  cpkit::bench::set_bytes(state, static_cast<double>(ids.nbytes()));
}

BENCHMARK(BM_ValueChecksum)->Arg(262144)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ValueChecksumCopy)->Arg(262144)->Unit(benchmark::kMicrosecond);

}  // namespace
