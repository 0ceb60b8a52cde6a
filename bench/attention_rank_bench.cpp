// cp_attention's kernel for each rank alone (no communication; random received keys of the
// plan's sizes), forward + backward on one thread: how evenly a layout spreads the attention
// work that the kernel actually does. Counters: the slowest rank's milliseconds (manual
// time), max over mean of the ranks' times. Args: CP, layout (0 contiguous, 1 head_tail,
// 2 balanced). A packed row of 16384 tokens, lognormal documents (median ~1000); 4 query
// heads, 2 key heads, D 32, float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>

#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "kernels/attention_launch.hpp"
#include "packed_rows.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Forward + backward of one rank's queries over its own and received key slots.
double rank_seconds(const cpkit::AttentionPlan& plan) {
  const int64_t own = plan.rows * plan.local_len, slots = own + plan.received_keys();
  const int64_t hq = 4, hkv = 2, d = 32;
  at::manual_seed(plan.rank);
  const at::Tensor q = at::randn({own, hq, d}), keys = at::randn({slots, hkv, d});
  const at::Tensor values = at::randn({slots, hkv, d}), d_out = at::randn({own, hq, d});
  at::Tensor out = at::empty({own, hq, d}), lse = at::empty({own, hq});
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(keys), dv = at::empty_like(values);
  cpkit::kernels::AttentionArgs a{};
  a.q = q.const_data_ptr<float>();
  a.k = keys.const_data_ptr<float>();
  a.v = values.const_data_ptr<float>();
  a.key_slots = plan.all_keys.slots.data();
  a.key_begin = plan.all_keys.begin.data();
  a.key_end = plan.all_keys.end.data();
  a.queries = own;
  a.keys = slots;
  a.hq = hq;
  a.hkv = hkv;
  a.d = d;
  a.scale = 0.17f;
  a.out = out.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  a.d_out = d_out.const_data_ptr<float>();
  a.dq = dq.data_ptr<float>();
  a.dk = dk.data_ptr<float>();
  a.dv = dv.data_ptr<float>();
  const auto start = Clock::now();
  cpkit::kernels::attention_forward_cpu(a);
  cpkit::kernels::attention_backward_cpu(a);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void BM_CpAttentionRankAlone(benchmark::State& state) {
  const int cp = static_cast<int>(state.range(0));
  const auto kind = static_cast<cpkit::LayoutKind>(state.range(1));
  const cpkit::Sharder s = cpkit::prepare_packed_cp_inputs_for(
      cpkit::bench::packed_row(cpkit::bench::lognormal_rows(1, 16384, 1234).front()), cp, 1, true,
      {.layout = kind});
  std::vector<cpkit::AttentionPlan> plans;
  for (int r = 0; r < cp; ++r) plans.push_back(cpkit::attention_plan(s, 0, r));
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  double slowest = 0, mean = 0;
  for (auto _ : state) {
    slowest = mean = 0;
    for (const auto& plan : plans) {
      const double t = rank_seconds(plan);
      slowest = std::max(slowest, t);
      mean += t / cp;
    }
    state.SetIterationTime(slowest);
  }
  at::set_num_threads(threads);
  state.counters["max_over_mean"] = slowest / mean;
}

BENCHMARK(BM_CpAttentionRankAlone)
    ->ArgsProduct({{4, 8}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
