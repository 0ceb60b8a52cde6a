// The keys cp_attention moves (docs/spec.md section 4b): per rank, the keys its queries need
// from other ranks as a fraction of what an all-gather brings ((CP - 1) * L), forward and
// backward alike (the backward returns a gradient for each received key), as counters: the
// mean over ranks and rows and the busiest rank. The time measured is one rank's planning
// (host, per row). Args: case (0: packed rows of 16384 tokens, lognormal documents of median
// ~1000, 20 rows; 1: one document of 16384), CP, window (0: none).
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "packed_rows.hpp"

namespace {

using cpkit::LayoutKind;

constexpr int64_t kTokens = 16384;

std::vector<std::vector<int64_t>> rows_of(int64_t which) {
  if (which == 1) return {{kTokens}};
  return cpkit::bench::lognormal_rows(20, kTokens, 1234);
}

cpkit::Sharder shard(const std::vector<int64_t>& docs, int cp, LayoutKind kind) {
  return cpkit::prepare_packed_cp_inputs_for(cpkit::bench::packed_row(docs), cp, 1, true,
                                             {.layout = kind});
}

void run(benchmark::State& state, LayoutKind kind) {
  const auto rows = rows_of(state.range(0));
  const int cp = static_cast<int>(state.range(1));
  const int64_t window = state.range(2);
  std::vector<cpkit::Sharder> sharders;
  for (const auto& docs : rows) sharders.push_back(shard(docs, cp, kind));
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cpkit::attention_plan(sharders[i % sharders.size()], 0, 0, window));
    ++i;
  }
  double mean = 0, busiest = 0;
  for (const cpkit::Sharder& s : sharders)
    for (int r = 0; r < cp; ++r) {
      const cpkit::AttentionPlan p = cpkit::attention_plan(s, 0, r, window);
      const double share =
          static_cast<double>(p.received_keys()) / static_cast<double>(p.all_gather_keys());
      mean += share;
      busiest = std::max(busiest, share);
    }
  state.counters["needed_over_all_gather"] = mean / static_cast<double>(sharders.size() * cp);
  state.counters["busiest_rank"] = busiest;
}

void BM_AttentionPlan_Contiguous(benchmark::State& s) { run(s, LayoutKind::kContiguous); }
void BM_AttentionPlan_HeadTail(benchmark::State& s) { run(s, LayoutKind::kHeadTail); }
void BM_AttentionPlan_Balanced(benchmark::State& s) { run(s, LayoutKind::kBalanced); }

void cases(benchmark::internal::Benchmark* b) {
  for (const int64_t which : {0, 1})
    for (const int64_t cp : {2, 4, 8})
      for (const int64_t window : {0, 128}) b->Args({which, cp, window});
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_AttentionPlan_Contiguous)->Apply(cases);
BENCHMARK(BM_AttentionPlan_HeadTail)->Apply(cases);
BENCHMARK(BM_AttentionPlan_Balanced)->Apply(cases);

}  // namespace
