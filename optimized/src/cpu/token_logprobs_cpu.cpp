// CPU kernels of token_logprobs: rows in parallel (each written by one thread, so results do
// not depend on the thread count), the AVX2 + FMA build where the CPU has it.
#include <ATen/Parallel.h>

#define CPKIT_ROWS_NAMESPACE baseline
#include "cpu/token_logprobs_rows.hpp"

namespace cpkit::kernels {

#if defined(__x86_64__)
void token_logprobs_forward_avx2(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end);
void token_logprobs_backward_avx2(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end);
#endif

namespace {

bool has_avx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
#else
  return false;
#endif
}

template <class Rows>
void parallel_rows(const TokenLogprobsArgs& a, Rows&& rows) {
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, a.vocab));
  at::parallel_for(0, a.rows, grain, rows);
}

}  // namespace

void token_logprobs_forward_cpu(const TokenLogprobsArgs& a) {
  parallel_rows(a, [&](std::int64_t begin, std::int64_t end) {
#if defined(__x86_64__)
    if (has_avx2()) return token_logprobs_forward_avx2(a, begin, end);
#endif
    baseline::run_forward(a, begin, end);
  });
}

void token_logprobs_backward_cpu(const TokenLogprobsArgs& a) {
  parallel_rows(a, [&](std::int64_t begin, std::int64_t end) {
#if defined(__x86_64__)
    if (has_avx2()) return token_logprobs_backward_avx2(a, begin, end);
#endif
    baseline::run_backward(a, begin, end);
  });
}

}  // namespace cpkit::kernels
