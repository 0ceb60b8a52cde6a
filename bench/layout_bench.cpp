// Layouts (docs/spec.md section 2b): per-rank causal attention work and tile cost, max over
// mean, and the keys each rank's queries need from other ranks (what cp_attention moves, as
// a fraction of an all-gather's (CP - 1) L: the mean and the busiest rank), for contiguous,
// head_tail and balanced, as counters; the time measured is the planner's host time per row.
// Cases (Args: case, CP[, balance_slack in thousandths]): 0 one document of 8192 tokens, 1 one
// of 32768, 2 packed rows of 65536 with lognormal documents (median ~1k, long tail; 100 rows),
// 3 rows of uniform 512-token documents, 4 a 128K row of 1000 documents (the planner target),
// 5 packed rows of 16384 (lognormal, 100 rows). BM_Layout_BalancedSlack sweeps the slack on
// cases 2 and 5: the work-for-bytes trade-off curve.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpkit/optimized/layout.hpp"
#include "layout_keys.hpp"

namespace {

using cpkit::LayoutKind;

// Document (slot) lengths of each row of a case.
std::vector<std::vector<int64_t>> rows_of(int64_t which) {
  std::mt19937_64 rng(1234);
  auto fill = [&](int64_t T, auto&& length) {
    std::vector<int64_t> docs;
    for (int64_t used = 0; used < T;) {
      const int64_t n = std::min<int64_t>(std::max<int64_t>(1, length()), T - used);
      docs.push_back(n);
      used += n;
    }
    return docs;
  };
  switch (which) {
    case 0:
      return {{8192}};
    case 1:
      return {{32768}};
    case 2: {
      std::lognormal_distribution<double> length(std::log(1000.0), 1.2);
      std::vector<std::vector<int64_t>> rows;
      for (int r = 0; r < 100; ++r)
        rows.push_back(fill(65536, [&] { return static_cast<int64_t>(length(rng)); }));
      return rows;
    }
    case 3:
      return {fill(65536, [] { return int64_t{512}; })};
    case 4: {
      std::uniform_int_distribution<int64_t> length(1, 261);  // mean ~131: 1000 in 128K
      return {fill(131072, [&] { return length(rng); })};
    }
    default: {
      std::lognormal_distribution<double> length(std::log(1000.0), 1.2);
      std::vector<std::vector<int64_t>> rows;
      for (int r = 0; r < 100; ++r)
        rows.push_back(fill(16384, [&] { return static_cast<int64_t>(length(rng)); }));
      return rows;
    }
  }
}

cpkit::LayoutPlan plan(LayoutKind kind, const std::vector<int64_t>& docs, int cp, double slack) {
  int64_t T = 0;
  for (const int64_t n : docs) T += n;
  return kind == LayoutKind::kBalanced ? cpkit::plan_balanced(docs, T, cp, 1, slack)
                                       : cpkit::plan_layout(kind, T, cp);
}

void run(benchmark::State& state, LayoutKind kind) {
  const auto rows = rows_of(state.range(0));
  const int cp = static_cast<int>(state.range(1));
  const double slack = state.range(2) >= 0 ? static_cast<double>(state.range(2)) / 1000
                                           : cpkit::kDefaultBalanceSlack;
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(plan(kind, rows[i % rows.size()], cp, slack));
    ++i;
  }
  double mean = 0, worst = 0, tile_mean = 0, tile_worst = 0, fragments = 0, needed = 0, busiest = 0;
  for (const auto& docs : rows) {
    const cpkit::LayoutPlan p = plan(kind, docs, cp, slack);
    const std::vector<int64_t> attention = cpkit::bench::attention_docs(docs, p);
    const double r = cpkit::bench::max_over_mean(cpkit::layout_work(p, attention));
    const double t = cpkit::bench::max_over_mean(cpkit::layout_work(p, attention, 128));
    mean += r;
    worst = std::max(worst, r);
    tile_mean += t;
    tile_worst = std::max(tile_worst, t);
    for (const auto& list : p.fragments)
      fragments = std::max(fragments, static_cast<double>(list.size()));
    const std::vector<double> keys = cpkit::bench::needed_keys(p, attention);
    const double all_gather = static_cast<double>((cp - 1) * p.local_len);
    for (const double k : keys) needed += k / all_gather / cp;
    busiest += *std::max_element(keys.begin(), keys.end()) / all_gather;
  }
  const auto n = static_cast<double>(rows.size());
  state.counters["max_over_mean"] = mean / n;
  state.counters["worst_row"] = worst;
  state.counters["tile128_max_over_mean"] = tile_mean / n;
  state.counters["tile128_worst_row"] = tile_worst;
  state.counters["max_fragments_per_rank"] = fragments;
  state.counters["needed_keys"] = needed / n;
  state.counters["needed_keys_busiest"] = busiest / n;
}

void BM_Layout_Contiguous(benchmark::State& s) { run(s, LayoutKind::kContiguous); }
void BM_Layout_HeadTail(benchmark::State& s) { run(s, LayoutKind::kHeadTail); }
void BM_Layout_Balanced(benchmark::State& s) { run(s, LayoutKind::kBalanced); }
void BM_Layout_BalancedSlack(benchmark::State& s) { run(s, LayoutKind::kBalanced); }

void cases(benchmark::internal::Benchmark* b) {
  for (const int64_t which : {0, 1, 2, 3, 4, 5})
    for (const int64_t cp : {2, 4, 8}) b->Args({which, cp, -1});  // -1: the default slack
  b->Unit(benchmark::kMicrosecond);
}

void slacks(benchmark::internal::Benchmark* b) {
  for (const int64_t which : {2, 5})
    for (const int64_t cp : {2, 4, 8})
      for (const int64_t thousandths : {0, 5, 10, 20, 40, 80, 160})
        b->Args({which, cp, thousandths});
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Layout_Contiguous)->Apply(cases);
BENCHMARK(BM_Layout_HeadTail)->Apply(cases);
BENCHMARK(BM_Layout_Balanced)->Apply(cases);
BENCHMARK(BM_Layout_BalancedSlack)->Apply(slacks);

}  // namespace
