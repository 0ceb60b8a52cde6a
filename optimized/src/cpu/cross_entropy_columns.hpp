// The CPU cross-entropy kernel on vocab-major logits (cpu/vocab_major.hpp): one read for the
// statistics, one read and write for the gradient (the formula of the CUDA kernel,
// kernels/cross_entropy.hpp), each over vocabulary slices in parallel.
#pragma once

#include <vector>

#include "cpu/vocab_major.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

template <bool kCapped>
void columns(const CrossEntropyArgs& a, float scale) {
  const std::int64_t n = a.rows;
  const std::vector<LogprobStats> stats =
      column_statistics<kCapped, false>(a.logits, n, a.vocab, a.softcap, 1.0f);
  const std::vector<float> y_target = target_logits(a.logits, a.targets, n, a.vocab);
  std::vector<float> row_max(static_cast<std::size_t>(n)), ls(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    const OnlineSoftmax s{stats[r].max, stats[r].sum};
    row_max[r] = s.max;
    ls[r] = log_sum(s);
    a.row_loss[r] = reads_target(a.targets[r], a.vocab)
                        ? cross_entropy_value(capped<kCapped>(y_target[r], a.softcap), s)
                        : without_target(a.targets[r]);
  }
  const float* m = row_max.data();
  const float* l = ls.data();
  const float softcap = a.softcap;
  gradient_columns(
      a.logits, a.grad, a.targets, n, a.vocab, y_target,
      [=](float y, std::int64_t r) {
        return cross_entropy_grad<kCapped>(y, false, m[r], l[r], softcap, scale);
      },
      [=](float y, std::int64_t r) {
        return cross_entropy_grad<kCapped>(y, true, m[r], l[r], softcap, scale);
      });
}

inline void run_columns(const CrossEntropyArgs& a, float scale) {
  if (a.softcap > 0.0f)
    columns<true>(a, scale);
  else
    columns<false>(a, scale);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
