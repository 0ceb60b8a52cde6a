// The CPU cross-entropy kernel on vocab-major logits (cpu/vocab_major.hpp): one read for the
// statistics, one read and write for the gradient (the formula of the CUDA kernel,
// kernels/cross_entropy.hpp), each over vocabulary slices in parallel.
#pragma once

#include <vector>

#include "cpu/vocab_major.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "kernels/targets.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

template <bool kCapped>
void columns(const CrossEntropyArgs& a, float scale) {
  const std::int64_t n = a.rows;
  const std::vector<LogprobStats> stats =
      column_statistics<kCapped, false>(a.logits, n, a.vocab, a.softcap, 1.0f);
  std::vector<float> row_max(static_cast<std::size_t>(n)), ls(static_cast<std::size_t>(n));
  std::vector<float> target_y(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t target = a.targets[r];
    const OnlineSoftmax s{stats[r].max, stats[r].sum};
    row_max[r] = s.max;
    ls[r] = log_sum(s);
    if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab)) {
      a.row_loss[r] = target == kIgnoreLabel ? 0.0f : NAN;
    } else {
      target_y[r] = a.logits[target * n + r];  // read before the gradient overwrites it
      a.row_loss[r] = cross_entropy_value(capped<kCapped>(target_y[r], a.softcap), s);
    }
  }
  const float* m = row_max.data();
  const float* l = ls.data();
  for_vocab_slices(a.vocab, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t v = first; v < last; ++v) {
      const float* y = a.logits + v * n;
      float* g = a.grad + v * n;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k)
        g[k] = cross_entropy_grad<kCapped>(y[k], false, m[k], l[k], a.softcap, scale);
    }
  });
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t target = a.targets[r];
    if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab))
      fill_column(a.grad, n, a.vocab, r, target == kIgnoreLabel ? 0.0f : NAN);
    else
      a.grad[target * n + r] =
          cross_entropy_grad<kCapped>(target_y[r], true, m[r], l[r], a.softcap, scale);
  }
}

inline void run_columns(const CrossEntropyArgs& a, float scale) {
  if (a.softcap > 0.0f)
    columns<true>(a, scale);
  else
    columns<false>(a, scale);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
