// The CPU token_logprobs kernels on vocab-major logits (cpu/vocab_major.hpp): the forward
// reads the logits once, the backward reads and writes them once, over vocabulary slices in
// parallel.
#pragma once

#include <vector>

#include "cpu/vocab_major.hpp"
#include "kernels/token_logprobs.hpp"
#include "kernels/token_logprobs_launch.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

// kCentred: the centred sum the entropy needs (without it, mean_centred is saved as 0).
template <bool kCapped, bool kCentred>
void forward_columns(const TokenLogprobsArgs& a) {
  const std::int64_t n = a.rows;
  const std::vector<LogprobStats> stats =
      column_statistics<kCapped, kCentred>(a.logits, n, a.vocab, a.softcap, a.inv_temperature);
  const std::vector<float> y_target = target_logits(a.logits, a.targets, n, a.vocab);
  for (std::int64_t r = 0; r < n; ++r) {
    float* saved = a.stats + 3 * r;
    if (!reads_target(a.targets[r], a.vocab)) {
      const float value = without_target(a.targets[r]);
      a.logprobs[r] = value;
      if (a.entropy) a.entropy[r] = value;
      saved[0] = saved[1] = saved[2] = value;
      continue;
    }
    const RowStats rs = row_stats(stats[r]);
    a.logprobs[r] = logprob_value(tempered<kCapped>(y_target[r], a.softcap, a.inv_temperature), rs);
    if (a.entropy) a.entropy[r] = entropy_value(rs);
    saved[0] = rs.max;
    saved[1] = rs.log_sum;
    saved[2] = rs.mean_centred;
  }
}

template <bool kCapped, bool kEntropy>
void backward_columns(const TokenLogprobsArgs& a) {
  const std::int64_t n = a.rows;
  std::vector<float> lanes(static_cast<std::size_t>(5 * n));
  float* row_max = lanes.data();
  float* ls = row_max + n;
  float* mean_centred = ls + n;
  float* g_lp = mean_centred + n;
  float* g_ent = g_lp + n;
  for (std::int64_t r = 0; r < n; ++r) {
    row_max[r] = a.stats[3 * r];
    ls[r] = a.stats[3 * r + 1];
    mean_centred[r] = a.stats[3 * r + 2];
    g_lp[r] = a.grad_logprobs ? a.grad_logprobs[r] : 0.0f;
    g_ent[r] = a.grad_entropy ? a.grad_entropy[r] : 0.0f;
  }
  const float softcap = a.softcap, inv_temperature = a.inv_temperature;
  auto grad = [=](float y, bool is_target, std::int64_t r) {
    return logprob_grad<kCapped, kEntropy>(y, is_target,
                                           RowStats{row_max[r], ls[r], mean_centred[r]}, g_lp[r],
                                           g_ent[r], softcap, inv_temperature);
  };
  gradient_columns(
      a.logits, a.grad, a.targets, n, a.vocab, target_logits(a.logits, a.targets, n, a.vocab),
      [=](float y, std::int64_t r) { return grad(y, false, r); },
      [=](float y, std::int64_t r) { return grad(y, true, r); });
}

// The entropy's centred sum and gradient term only where they are asked for (a.centred or
// a.entropy; a.grad_entropy): a policy loss without an entropy bonus skips both.
inline void run_forward_columns(const TokenLogprobsArgs& a) {
  const bool capped = a.softcap > 0.0f, centred = a.centred || a.entropy != nullptr;
  if (capped && centred) return forward_columns<true, true>(a);
  if (capped) return forward_columns<true, false>(a);
  if (centred) return forward_columns<false, true>(a);
  forward_columns<false, false>(a);
}

inline void run_backward_columns(const TokenLogprobsArgs& a) {
  const bool capped = a.softcap > 0.0f, entropy = a.grad_entropy != nullptr;
  if (capped && entropy) return backward_columns<true, true>(a);
  if (capped) return backward_columns<true, false>(a);
  if (entropy) return backward_columns<false, true>(a);
  backward_columns<false, false>(a);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
