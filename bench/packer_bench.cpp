// pack_documents (docs/spec.md section 2c) against what a data loader does today: the
// documents of a step in arrival order, each to the first row with room for it (first
// fit). Each step: lognormal documents (median ~1000, sigma 1.2, cut at T) filling 90 %
// of `rows` rows of T = 16384 tokens (DP ranks x microbatches), each row padded to T and
// planned `balanced` over CP ranks. Counters, over 50 steps: the step's slowest (row, CP rank)
// work over the mean of all of them (what every rank waits for at the step's collectives;
// the padding at a row's end costs nothing, as in cp_attention, where it sees no key),
// the same for the rows' work before the CP cut (and its floor: the largest document's work
// on one row) and for 128 x 128 tiles, and the keys ranks need from each other as a share of
// an all-gather's. The time is the packer's per step.
// Args: rows, CP, packer (0 first fit in arrival order, 1 pack_documents).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/packer.hpp"
#include "layout_keys.hpp"

namespace {

constexpr int64_t kTokens = 16384;

std::vector<std::vector<int64_t>> steps_of(int64_t rows) {
  std::mt19937_64 rng(4321);
  std::lognormal_distribution<double> length(std::log(1000.0), 1.2);
  std::vector<std::vector<int64_t>> steps(50);
  for (auto& docs : steps)
    for (int64_t used = 0;;) {
      const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(length(rng)), 1, kTokens);
      if (used + n > rows * kTokens * 9 / 10) break;
      docs.push_back(n);
      used += n;
    }
  return steps;
}

// First fit in arrival order: each document to the first row with room (a document no row
// holds is dropped, which first fit can need and the packer never did on these steps).
std::vector<int64_t> first_fit(const std::vector<int64_t>& docs, int64_t rows) {
  std::vector<int64_t> used(static_cast<std::size_t>(rows), 0), row_of;
  for (const int64_t n : docs) {
    int64_t r = 0;
    while (r < rows && used[static_cast<std::size_t>(r)] + n > kTokens) ++r;
    row_of.push_back(r < rows ? r : -1);
    if (r < rows) used[static_cast<std::size_t>(r)] += n;
  }
  return row_of;
}

void BM_Pack_Step(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int cp = static_cast<int>(state.range(1));
  const bool packer = state.range(2) == 1;
  const auto steps = steps_of(rows);
  auto pack = [&](const std::vector<int64_t>& docs) {
    return packer ? cpkit::pack_documents(docs, rows, kTokens) : first_fit(docs, rows);
  };
  std::size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(pack(steps[i++ % steps.size()]));
  double ranks = 0, row_work = 0, tiles = 0, needed = 0, dropped = 0, bound = 0;
  for (const auto& docs : steps) {
    const std::vector<int64_t> row_of = pack(docs);
    std::vector<std::vector<int64_t>> row_docs(static_cast<std::size_t>(rows));
    for (std::size_t d = 0; d < docs.size(); ++d) {
      if (row_of[d] < 0)
        ++dropped;
      else
        row_docs[static_cast<std::size_t>(row_of[d])].push_back(docs[d]);
    }
    std::vector<double> rank_work, rank_tiles, whole_rows;
    for (auto& slots : row_docs) {
      const cpkit::LayoutPlan plan = cpkit::plan_balanced(slots, kTokens, cp, 1);
      // cp_attention's cost: the row tail's padding queries see nothing (1 each stands in).
      std::vector<int64_t> attention = slots;
      const int64_t used = std::accumulate(slots.begin(), slots.end(), int64_t{0});
      attention.insert(attention.end(), static_cast<std::size_t>(plan.padded_len - used), 1);
      const std::vector<double> work = cpkit::layout_work(plan, attention);
      const std::vector<double> tile = cpkit::layout_work(plan, attention, 128);
      rank_work.insert(rank_work.end(), work.begin(), work.end());
      rank_tiles.insert(rank_tiles.end(), tile.begin(), tile.end());
      whole_rows.push_back(std::accumulate(work.begin(), work.end(), 0.0));
      const double all_gather = static_cast<double>((cp - 1) * plan.local_len);
      for (const double k : cpkit::bench::needed_keys(plan, attention))
        needed += k / all_gather / static_cast<double>(rows * cp);
    }
    ranks += cpkit::bench::max_over_mean(rank_work);
    // No packing beats the largest document's work on one row.
    const double largest =
        static_cast<double>(cpkit::document_work(*std::max_element(docs.begin(), docs.end())));
    bound += largest / (std::accumulate(whole_rows.begin(), whole_rows.end(), 0.0) /
                        static_cast<double>(rows));
    row_work += cpkit::bench::max_over_mean(whole_rows);
    tiles += cpkit::bench::max_over_mean(rank_tiles);
  }
  const auto n = static_cast<double>(steps.size());
  state.counters["rank_work_max_over_mean"] = ranks / n;
  state.counters["row_work_max_over_mean"] = row_work / n;
  state.counters["row_work_bound"] = bound / n;
  state.counters["tile128_max_over_mean"] = tiles / n;
  state.counters["needed_keys"] = needed / n;
  state.counters["dropped_documents"] = dropped / n;
}

void cases(benchmark::internal::Benchmark* b) {
  for (const int64_t rows : {4, 16})
    for (const int64_t cp : {4, 8})
      for (const int64_t packer : {0, 1}) b->Args({rows, cp, packer});
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Pack_Step)->Apply(cases);

}  // namespace
