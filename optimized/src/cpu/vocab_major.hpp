// Logits stored vocab-major ([vocab, n]: token r's logit v at v * n + r), the layout the fused
// head's CPU GEMM writes fastest (head_gemms.hpp). Tasks take fixed slices of the vocabulary,
// so each walks one contiguous stretch of memory, and the SIMD lanes are tokens, so no loop
// reduces across lanes; a token's per-slice statistics are merged in slice order (results
// do not depend on the thread count). Compiled twice like the row loops (CPKIT_ROWS_NAMESPACE).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/vocab_slices.hpp"
#include "kernels/targets.hpp"
#include "kernels/token_logprobs.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

// f(first, last) for each slice [first, last) of the vocabulary, slices in parallel.
template <class F>
void for_vocab_slices(std::int64_t vocab, F&& f) {
  const std::int64_t slices = (vocab + kVocabSlice - 1) / kVocabSlice;
  at::parallel_for(0, slices, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t s = begin; s < end; ++s)
      f(s * kVocabSlice, std::min(vocab, (s + 1) * kVocabSlice));
  });
}

// Statistics (max, sum and centred sum, kernels/token_logprobs.hpp) of tempered<kCapped>(y)
// over entries [first, last) for each of the n tokens, kept as running vectors: per block its
// max, the running sums moved to a new max (a factor exp(old - new), 1 while the max holds),
// then the block's terms against it. Every loop runs over tokens, so all of it vectorises.
// kCentred = false leaves the centred sum 0 (the cross-entropy needs only max and sum).
template <bool kCapped, bool kCentred>
void slice_statistics(const float* y, std::int64_t n, std::int64_t first, std::int64_t last,
                      float softcap, float inv_temperature, LogprobStats* stats) {
  std::vector<float> running_max(static_cast<std::size_t>(n), -INFINITY);
  std::vector<float> sum(static_cast<std::size_t>(n)), centred(static_cast<std::size_t>(n));
  std::vector<float> block_max(static_cast<std::size_t>(n));
  float* m = running_max.data();
  float* s = sum.data();
  float* c = centred.data();
  float* b = block_max.data();
  for (std::int64_t v0 = first; v0 < last; v0 += kVocabBlock) {
    const std::int64_t v1 = std::min(last, v0 + kVocabBlock);
    std::copy(m, m + n, b);
    for (std::int64_t v = v0; v < v1; ++v) {
      const float* x = y + v * n;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) {
        const float z = tempered<kCapped>(x[k], softcap, inv_temperature);
        b[k] = z > b[k] ? z : b[k];
      }
    }
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) {
      // Finite shifts: sums of a token with no unmasked entry yet are 0 and stay 0.
      const float d = finite_shift(m[k]) - finite_shift(b[k]);  // <= 0
      const float f = fast_exp(d);
      if constexpr (kCentred) c[k] = f * (c[k] + d * s[k]);
      s[k] *= f;
      m[k] = b[k];
    }
    for (std::int64_t v = v0; v < v1; ++v) {
      const float* x = y + v * n;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) {
        const float d = tempered<kCapped>(x[k], softcap, inv_temperature) - finite_shift(m[k]);
        const float e = fast_exp(d);
        s[k] += e;
        if constexpr (kCentred) c[k] += centred_term(e, d);
      }
    }
  }
  for (std::int64_t k = 0; k < n; ++k) stats[k] = {m[k], s[k], c[k]};
}

// Every token's statistics over the whole vocabulary: slices in parallel, merged in order.
template <bool kCapped, bool kCentred>
std::vector<LogprobStats> column_statistics(const float* y, std::int64_t n, std::int64_t vocab,
                                            float softcap, float inv_temperature) {
  std::vector<LogprobStats> parts(
      static_cast<std::size_t>(n * ((vocab + kVocabSlice - 1) / kVocabSlice)));
  for_vocab_slices(vocab, [&](std::int64_t first, std::int64_t last) {
    slice_statistics<kCapped, kCentred>(y, n, first, last, softcap, inv_temperature,
                                        parts.data() + first / kVocabSlice * n);
  });
  std::vector<LogprobStats> stats(static_cast<std::size_t>(n), logprob_empty());
  for (std::size_t p = 0; p < parts.size(); ++p)
    stats[p % n] = logprob_merge(stats[p % n], parts[p]);
  return stats;
}

// Each token's raw target logit, read before a gradient pass overwrites it (g may be y).
inline std::vector<float> target_logits(const float* y, const std::int64_t* targets, std::int64_t n,
                                        std::int64_t vocab) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r)
    if (reads_target(targets[r], vocab)) out[r] = y[targets[r] * n + r];
  return out;
}

// The gradient pass: g(r, v) = element(y(r, v), r) for every token and entry, slices in
// parallel; then each token's target entry target_grad(y_target[r], r), or for a token
// without one its whole column, without_target.
template <class Element, class TargetGrad>
void gradient_columns(const float* y, float* g, const std::int64_t* targets, std::int64_t n,
                      std::int64_t vocab, const std::vector<float>& y_target, Element element,
                      TargetGrad target_grad) {
  for_vocab_slices(vocab, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t v = first; v < last; ++v) {
      const float* x = y + v * n;
      float* out = g + v * n;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) out[k] = element(x[k], k);
    }
  });
  for (std::int64_t r = 0; r < n; ++r) {
    if (reads_target(targets[r], vocab)) {
      g[targets[r] * n + r] = target_grad(y_target[r], r);
    } else {
      for (std::int64_t v = 0; v < vocab; ++v) g[v * n + r] = without_target(targets[r]);
    }
  }
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
