// The row loops of the CPU cross-entropy kernel, compiled twice: for the baseline x86-64
// and with AVX2 + FMA (cross_entropy_cpu_avx2.cpp); cross_entropy_cpu picks one at run time.
// Each row is read from memory once. The statistics pass is an online softmax over L1-sized
// blocks that also stages, in the gradient buffer, what the gradient pass would otherwise
// recompute: exp(z - block max) without the cap (the gradient pass then multiplies by one
// factor per block, one exponential per logit in all), tanh(z / c) with it. A row of the
// gradient (V floats) stays in L2 between the two passes. The loops are branch-free (the cap
// is a template switch) and `omp simd` vectorises their reductions.
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "kernels/targets.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

constexpr std::int64_t kBlock = 512;

// Statistics of row z; leaves exp(z - block max) (no cap) or tanh(z / c) (cap) in g and
// each block's max in block_max.
template <bool kCapped>
inline OnlineSoftmax stage_row(const float* z, std::int64_t vocab, float softcap, float* g,
                               float* block_max) {
  OnlineSoftmax state = online_empty();
  for (std::int64_t start = 0, b = 0; start < vocab; start += kBlock, ++b) {
    const std::int64_t n = std::min(kBlock, vocab - start);
    const float* x = z + start;
    float* s = g + start;
    float c[kBlock];  // the block's (capped) logits, kept in L1
    if constexpr (kCapped) {
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) {
        s[k] = fast_tanh(over_cap(x[k], softcap));
        c[k] = softcap * s[k];
      }
    } else {
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) c[k] = x[k];
    }
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (std::int64_t k = 0; k < n; ++k) m = c[k] > m ? c[k] : m;
    float sum = 0.0f;
    const float shift = finite_shift(m);
    if constexpr (kCapped) {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t k = 0; k < n; ++k) sum += fast_exp(c[k] - shift);
    } else {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t k = 0; k < n; ++k) {
        s[k] = fast_exp(c[k] - shift);
        sum += s[k];
      }
    }
    block_max[b] = shift;
    state = online_merge(state, {m, sum});
  }
  return state;
}

// Turns the staged row g into the gradient of scale * CE.
template <bool kCapped>
inline void finish_row(std::int64_t vocab, std::int64_t target, OnlineSoftmax stats, float softcap,
                       float scale, const float* block_max, float* g) {
  const float row_max = stats.max, ls = log_sum(stats);
  float target_p = 0.0f, target_t = 0.0f;
  for (std::int64_t start = 0, b = 0; start < vocab; start += kBlock, ++b) {
    const std::int64_t n = std::min(kBlock, vocab - start);
    float* s = g + start;
    if constexpr (kCapped) {
      if (target >= start && target < start + n) {
        target_t = s[target - start];
        target_p = fast_exp((softcap * target_t - row_max) - ls);
      }
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k)
        s[k] = grad_from_probability<true>(fast_exp((softcap * s[k] - row_max) - ls), false, s[k],
                                           scale);
    } else {
      // exp(z - m) * exp((m - row_max) - ls) = exp((z - row_max) - ls), the softmax
      const float factor = fast_exp((block_max[b] - row_max) - ls);
      if (target >= start && target < start + n) target_p = s[target - start] * factor;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k)
        s[k] = grad_from_probability<false>(s[k] * factor, false, 0.0f, scale);
    }
  }
  g[target] = grad_from_probability<kCapped>(target_p, true, target_t, scale);  // one-hot
}

template <bool kCapped>
void rows(const CrossEntropyArgs& a, float scale, std::int64_t begin, std::int64_t end) {
  std::vector<float> block_max(static_cast<std::size_t>((a.vocab + kBlock - 1) / kBlock));
  for (std::int64_t row = begin; row < end; ++row) {
    const float* z = a.logits + row * a.vocab;
    float* g = a.grad + row * a.vocab;
    const std::int64_t target = a.targets[row];
    if (!reads_target(target, a.vocab)) {
      const float value = without_target(target);
      std::fill(g, g + a.vocab, value);
      a.row_loss[row] = value;
      continue;
    }
    // Read before staging: g may be z itself (an in-place call).
    const float target_z = z[target];
    const OnlineSoftmax stats = stage_row<kCapped>(z, a.vocab, a.softcap, g, block_max.data());
    // Before finish_row overwrites the staged tanh: the target's capped logit for the loss.
    const float target_c = kCapped ? a.softcap * g[target] : target_z;
    finish_row<kCapped>(a.vocab, target, stats, a.softcap, scale, block_max.data(), g);
    a.row_loss[row] = cross_entropy_value(target_c, stats);
  }
}

// Rows [begin, end) of the kernel.
inline void run_rows(const CrossEntropyArgs& a, float scale, std::int64_t begin, std::int64_t end) {
  if (a.softcap > 0.0f)
    rows<true>(a, scale, begin, end);
  else
    rows<false>(a, scale, begin, end);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
