// The row loops of the CPU token_logprobs kernels, compiled twice: for the baseline x86-64
// and with AVX2 + FMA (token_logprobs_cpu_avx2.cpp); token_logprobs_cpu picks one at run
// time. The forward reads each row once (an online softmax over L1-sized blocks that also
// sums e (z - max) for the entropy); the backward writes each row once. Branch-free loops
// (the cap is a template switch) that `omp simd` vectorises.
#pragma once

#include <algorithm>

#include "kernels/targets.hpp"
#include "kernels/token_logprobs.hpp"
#include "kernels/token_logprobs_launch.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

constexpr std::int64_t kLogprobBlock = 512;

template <bool kCapped>
inline LogprobStats row_statistics(const float* y, std::int64_t vocab, float softcap,
                                   float inv_temperature) {
  LogprobStats state = logprob_empty();
  for (std::int64_t start = 0; start < vocab; start += kLogprobBlock) {
    const std::int64_t n = std::min(kLogprobBlock, vocab - start);
    const float* x = y + start;
    float z[kLogprobBlock];  // the block's tempered logits, kept in L1
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) z[k] = tempered<kCapped>(x[k], softcap, inv_temperature);
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (std::int64_t k = 0; k < n; ++k) m = z[k] > m ? z[k] : m;
    const float shift = finite_shift(m);
    float sum = 0.0f, centred = 0.0f;
#pragma omp simd reduction(+ : sum, centred)
    for (std::int64_t k = 0; k < n; ++k) {
      const float d = z[k] - shift;
      const float e = fast_exp(d);
      sum += e;
      centred += centred_term(e, d);
    }
    state = logprob_merge(state, {m, sum, centred});
  }
  return state;
}

template <bool kCapped>
void forward_rows(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end) {
  for (std::int64_t row = begin; row < end; ++row) {
    const float* y = a.logits + row * a.vocab;
    const std::int64_t target = a.targets[row];
    float* saved = a.stats + 3 * row;
    if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab)) {
      // No target: 0 and 0. A target outside the vocabulary (value checks off): NaN.
      const float value = target == kIgnoreLabel ? 0.0f : NAN;
      a.logprobs[row] = value;
      if (a.entropy) a.entropy[row] = value;
      saved[0] = saved[1] = saved[2] = value;
      continue;
    }
    const RowStats r = row_stats(row_statistics<kCapped>(y, a.vocab, a.softcap, a.inv_temperature));
    const float z_target = tempered<kCapped>(y[target], a.softcap, a.inv_temperature);
    a.logprobs[row] = logprob_value(z_target, r);
    if (a.entropy) a.entropy[row] = entropy_value(r);
    saved[0] = r.max;
    saved[1] = r.log_sum;
    saved[2] = r.mean_centred;
  }
}

template <bool kCapped>
void backward_rows(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end) {
  for (std::int64_t row = begin; row < end; ++row) {
    const float* y = a.logits + row * a.vocab;
    float* g = a.grad + row * a.vocab;
    const std::int64_t target = a.targets[row];
    if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab)) {
      std::fill(g, g + a.vocab, target == kIgnoreLabel ? 0.0f : NAN);
      continue;
    }
    const float* saved = a.stats + 3 * row;
    const RowStats r{saved[0], saved[1], saved[2]};
    const float g_lp = a.grad_logprobs[row];
    const float g_ent = a.grad_entropy ? a.grad_entropy[row] : 0.0f;
    const float y_target = y[target];  // read before the row is overwritten (g may be y)
#pragma omp simd
    for (std::int64_t k = 0; k < a.vocab; ++k)
      g[k] = logprob_grad<kCapped>(y[k], false, r, g_lp, g_ent, a.softcap, a.inv_temperature);
    g[target] = logprob_grad<kCapped>(y_target, true, r, g_lp, g_ent, a.softcap, a.inv_temperature);
  }
}

inline void run_forward(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end) {
  if (a.softcap > 0.0f)
    forward_rows<true>(a, begin, end);
  else
    forward_rows<false>(a, begin, end);
}

inline void run_backward(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end) {
  if (a.softcap > 0.0f)
    backward_rows<true>(a, begin, end);
  else
    backward_rows<false>(a, begin, end);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
