// cp_attention forward + backward over Gloo with real rank processes (one thread each),
// moving only the needed keys (cpkit) against the same op moving every key (what an
// all-gather brings; same kernel, same outputs). The slowest rank's seconds per step (manual
// time; at CP 4 the ranks share this machine's 2 cores), bytes received per step per rank
// (forward keys and values, backward key gradients; the busiest rank and the mean), and how
// much of the forward's transfer the first stage hid: the longest wait after stage 1 against
// the longest time the same exchange takes alone (the backward's, returning as many bytes,
// is reported as its wait after its own keys' stage). Args: case (0: a packed row of 8192 tokens,
// lognormal documents of median ~1000; 1: one document of 2048 tokens), CP, layout (0 contiguous,
// 2 balanced), window, keys (1 needed, 0 all, 2 today's path: gather_tokens of k and v, then
// torch's scaled_dot_product_attention under a dense [L, S] mask, no overlap). Heads: 4 query,
// 2 key, D 32, float32. Also the bytes the forward leaves allocated until the backward (malloc's
// count before and after it: saved tensors and the output; the busiest rank).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "bench_util.hpp"
#include "cpkit/optimized/cp_attention.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "packed_rows.hpp"
#include "rank_pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> documents(int64_t which) {
  if (which == 1) return {2048};
  return cpkit::bench::lognormal_rows(1, 8192, 1234).front();
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes malloc has handed out and not taken back (this process).
int64_t allocated_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// The dense [L, S] mask of today's path (the HF integration's "sdpa"): this rank's queries
// against the gathered row's keys, section 3's rule and the window; a query that sees
// nothing sees every key (its output is unused; SDPA would give NaN).
at::Tensor gathered_mask(const cpkit::LocalShard& l, const cpkit::MeshPtr& mesh, int64_t window) {
  auto all = [&](const at::Tensor& t) { return cpkit::gather_tokens(t[0], mesh, false); };
  const at::Tensor pos = l.position_ids[0], doc = l.document_ids[0];
  const at::Tensor key_pos = all(l.position_ids), key_doc = all(l.document_ids);
  const at::Tensor key_pad = all(l.padding.to(at::kByte)).to(at::kBool);
  at::Tensor seen = (doc.unsqueeze(1) > 0) & (doc.unsqueeze(1) == key_doc.unsqueeze(0)) &
                    (key_pos.unsqueeze(0) <= pos.unsqueeze(1)) & (~key_pad).unsqueeze(0);
  if (window > 0) seen = seen & (pos.unsqueeze(1) - key_pos.unsqueeze(0) < window);
  return seen | ~seen.any(1, true);
}

// Payload: "case layout window keys iterations"; reply: "seconds bytes exposed transfer
// backward_exposed held".
const cpkit::pool::TaskRegistrar bench_attention(
    "bench_cp_attention", [](const std::string& payload, const cpkit::MeshPtr& mesh, int rank) {
      std::istringstream in(payload);
      int64_t which = 0, layout = 0, window = 0, needed = 1, iterations = 1;
      in >> which >> layout >> window >> needed >> iterations;
      at::set_num_threads(1);
      const cpkit::Sharder s =
          cpkit::prepare_packed_cp_inputs(cpkit::bench::packed_row(documents(which)), mesh, 1, true,
                                          {.layout = static_cast<cpkit::LayoutKind>(layout)});
      const auto plan = std::make_shared<const cpkit::AttentionPlan>(cpkit::attention_plan(
          s, 0, rank, window,
          needed == 1 ? cpkit::KeyExchange::kNeeded : cpkit::KeyExchange::kAll));
      const int64_t L = plan->local_len;
      at::manual_seed(rank);
      const at::Tensor q = at::randn({1, L, 4, 32}).requires_grad_(true);
      const at::Tensor k = at::randn({1, L, 2, 32}).requires_grad_(true);
      const at::Tensor v = at::randn({1, L, 2, 32}).requires_grad_(true);
      const at::Tensor d_out = at::randn({1, L, 4, 32});
      const at::Tensor mask = needed == 2 ? gathered_mask(s.local(0), mesh, window) : at::Tensor();
      int64_t held = 0;  // bytes the forward leaves allocated (saved for backward + output)
      auto forward = [&] {
        if (needed != 2) return cpkit::cp_attention(q, k, v, plan, mesh).out;
        // Today's path: every key gathered, then torch's attention under a dense mask.
        const at::Tensor keys = cpkit::gather_tokens(k, mesh, true, 1);
        const at::Tensor values = cpkit::gather_tokens(v, mesh, true, 1);
        return at::scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2),
                                                values.transpose(1, 2), mask, 0.0, false,
                                                std::nullopt, true)
            .transpose(1, 2);
      };
      auto step = [&] {
        const int64_t before = allocated_bytes();
        const at::Tensor out = forward();
        held = allocated_bytes() - before;
        benchmark::DoNotOptimize(torch::autograd::grad({out}, {q, k, v}, {d_out}));
      };
      step();  // warm-up
      cpkit::reset_cp_attention_stats();
      int64_t sync = 0;
      mesh->all_reduce_sum(&sync, 1, cpkit::ScalarKind::kInt64);
      const auto start = Clock::now();
      for (int64_t i = 0; i < iterations; ++i) step();
      const double seconds = seconds_since(start) / static_cast<double>(iterations);
      const cpkit::CpAttentionStats st = cpkit::cp_attention_stats();
      // The forward's exchange alone, same buffers and counts.
      std::vector<std::size_t> send, recv;
      int64_t sent = 0;
      for (const auto& list : plan->send) {
        send.push_back(list.size() * 2 * 2 * 32);
        sent += static_cast<int64_t>(list.size());
      }
      for (const auto& list : plan->recv) recv.push_back(list.size() * 2 * 2 * 32);
      const at::Tensor out_buffer = at::randn({sent, 2, 2, 32});
      const at::Tensor in_buffer = at::empty({plan->received_keys(), 2, 2, 32});
      mesh->all_reduce_sum(&sync, 1, cpkit::ScalarKind::kInt64);
      const auto xfer = Clock::now();
      for (int64_t i = 0; i < iterations; ++i)
        mesh->all_to_all_v(out_buffer.data_ptr(), send, in_buffer.data_ptr(), recv,
                           cpkit::ScalarKind::kFloat32);
      const double transfer = seconds_since(xfer) / static_cast<double>(iterations);
      std::ostringstream reply;
      reply << seconds << " " << static_cast<double>(st.bytes_received) / iterations << " "
            << st.forward_exposed_seconds / iterations << " " << transfer << " "
            << st.backward_exposed_seconds / iterations << " " << held;
      return reply.str();
    });

void BM_CpAttention(benchmark::State& state) {
  const int world = static_cast<int>(state.range(1));
  std::ostringstream payload;
  payload << state.range(0) << " " << state.range(2) << " " << state.range(3) << " "
          << state.range(4) << " 2";
  double busiest = 0, mean = 0, exposed = 0, transfer = 0, back_exposed = 0, held = 0;
  for (auto _ : state) {
    const auto replies =
        cpkit::pool::RankPool::instance().run(world, "bench_cp_attention", payload.str());
    double slowest = 0;
    busiest = mean = exposed = transfer = back_exposed = held = 0;
    for (const auto& r : replies) {
      if (!r.ok) {
        state.SkipWithError(r.bytes.c_str());
        return;
      }
      double seconds = 0, bytes = 0, wait = 0, alone = 0, back_wait = 0, kept = 0;
      std::istringstream(r.bytes) >> seconds >> bytes >> wait >> alone >> back_wait >> kept;
      held = std::max(held, kept);
      slowest = std::max(slowest, seconds);
      busiest = std::max(busiest, bytes);
      mean += bytes / world;
      exposed = std::max(exposed, wait);
      transfer = std::max(transfer, alone);
      back_exposed = std::max(back_exposed, back_wait);
    }
    state.SetIterationTime(slowest);
  }
  state.counters["bytes_busiest_rank"] = busiest;
  state.counters["bytes_mean"] = mean;
  state.counters["fwd_exposed_ms"] = exposed * 1e3;
  state.counters["fwd_transfer_alone_ms"] = transfer * 1e3;
  state.counters["bwd_exposed_ms"] = back_exposed * 1e3;
  state.counters["held_after_fwd_bytes"] = held;
  const int64_t mode = state.range(4);
  state.SetLabel(mode == 1 ? "needed keys" : mode == 0 ? "all keys" : "gather_tokens + sdpa");
}

void cases(benchmark::internal::Benchmark* b) {
  for (const int64_t which : {0, 1})
    for (const int64_t cp : {2, 4})
      for (const int64_t layout : {0, 2})
        for (const int64_t needed : {1, 0, 2}) b->Args({which, cp, layout, 0, needed});
  b->Args({0, 4, 0, 128, 1})->Args({0, 4, 0, 128, 0})->Args({0, 4, 0, 128, 2});
  b->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
}

BENCHMARK(BM_CpAttention)->Apply(cases);

}  // namespace
