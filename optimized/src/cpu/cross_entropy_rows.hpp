// The row loops of the CPU cross-entropy kernel, compiled twice: for the baseline x86-64
// and with AVX2 + FMA (cross_entropy_cpu_avx2.cpp); cross_entropy_cpu picks one at run time.
// Each row is read twice: an online softmax over L1-sized blocks (block max and block sum
// of exponentials, merged with the shared online_merge), then the gradient pass. The loops
// are branch-free (the soft cap is a template switch) and `omp simd` lets the compiler
// vectorise their reductions without reassociating anything else.
#pragma once

#include <algorithm>

#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

// Blocks of the row small enough to stay in L1 between their max and their sum sweeps:
// the statistics still read the row from memory once (an online softmax over blocks).
constexpr std::int64_t kBlock = 512;

template <bool kCapped>
inline OnlineSoftmax row_statistics(const float* z, std::int64_t vocab, float softcap) {
  OnlineSoftmax state = online_empty();
  for (std::int64_t start = 0; start < vocab; start += kBlock) {
    const std::int64_t n = std::min(kBlock, vocab - start);
    const float* x = z + start;
    float c[kBlock];  // the capped block, computed once, kept in L1
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) c[k] = capped<kCapped>(x[k], softcap);
    float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
    for (std::int64_t k = 0; k < n; ++k) block_max = c[k] > block_max ? c[k] : block_max;
    float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
    for (std::int64_t k = 0; k < n; ++k) block_sum += fast_exp(c[k] - block_max);
    state = online_merge(state, {block_max, block_sum});
  }
  return state;
}

template <bool kCapped>
inline void row_gradient(const float* z, std::int64_t vocab, std::int64_t target,
                         OnlineSoftmax stats, float softcap, float scale, float* g) {
  const float row_max = stats.max, ls = log_sum(stats);
#pragma omp simd
  for (std::int64_t i = 0; i < vocab; ++i)
    g[i] = cross_entropy_grad<kCapped>(z[i], false, row_max, ls, softcap, scale);
  g[target] = cross_entropy_grad<kCapped>(z[target], true, row_max, ls, softcap, scale);  // one-hot
}

template <bool kCapped>
void rows(const CrossEntropyArgs& a, float scale, std::int64_t begin, std::int64_t end) {
  for (std::int64_t row = begin; row < end; ++row) {
    const float* z = a.logits + row * a.vocab;
    float* g = a.grad + row * a.vocab;
    const std::int64_t target = a.targets[row];
    if (target == kNoTarget) {
      std::fill(g, g + a.vocab, 0.0f);
      a.row_loss[row] = 0.0f;
      continue;
    }
    const OnlineSoftmax stats = row_statistics<kCapped>(z, a.vocab, a.softcap);
    row_gradient<kCapped>(z, a.vocab, target, stats, a.softcap, scale, g);
    a.row_loss[row] = cross_entropy_value(capped<kCapped>(z[target], a.softcap), stats);
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
