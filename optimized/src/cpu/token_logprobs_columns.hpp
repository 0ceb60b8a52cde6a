// The CPU token_logprobs kernels on vocab-major logits (cpu/vocab_major.hpp): the forward
// reads the logits once, the backward reads and writes them once, over vocabulary slices in
// parallel.
#pragma once

#include <vector>

#include "cpu/vocab_major.hpp"
#include "kernels/targets.hpp"
#include "kernels/token_logprobs.hpp"
#include "kernels/token_logprobs_launch.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

template <bool kCapped>
void forward_columns(const TokenLogprobsArgs& a) {
  const std::int64_t n = a.rows;
  const std::vector<LogprobStats> stats =
      column_statistics<kCapped, true>(a.logits, n, a.vocab, a.softcap, a.inv_temperature);
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t target = a.targets[r];
    float* saved = a.stats + 3 * r;
    if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab)) {
      // No target: 0 and 0. A target outside the vocabulary (value checks off): NaN.
      const float value = target == kIgnoreLabel ? 0.0f : NAN;
      a.logprobs[r] = value;
      if (a.entropy) a.entropy[r] = value;
      saved[0] = saved[1] = saved[2] = value;
      continue;
    }
    const RowStats rs = row_stats(stats[r]);
    a.logprobs[r] = logprob_value(
        tempered<kCapped>(a.logits[target * n + r], a.softcap, a.inv_temperature), rs);
    if (a.entropy) a.entropy[r] = entropy_value(rs);
    saved[0] = rs.max;
    saved[1] = rs.log_sum;
    saved[2] = rs.mean_centred;
  }
}

template <bool kCapped>
void backward_columns(const TokenLogprobsArgs& a) {
  const std::int64_t n = a.rows;
  std::vector<float> lanes(static_cast<std::size_t>(6 * n));
  float* row_max = lanes.data();
  float* ls = row_max + n;
  float* mean_centred = ls + n;
  float* g_lp = mean_centred + n;
  float* g_ent = g_lp + n;
  float* y_target = g_ent + n;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t target = a.targets[r];
    row_max[r] = a.stats[3 * r];
    ls[r] = a.stats[3 * r + 1];
    mean_centred[r] = a.stats[3 * r + 2];
    g_lp[r] = a.grad_logprobs ? a.grad_logprobs[r] : 0.0f;
    g_ent[r] = a.grad_entropy ? a.grad_entropy[r] : 0.0f;
    // Read before the gradient overwrites it (g may be y).
    if (in_vocabulary(target, a.vocab)) y_target[r] = a.logits[target * n + r];
  }
  for_vocab_slices(a.vocab, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t v = first; v < last; ++v) {
      const float* y = a.logits + v * n;
      float* g = a.grad + v * n;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k)
        g[k] = logprob_grad<kCapped>(y[k], false, RowStats{row_max[k], ls[k], mean_centred[k]},
                                     g_lp[k], g_ent[k], a.softcap, a.inv_temperature);
    }
  });
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t target = a.targets[r];
    if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab))
      fill_column(a.grad, n, a.vocab, r, target == kIgnoreLabel ? 0.0f : NAN);
    else
      a.grad[target * n + r] =
          logprob_grad<kCapped>(y_target[r], true, RowStats{row_max[r], ls[r], mean_centred[r]},
                                g_lp[r], g_ent[r], a.softcap, a.inv_temperature);
  }
}

inline void run_forward_columns(const TokenLogprobsArgs& a) {
  if (a.softcap > 0.0f)
    forward_columns<true>(a);
  else
    forward_columns<false>(a);
}

inline void run_backward_columns(const TokenLogprobsArgs& a) {
  if (a.softcap > 0.0f)
    backward_columns<true>(a);
  else
    backward_columns<false>(a);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
